"""The host's cost of one eager operator on a GPU, read from measured layer timings.

A layer timed alone (`predictor.measure.layers`) waits for the host to issue its operators: where the kernel model
prices its kernels at a small share of its measured time, the rest is the host's Python, dispatcher, autograd and
launch work. Per operator (`HOST_OPS`) that is the `AnalyticalConfig.host_op_s` of the machine the layers ran on,
which a kernel profile measures (`scaledl profile --kernels`) and a dataset without one still shows: on the H200
dataset's machine about 40 µs an operator, four times first principles' 10 µs (docs/learned-predictor.md).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from predictor.models.analytical import AnalyticalPredictor, kernel_model_config
from predictor.models.layerwise import analytical_layer_time
from predictor.models.records import LayerObs
from predictor.models.roofline import HOST_OPS, AnalyticalConfig
from predictor.spec.resolver import resolve

# A layer is host-dominated where its priced kernels take under this share of its measured forward time.
HOST_DOMINATED = 0.25


def layer_host_op_s(layers: Sequence[LayerObs], config: AnalyticalConfig) -> float | None:
    """Median seconds per host operator over the host-dominated forward timings of GPU layers: (measured - the
    kernel model's time under `config`) / the node's `HOST_OPS`. None without such timings (a measured device's
    host and kernels add, and its profile measures both)."""
    per_op: list[float] = []
    bases: dict[tuple[int, Any], np.ndarray] = {}
    for o in layers:
        resolved = resolve(o.spec)
        if resolved.measured or o.fwd_s <= 0:
            continue
        key = (id(o.graph), o.key)
        if key not in bases:
            bases[key] = analytical_layer_time(resolved, o.graph, o.key, config)
        kernels = float(bases[key][o.index, 0])
        if kernels < HOST_DOMINATED * o.fwd_s:
            per_op.append((o.fwd_s - kernels) / HOST_OPS.get(o.graph.nodes[o.index].kind, 1))
    return float(np.median(per_op)) if per_op else None


class LayerHostAnalytical(AnalyticalPredictor):
    """The analytical (kernel) model with the host's cost per operator read from the training data's layer timings
    (`layer_host_op_s`), not fitted to iteration times: what a kernel profile's measured host cost gives it."""

    name = "analytical-layerhost"

    def fit(self, data: Any) -> "LayerHostAnalytical":
        base = kernel_model_config(resolve(data.samples[0].spec)) if data.samples else AnalyticalConfig()
        host = layer_host_op_s(data.layers, base)
        self.given = replace(base, host_op_s=host) if host is not None else base
        self._pieces = {}
        return self
