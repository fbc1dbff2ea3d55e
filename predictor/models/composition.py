"""ScaleDL's composition: what the correction factors scale, and the prediction they make of it.

`compose` turns one workload's plans into the analytical prediction of each, its compute (and the bubble,
which is idle compute) rescaled by the layer-wise regressors' view of the layers, grouped into the time
terms T_k and the global features Z. `corrected` applies the factors f_k and the memory residual:
T_iter = Σ_k f_k · T_k. Both take every plan of one workload at once, so they can be vectorised over plans
without changing their callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from predictor.device_resolver import spec_device
from predictor.layer_graph import LayerGraph
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.features import TERM_OF_PART, TERMS, global_matrix, overhead_seconds, terms_from_breakdown
from predictor.models.layerwise import LayerwiseModel
from predictor.models.records import LayerKey, layer_key
from predictor.plan import Plan
from predictor.prediction import Prediction
from predictor.workload import WorkloadSpec

COMM_PARTS = ("dp_comm", "tp_comm", "cp_comm", "pp_p2p")
_OVERHEAD = TERMS.index("overhead")


@dataclass
class Composed:
    """One workload's plans before correction: analytical predictions, terms and features."""

    ana: list[Prediction]
    breakdowns: list[dict[str, float]]
    terms: np.ndarray  # (P, len(TERMS)) seconds
    keys: list[LayerKey]  # unique layer keys
    key_of: np.ndarray  # (P,) index into keys
    layer_s: list[np.ndarray]  # per key: predicted fwd+bwd seconds per node (all occurrences)
    z: np.ndarray  # (P, GLOBAL_DIM)


def compose(analytical: AnalyticalPredictor, layerwise: LayerwiseModel, spec: WorkloadSpec, graph: LayerGraph,
            plans: Sequence[Plan], *, host_once: bool, use_comm: bool) -> Composed:
    """The plans' terms: the layer-wise regressors are asked once per layer key (plans sharing micro-batch,
    tp, sp, precision and device share their layers' times). `use_comm=False`: the communication parts are
    dropped (an ablation)."""
    device = spec_device(spec)
    ana = analytical.predict(spec, graph, plans)
    counts = np.asarray([n.count for n in graph.nodes], dtype=float)
    keys: list[LayerKey] = []
    key_index: dict[LayerKey, int] = {}
    ratios: list[float] = []
    layer_s: list[np.ndarray] = []
    key_of = np.empty(len(plans), dtype=int)
    breakdowns = []
    terms = np.empty((len(plans), len(TERMS)))
    for i, (plan, pred) in enumerate(zip(plans, ana)):
        key = layer_key(spec, plan)
        if key not in key_index:
            learned, base = layerwise.predict(spec, graph, key)
            key_index[key] = len(keys)
            keys.append(key)
            ratios.append(float(counts @ learned.sum(1)) / max(float(counts @ base.sum(1)), 1e-12))
            layer_s.append(counts * learned.sum(1))
        k = key_of[i] = key_index[key]
        bd = dict(pred.breakdown)
        scale = compute_scale(pred, ratios[k], device.measured, host_once)
        bd["compute"] *= scale
        bd["pp_bubble"] *= scale  # the bubble is idle compute: it scales with the layers' time
        if not use_comm:
            for part in COMM_PARTS:
                bd[part] = 0.0
        breakdowns.append(bd)
        terms[i] = terms_from_breakdown(bd)
        terms[i, _OVERHEAD] = overhead_seconds(graph, plan, spec)
    return Composed(ana, breakdowns, terms, keys, key_of, layer_s, global_matrix(spec, plans, device, terms))


def compute_scale(ana: Prediction, ratio: float, synchronous: bool, host_once: bool = True) -> float:
    """What the layer-wise regressors' view of the layers (`ratio`: learned / analytical layer time) does to
    the analytical compute. On a synchronous device (a measured CPU) the analytical compute is kernels +
    host, and layers timed in isolation already carry their calls' host work: with `host_once` (the
    default) the ratio rescales the kernels and stands for the host too; without it (checkpoints saved
    before host_once existed) the ratio scales the whole, counting the host again. On a GPU the analytical
    compute of a host-bound stage is the host's pace, max(kernels, host): the ratio rescales the kernels
    and the host keeps its floor. (Layers timed on a GPU already include the launch gaps of a host-bound
    layer; scaling the stretched compute by them counted the host twice.)"""
    kernels = ana.extra.get("kernel_compute_s")
    compute = ana.breakdown["compute"]
    if kernels is None or compute <= 0:
        return ratio
    if synchronous:
        return kernels * ratio / compute if host_once else ratio
    host = compute if compute > kernels else 0.0
    return max(kernels * ratio, host) / compute


def corrected(comp: Composed, factors: np.ndarray, mem_ratio: np.ndarray) -> list[Prediction]:
    """Every plan's prediction: `factors` (P, len(TERMS)) scale its terms, `mem_ratio` (P,) its peak memory."""
    return [_corrected(a, bd, t, f, r) for a, bd, t, f, r in zip(comp.ana, comp.breakdowns, comp.terms, factors, mem_ratio)]


def _corrected(ana: Prediction, breakdown: dict[str, float], terms: np.ndarray, factors: np.ndarray,
               mem_ratio: float) -> Prediction:
    """The analytical prediction with each time part scaled by its term's factor and memory by its
    residual; the dispatch overhead is reported inside compute (it is time spent computing)."""
    bd = {part: float(sec * factors[TERMS.index(TERM_OF_PART[part])]) for part, sec in breakdown.items()}
    bd["compute"] += float(terms[_OVERHEAD] * factors[_OVERHEAD])
    # Physics bounds what the factors may learn: no plan computes its model FLOPs faster than the
    # dense peak. Factors fitted where compute and communication are confounded (vTrain's single
    # node, full recomputation only) would otherwise promise MFU > 100 % on plans unlike the data.
    at_peak = ana.mfu * ana.iter_time_s
    bounded = bd["compute"] < at_peak
    if bounded:
        bd["compute"] = at_peak
    total = sum(bd.values())
    speedup = ana.iter_time_s / total if total > 0 else 1.0
    per_stage, parts = corrected_memory(ana, mem_ratio)
    return Prediction(
        iter_time_s=total, breakdown=bd, peak_memory_gib=ana.peak_memory_gib * mem_ratio,
        memory_per_stage_gib=per_stage, memory_breakdown=parts,
        tflops_per_gpu=ana.tflops_per_gpu * speedup, mfu=ana.mfu * speedup,
        extra={**ana.extra, "predictor": "scaledl", "factors": dict(zip(TERMS, map(float, factors))),
               "compute_at_peak_bound": bounded},
    )


def corrected_memory(ana: Prediction, mem_ratio: float) -> tuple[list[float], dict[str, float]]:
    """Per-stage peaks and the peak rank's parts after the memory residual. What it adds is memory no
    part models (the runtime's own, the same on every rank): it goes to "runtime", on every stage.
    What it takes away scales every part down alike."""
    extra = ana.peak_memory_gib * (mem_ratio - 1.0)
    if extra >= 0:
        return ([m + extra for m in ana.memory_per_stage_gib],
                {**ana.memory_breakdown, "runtime": ana.memory_breakdown.get("runtime", 0.0) + extra})
    return [m * mem_ratio for m in ana.memory_per_stage_gib], {k: v * mem_ratio for k, v in ana.memory_breakdown.items()}
