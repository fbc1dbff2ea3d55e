"""Layer-wise model of ScaleDL (paper Eqs. 6-7): one regressor per layer kind.

Each regressor predicts log(measured / analytical) of a layer's forward and backward time
from the Eq. 7 features, i.e. it learns the layer's efficiency against the roofline rather
than the raw time. That keeps a tree model (which cannot extrapolate) sensible on layers
larger than any it saw: outside the training range it predicts a bounded efficiency and
the analytical time carries the scale. A kind with no timings on a device falls back to
the analytical layer time (ratio 1), which is how the A100 model works without layer data.
With `op_costs`, the base of a layer that is not a matrix product is its operators' cost on the
device, fitted on the same timings first (`predictor.models.op_costs`), instead of its roofline.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from sklearn.base import clone
from sklearn.ensemble import RandomForestRegressor

from predictor.graph.layer_graph import LayerGraph
from predictor.models.features import layer_matrix
from predictor.models.op_costs import OpCosts, OpRow, is_gemm
from predictor.models.records import LayerKey, LayerObs
from predictor.models.roofline import AnalyticalConfig, layer_times
from predictor.spec.resolver import Resolved
from predictor.spec.workload import WorkloadSpec

# Analytical (fwd, bwd) seconds of every node of a graph, per micro-batch and occurrence: shape (n, 2).
BaseTime = Callable[[Resolved, LayerGraph, LayerKey], np.ndarray]


def analytical_layer_time(resolved: Resolved, graph: LayerGraph, key: LayerKey,
                          config: AnalyticalConfig | None = None) -> np.ndarray:
    """The analytical model's per-layer time under `config` (first principles without one): the base the regressors
    correct, and the fallback."""
    fwd, bwd = layer_times(resolved, graph, key.share, key.mbs, config)
    return np.stack([fwd, bwd], axis=1)


def default_regressor(seed: int = 0) -> RandomForestRegressor:
    """The paper's choice: a random forest (small, so the checkpoint stays small)."""
    return RandomForestRegressor(n_estimators=60, min_samples_leaf=2, max_features=0.6, random_state=seed, n_jobs=1)


class LayerwiseModel:
    """φ_kind per (device, layer kind) on top of an analytical base time."""

    def __init__(self, base_time: BaseTime, resolver: Callable[[WorkloadSpec], Resolved],
                 regressor: Any | None = None, seed: int = 0, op_costs: bool = False) -> None:
        self.base_time = base_time
        self.resolver = resolver
        self.regressor = regressor if regressor is not None else default_regressor(seed)
        self.use_op_costs = op_costs
        self.models: dict[tuple[str, str], Any] = {}  # (device, kind) -> fitted regressor
        self.attr_keys: dict[str, list[str]] = {}  # kind -> structural attrs used as features
        self.op_costs_by_device: dict[str, OpCosts] = {}  # fitted with `op_costs`

    def fit(self, obs: list[LayerObs], roofline_twin: "LayerwiseModel | None" = None) -> "LayerwiseModel":
        """`roofline_twin`: a model fitted on the same `obs` with the same regressor and roofline bases. A kind
        none of whose timed layers operator costs price (the matrix products) has the same rows and targets
        there, so it takes the twin's fitted regressor instead of fitting it again."""
        self.op_costs_by_device = self._fit_op_costs(obs) if self.use_op_costs else {}
        groups: dict[tuple[int, LayerKey], list[LayerObs]] = {}
        for o in obs:
            if o.fwd_s > 0:
                groups.setdefault((id(o.graph), o.key), []).append(o)
        xs: dict[tuple[str, str], list[np.ndarray]] = {}
        ys: dict[tuple[str, str], list[np.ndarray]] = {}
        priced: set[tuple[str, str]] = set()  # kinds whose base differs from the roofline somewhere
        for rows in groups.values():
            resolved, graph, key = self.resolver(rows[0].spec), rows[0].graph, rows[0].key
            analytical, base = self._bases(resolved, graph, key)
            for kind in sorted({graph.nodes[o.index].kind for o in rows}):
                mine = [o for o in rows if graph.nodes[o.index].kind == kind]
                keys = self.attr_keys.setdefault(kind, sorted({a for o in obs for a in o.graph.nodes[o.index].attrs
                                                               if o.graph.nodes[o.index].kind == kind}))
                idx = [o.index for o in mine]
                meas = np.asarray([[o.fwd_s, max(o.bwd_s, 1e-9)] for o in mine])
                xs.setdefault((key.device, kind), []).append(layer_matrix(graph, key, resolved.device, keys, idx))
                ys.setdefault((key.device, kind), []).append(np.log(meas / base[idx]))
                if not np.array_equal(base[idx], analytical[idx]):
                    priced.add((key.device, kind))
        twin = roofline_twin if roofline_twin is not None and roofline_twin.regressor is self.regressor \
            and not roofline_twin.op_costs_by_device else None
        for dk in sorted(xs):
            if twin is not None and dk not in priced and dk in twin.models:
                self.models[dk] = twin.models[dk]
                continue
            model = clone(self.regressor)
            model.fit(np.concatenate(xs[dk]), np.concatenate(ys[dk]))
            self.models[dk] = model
        return self

    @staticmethod
    def _fit_op_costs(obs: list[LayerObs]) -> dict[str, OpCosts]:
        """Per device, operator costs from its timed non-GEMM layers (those timed whole, at tp 1)."""
        rows: dict[str, list[OpRow]] = {}
        for o in obs:
            if o.key.tp == 1 and not is_gemm(o.graph, o.index, o.key.heads):
                rows.setdefault(o.key.device, []).append(OpRow(o.graph.nodes[o.index], o.key.mbs, o.fwd_s, o.bwd_s))
        fitted = {device: OpCosts.fit(r) for device, r in rows.items()}
        return {device: costs for device, costs in fitted.items() if costs is not None}

    def _bases(self, resolved: Resolved, graph: LayerGraph, key: LayerKey) -> tuple[np.ndarray, np.ndarray]:
        """(analytical, regressed-on) seconds per node: the regressors correct the second, which is the
        first with the device's operator costs pricing the non-GEMM layers, where it has them."""
        analytical = np.maximum(np.asarray(self.base_time(resolved, graph, key), dtype=float), 1e-9)
        costs = self.op_costs_by_device.get(key.device)
        if costs is None:
            return analytical, analytical
        return analytical, np.maximum(costs.apply(graph, key.tp, key.sp, key.heads, key.mbs, analytical), 1e-9)

    def predict(self, spec: WorkloadSpec, graph: LayerGraph, key: LayerKey) -> tuple[np.ndarray, np.ndarray]:
        """(predicted, analytical) fwd/bwd seconds per node, per micro-batch and occurrence: arrays (n, 2)."""
        resolved = self.resolver(spec)
        analytical, base = self._bases(resolved, graph, key)
        pred = base.copy()
        by_kind: dict[str, list[int]] = {}
        for i, n in enumerate(graph.nodes):
            if (key.device, n.kind) in self.models:
                by_kind.setdefault(n.kind, []).append(i)
        for kind, idx in by_kind.items():
            x = layer_matrix(graph, key, resolved.device, self.attr_keys[kind], idx)
            ratio = np.exp(np.asarray(self.models[(key.device, kind)].predict(x)).reshape(len(idx), 2))
            pred[idx] = base[idx] * ratio
        return pred, analytical
