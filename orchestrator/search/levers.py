"""The memory levers a search pulls where a plan would not fit otherwise.

A space enumerates degrees, ZeRO stages and recomputation modes; production recipes fit many of their plans through
finer levers (Megatron-Bridge's: BF16 moments, recomputing a few modules, full recomputation of some layers,
offloading layers' activations or part of the optimizer). Trying every lever on every plan would multiply a space
by tens; a lever only matters where a plan is faster than what fits. So after the search, the plans that overflow
the memory limit and would beat the best plan that fits at their cluster size (all of them where nothing fits), the
fastest first, are tried again with each lever and a few pairs, every variant checked by the structural and the
framework's rules and predicted by the search's predictor. The variants join the result: the report ranks them with
the rest, and says which levers a winner pulls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from predictor.costs.prediction import Prediction
from predictor.costs.prediction_table import PredictionTable
from predictor.frameworks.launch import run_errors
from predictor.plan import DISPATCHERS, Plan, PlanError, canonical_recompute, recompute_modules
from predictor.spec.resolver import resolve
from predictor.spec.workload import WorkloadSpec

if TYPE_CHECKING:  # pragma: no cover (the search module imports Ray Tune: `scaledl predict` asks for fixes without it)
    from orchestrator.search.types import SearchResult

# Overflowing plans whose levers are tried (the fastest first): a few seconds of predictions at most.
LEVER_PLANS = 512
# Levers save activations and optimizer state, never the weights: a plan over this many times the limit is not tried.
REACH = 2.0


@dataclass
class Repredictor:
    """Predicts plans the search never saw, in this process: `predictor` (a registry name or checkpoint path,
    loaded on first use, or a Predictor), the workload's layer graph, and `resize(spec, nodes)`, the spec on
    another cluster size (orchestrator.planning.sized_spec)."""

    predictor: Any
    graph: Any
    resize: Callable[[WorkloadSpec, int], WorkloadSpec]
    _loaded: Any = field(default=None, repr=False)

    def predict(self, spec: WorkloadSpec, plans: Sequence[Plan]) -> list[Prediction]:
        return self.table(spec, plans).rows()

    def table(self, spec: WorkloadSpec, plans: Sequence[Plan]) -> PredictionTable:
        if self._loaded is None:
            if isinstance(self.predictor, str):
                from predictor.models.registry import load_predictor

                self._loaded = load_predictor(self.predictor, spec.cluster.device, resolve(spec).device.model)[0]
            else:
                self._loaded = self.predictor
        return self._loaded.predict_table(spec, self.graph, list(plans))


def runs(plan: Plan, spec: WorkloadSpec) -> bool:
    """Whether `plan` passes the structural rules and its framework's (a lever the framework lacks fails here)."""
    try:
        return not run_errors(plan, resolve(spec))
    except PlanError:
        return False


def _recompute_modules(spec: WorkloadSpec) -> tuple[str, ...]:
    """Megatron-Core modules worth recomputing for this model, cheapest first."""
    m = spec.model
    names = ["layernorm", "core_attn"]
    if m.is_moe:
        names += ["moe_act", "shared_experts"] if m.shared_experts else ["moe_act"]
    else:
        names.append("mlp")
    if m.kv_lora_rank is not None:
        names.append("mla_up_proj")
    return tuple(names)


def memory_levers(plan: Plan, spec: WorkloadSpec) -> list[tuple[str, Plan]]:
    """(name, changed plan) of each memory lever `plan` does not pull yet, and of BF16 optimizer states (moments and
    gradients) beside each: recompute one more module, full recomputation of half the layers of a chunk, offload a
    quarter or half of a pipeline rank's layers, offload half or all of the optimizer. Invalid plans are left out by
    the caller (`runs`)."""
    blocks = max(1, (spec.model.num_blocks or 1) // (plan.pp * plan.v))
    out: list[tuple[str, Plan]] = []
    if plan.recompute != "full":
        held = recompute_modules(plan.recompute)
        for module in _recompute_modules(spec):
            if module not in held:
                modules = canonical_recompute("+".join(held | {module}))
                out.append((f"recompute={modules}", {"recompute": modules}))
        if blocks > 1:
            out.append((f"recompute=full,recompute_layers={blocks // 2}",
                        {"recompute": "full", "recompute_layers": blocks // 2}))
    if plan.offload == "none":
        for layers in sorted({max(1, blocks // 4), max(1, blocks // 2)}):
            out.append((f"offload=layers:{layers}", {"offload": f"layers:{layers}"}))
    for fraction in (0.5, 1.0):
        if plan.optimizer_offload < fraction:
            out.append((f"optimizer_offload={fraction:g}", {"optimizer_offload": fraction}))
    changes = list(out)
    states = {k: "bf16" for k in ("moments", "grads") if getattr(plan, k) == "fp32"}
    if states:
        name = ", ".join(f"{k}=bf16" for k in states)
        out += [(f"{k}=bf16", {k: "bf16"}) for k in states] + ([(name, states)] if len(states) > 1 else [])
        out += [(f"{name}, {lever}", {**change, **states}) for lever, change in changes]
    plans = []
    for name, change in out:
        try:
            plans.append((name, plan.with_(**change)))
        except PlanError:
            continue
    return plans


def fixes(plan: Plan, spec: WorkloadSpec) -> list[tuple[str, Plan]]:
    """(name, changed plan) of every single change that saves memory without changing the plan's degrees, that its
    framework runs: the memory levers, a higher ZeRO stage, full recomputation, and NCCL's all-to-all in place of a
    dispatcher with buffers of its own (DeepEP's queues, Hybrid-EP's and all-gather's gathered tokens)."""
    out = memory_levers(plan, spec) + [(f"zero={z}", plan.with_(zero=z)) for z in range(plan.zero + 1, 4)]
    if plan.recompute != "full":
        out.append(("recompute=full", plan.with_(recompute="full", recompute_layers=0)))
    if plan.ep > 1 and plan.dispatcher != DISPATCHERS[0]:
        out.append((f"dispatcher={DISPATCHERS[0]}", plan.with_(dispatcher=DISPATCHERS[0])))
    return [(name, changed) for name, changed in out if runs(changed, spec)]


def _worth_trying(result: "SearchResult", limit: int) -> list[int]:
    """Rows of the overflowing plans within `REACH` of the limit and faster than the best plan that fits at their
    cluster size, the fastest first."""
    t = result.table.iter_time_s
    over = result.infeasible & (result.table.peak_memory_gib <= REACH * result.limit_gib)
    rows = []
    for gpus in np.unique(result.gpus):
        size = result.gpus == gpus
        fitting = size & ~over
        best = t[fitting].min() if fitting.any() else np.inf
        rows.append(np.flatnonzero(size & over & (t < best)))
    candidates = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    return candidates[np.argsort(t[candidates], kind="stable")][:limit].tolist()


def explore_levers(result: "SearchResult", sizes: Sequence[WorkloadSpec], repredictor: Repredictor,
                   limit: int = LEVER_PLANS) -> "SearchResult":
    """`result` with the lever variants of its overflowing plans that would beat what fits (see the module doc)
    added after its own rows; `stats['levers']` says how many were tried and fit."""
    specs = {s.cluster.gpus: s for s in sizes}
    by_size: dict[int, list[Plan]] = {}
    rows = _worth_trying(result, limit)
    seen = set(result.plans) if rows else set()  # every plan an object: only when some variant is to be tried
    for row in rows:
        plan = result.plans[row]
        spec = specs[plan.gpus]
        for _, variant in memory_levers(plan, spec):
            if variant not in seen and runs(variant, spec):
                seen.add(variant)
                by_size.setdefault(plan.gpus, []).append(variant)
    plans = [p for group in by_size.values() for p in group]
    stats = {**result.stats, "levers": {"overflowing_tried": len(rows), "variants": len(plans)}}
    if not plans:
        return type(result)(result.plans, result.table, result.limit_gib, result.capacity_gib, result.failed, stats)
    tables = [repredictor.table(specs[gpus], group) for gpus, group in by_size.items()]
    table = PredictionTable.concatenate([result.table, *tables])
    joined = type(result)(result.plans + plans, table, result.limit_gib, result.capacity_gib, result.failed, stats)
    stats["levers"]["variants_fitting"] = int((~joined.infeasible[len(result.plans):]).sum())
    return joined
