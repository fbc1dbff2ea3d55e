"""When nothing fits: the plans closest to fitting (least memory over the limit), and for each the changes that
would make it fit, each re-predicted by the search's predictor so the time it costs is a prediction, not a guess.

A lever is one change to the plan: stronger recomputation, a higher ZeRO stage, twice the pipeline or tensor
degree (half the data-parallel one), more nodes (the data-parallel degree grows with them, sharding the
model states: ZeRO 1 at least), or a memory lever of `orchestrator.search.levers.memory_levers` (recomputed
modules, offloaded activations or optimizer, BF16 moments) where the framework has it.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from orchestrator.report.model import ClosePlan, Lever
from orchestrator.search.levers import Repredictor, memory_levers, runs
from orchestrator.search.types import SearchResult
from predictor.plan import Plan
from predictor.spec.workload import WorkloadSpec

CLOSEST = 5  # plans listed when nothing fits
_STRONGER = {"none": ("selective", "full"), "selective": ("full",), "full": ()}
_MORE_NODES = (2, 4)


def candidates(plan: Plan, spec: WorkloadSpec, resize: Callable[[WorkloadSpec, int], WorkloadSpec]
               ) -> list[tuple[str, Plan, WorkloadSpec]]:
    """(lever name, changed plan, the spec it runs) of every single change this plan and framework allow."""
    out: list[tuple[str, Plan, WorkloadSpec]] = []
    for mode in _STRONGER.get(plan.recompute, ("full",)):  # module lists: whole layers next
        out.append((f"recompute={mode}", plan.with_(recompute=mode), spec))
    for zero in range(plan.zero + 1, 4):
        out.append((f"zero={zero}", plan.with_(zero=zero), spec))
    if plan.dp % 2 == 0:
        out.append((f"pp={plan.pp * 2}, dp={plan.dp // 2}", plan.with_(pp=plan.pp * 2, dp=plan.dp // 2), spec))
        out.append((f"tp={plan.tp * 2}, dp={plan.dp // 2}", plan.with_(tp=plan.tp * 2, dp=plan.dp // 2), spec))
    for k in _MORE_NODES:
        try:
            bigger = resize(spec, spec.cluster.nodes * k)
        except ValueError:  # the cluster does not tile at that size
            continue
        # More GPUs save memory only where the data-parallel group shards the model states (ZeRO >= 1).
        zero = max(plan.zero, 1)
        out.append((f"{k}x nodes ({bigger.cluster.nodes}), dp={plan.dp * k}" + (", zero=1" if zero != plan.zero else ""),
                    plan.with_(dp=plan.dp * k, zero=zero), bigger))
    out += [(name, changed, spec) for name, changed in memory_levers(plan, spec)]
    unique = {(changed, on.cluster.gpus): (name, changed, on) for name, changed, on in reversed(out)}
    return [lever for lever in reversed(unique.values()) if runs(lever[1], lever[2])]


def least_overflow(result: SearchResult, count: int = CLOSEST) -> list[int]:
    """The rows of the `count` plans that do not fit with the least memory over the limit (then the fastest)."""
    rows = np.flatnonzero(result.infeasible)
    peak = result.table.peak_memory_gib
    return rows[np.lexsort((result.table.iter_time_s[rows], peak[rows]))][:count].tolist()


def closest(result: SearchResult, sizes: Sequence[WorkloadSpec], repredictor: Repredictor,
            count: int = CLOSEST) -> list[ClosePlan]:
    """The `count` plans that overflow the memory limit least, each with its levers re-predicted (those that fit
    first, fastest first; the others after, by peak memory). `sizes`: the spec at each cluster size searched."""
    peak = result.table.peak_memory_gib
    specs = {s.cluster.gpus: s for s in sizes}
    out = []
    for i in least_overflow(result, count):
        plan = result.plans[i]
        tried = candidates(plan, specs[plan.gpus], repredictor.resize)
        levers = []
        by_spec: dict[int, list[tuple[str, Plan, WorkloadSpec]]] = {}
        for c in tried:
            by_spec.setdefault(c[2].cluster.gpus, []).append(c)
        for group in by_spec.values():
            predictions = repredictor.predict(group[0][2], [p for _, p, _ in group])
            for (name, changed, _), pred in zip(group, predictions):
                levers.append(Lever(name, changed, pred.iter_time_s, pred.peak_memory_gib, changed.gpus,
                                    pred.peak_memory_gib <= result.limit_gib))
        levers.sort(key=lambda lv: (not lv.fits, lv.iter_time_s if lv.fits else lv.peak_memory_gib))
        out.append(ClosePlan(plan, float(result.table.iter_time_s[i]), float(peak[i]),
                             float(peak[i] - result.limit_gib), levers))
    return out
