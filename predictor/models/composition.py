"""ScaleDL's composition: what the correction factors scale, and the prediction they make of it.

`compose` turns one workload's plans into the analytical prediction of each, its compute (and the bubble,
which is idle compute) rescaled by the layer-wise regressors' view of the layers, grouped into the time
terms T_k and the global features Z. `corrected` applies the factors f_k and the memory residual:
T_iter = Σ_k f_k · T_k. Both work on every plan of one workload at once, as arrays over plans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from predictor.costs.prediction import MEMORY_PARTS, TIME_PARTS
from predictor.costs.prediction_table import PredictionTable, row_sums
from predictor.graph.layer_graph import LayerGraph
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.features import TERMS, global_matrix, overhead_seconds
from predictor.models.layerwise import LayerwiseModel
from predictor.models.records import LayerKey, layer_key
from predictor.plan import COMM_PARTS, TERM_OF_PART, Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import WorkloadSpec

_OVERHEAD = TERMS.index("overhead")
_COMPUTE, _BUBBLE = TIME_PARTS.index("compute"), TIME_PARTS.index("pp_bubble")


@dataclass
class Composed:
    """One workload's plans before correction: analytical predictions, terms and features (rows: plans)."""

    table: PredictionTable  # the analytical predictions
    breakdown: np.ndarray  # (P, len(TIME_PARTS)) seconds, compute and bubble rescaled by the layer-wise ratio
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
    device = resolve(spec).device
    table = analytical.predict_table(spec, graph, plans)
    counts = np.asarray([n.count for n in graph.nodes], dtype=float)
    keys: list[LayerKey] = []
    key_index: dict[LayerKey, int] = {}
    ratios: list[float] = []
    layer_s: list[np.ndarray] = []
    key_of = np.empty(len(plans), dtype=int)
    for i, plan in enumerate(plans):
        key = layer_key(spec, plan)
        k = key_index.get(key)
        if k is None:
            learned, base = layerwise.predict(spec, graph, key)
            k = key_index[key] = len(keys)
            keys.append(key)
            ratios.append(float(counts @ learned.sum(1)) / max(float(counts @ base.sum(1)), 1e-12))
            layer_s.append(counts * learned.sum(1))
        key_of[i] = k
    breakdown = table.breakdown.copy()
    kernels = table.extra.get("kernel_compute_s")
    scale = compute_scale(breakdown[:, _COMPUTE], None if kernels is None else np.asarray(kernels, dtype=float),
                          np.asarray(ratios)[key_of], device.measured, host_once)
    breakdown[:, _COMPUTE] *= scale
    breakdown[:, _BUBBLE] *= scale  # the bubble is idle compute: it scales with the layers' time
    if not use_comm:
        breakdown[:, [TIME_PARTS.index(part) for part in COMM_PARTS]] = 0.0
    terms = np.zeros((len(plans), len(TERMS)))
    for j, part in enumerate(TIME_PARTS):
        terms[:, TERMS.index(TERM_OF_PART[part])] += breakdown[:, j]
    terms[:, _OVERHEAD] = [overhead_seconds(graph, plan, spec) for plan in plans]
    return Composed(table, breakdown, terms, keys, key_of, layer_s, global_matrix(spec, plans, device, terms))


def compute_scale(compute: np.ndarray, kernels: np.ndarray | None, ratio: np.ndarray, synchronous: bool,
                  host_once: bool = True) -> np.ndarray:
    """What the layer-wise regressors' view of the layers (`ratio`: learned / analytical layer time) does to
    the analytical compute (`kernels`: its kernels' part, per plan). On a synchronous device (a measured CPU)
    the analytical compute is kernels + host, and layers timed in isolation already carry their calls' host
    work: with `host_once` (the default) the ratio rescales the kernels and stands for the host too; without
    it (checkpoints before format 7) the ratio scales the whole, counting the host again. On a
    GPU the analytical compute of a host-bound stage is the host's pace, max(kernels, host): the ratio
    rescales the kernels and the host keeps its floor. (Layers timed on a GPU already include the launch gaps
    of a host-bound layer; scaling the stretched compute by them counted the host twice.)"""
    if kernels is None:
        return ratio
    positive = compute > 0
    safe = np.where(positive, compute, 1.0)
    if synchronous:
        scale = kernels * ratio / safe if host_once else ratio
    else:
        host = np.where(compute > kernels, compute, 0.0)
        scale = np.maximum(kernels * ratio, host) / safe
    return np.where(positive, scale, ratio)


def corrected(comp: Composed, factors: np.ndarray, mem_ratio: np.ndarray) -> PredictionTable:
    """Every plan's prediction: `factors` (P, len(TERMS)) scale its time parts' terms, `mem_ratio` (P,) its
    peak memory; the dispatch overhead is reported inside compute (it is time spent computing)."""
    ana = comp.table
    bd = comp.breakdown * factors[:, [TERMS.index(TERM_OF_PART[part]) for part in TIME_PARTS]]
    bd[:, _COMPUTE] += comp.terms[:, _OVERHEAD] * factors[:, _OVERHEAD]
    # Physics bounds what the factors may learn: no plan computes its model FLOPs faster than the
    # dense peak. Factors fitted where compute and communication are confounded (vTrain's single
    # node, full recomputation only) would otherwise promise MFU > 100 % on plans unlike the data.
    at_peak = ana.mfu * ana.iter_time_s
    bounded = bd[:, _COMPUTE] < at_peak
    bd[:, _COMPUTE] = np.where(bounded, at_peak, bd[:, _COMPUTE])
    total = row_sums(bd)
    speedup = np.where(total > 0, ana.iter_time_s / np.where(total > 0, total, 1.0), 1.0)
    per_stage, parts = corrected_memory(ana.peak_memory_gib, ana.stage_memory_gib, ana.stage_offsets, ana.memory_breakdown,
                                        mem_ratio)
    return PredictionTable(
        iter_time_s=total, breakdown=bd, peak_memory_gib=ana.peak_memory_gib * mem_ratio,
        stage_memory_gib=per_stage, stage_offsets=ana.stage_offsets, memory_breakdown=parts,
        tflops_per_gpu=ana.tflops_per_gpu * speedup, mfu=ana.mfu * speedup, hidden=np.zeros_like(ana.hidden),
        extra={**ana.extra, "factors": factors, "compute_at_peak_bound": bounded},
        extra_names={**ana.extra_names, "factors": TERMS}, shared_extra={**ana.shared_extra, "predictor": "scaledl"},
    )


def corrected_memory(peak: np.ndarray, stage_gib: np.ndarray, stage_offsets: np.ndarray, parts: np.ndarray,
                     mem_ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-stage peaks (end to end, cut at `stage_offsets`) and the peak rank's MEMORY_PARTS (P, parts) after the
    memory residual. What it adds is memory no part models (the runtime's own, the same on every rank): it goes
    to "runtime", on every stage. What it takes away scales every part down alike."""
    extra = peak * (mem_ratio - 1.0)
    adds = extra >= 0
    runtime = np.zeros_like(parts)
    runtime[:, MEMORY_PARTS.index("runtime")] = extra
    stages = np.diff(stage_offsets)
    per_stage = np.where(np.repeat(adds, stages), stage_gib + np.repeat(extra, stages), stage_gib * np.repeat(mem_ratio, stages))
    return per_stage, np.where(adds[:, None], parts + runtime, parts * mem_ratio[:, None])
