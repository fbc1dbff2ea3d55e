"""The report of one search, built once from its columns: Prediction objects only for the plans it lists."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import numpy as np

from orchestrator.report import close_plans
from orchestrator.report.explain import explain
from orchestrator.report.model import (ClosePlan, DeviceInfo, FrontPlan, InfeasiblePlan, Launch, Ranking, RankedPlan,
                                       Report, Size, SpaceInfo, TrainingGoal)
from orchestrator.report.points import points
from orchestrator.report.ranking import costs, front, intervals, measure, rank, within_goal
from orchestrator.report.text import caution, interval_text
from orchestrator.search.levers import Repredictor
from orchestrator.search.types import SearchResult
from predictor.frameworks.launch import launch_settings
from predictor.models.intervals import Interval
from predictor.plan import Plan
from predictor.spec.hardware import GIB
from predictor.spec.resolver import Resolved, resolve
from predictor.spec.workload import WorkloadSpec
from search_spaces import Enumeration, SpaceConfig

LIST_CAP = 100  # plans of each list kept (ranked beyond --top-k for the HTML table, infeasible, failed)


def pareto(result: SearchResult, ranked: np.ndarray, spec: WorkloadSpec, price: float | None,
           goal: TrainingGoal) -> list[FrontPlan]:
    """The ranked plans no other beats on both days (iteration time) and cost (GPU-hours per iteration), fastest
    first."""
    t, gpu_s = result.table.iter_time_s[ranked], measure(result, "cost")[ranked]
    out = []
    for i in ranked[front(t, gpu_s)].tolist():
        time_s, gpus = float(result.table.iter_time_s[i]), int(result.gpus[i])
        out.append(FrontPlan(result.plans[i], time_s, time_s * gpus / 3600, costs(time_s, gpus, spec, price, goal)))
    return out


def _launch(plan: Plan, resolved: Resolved) -> Launch:
    """The winner's launch section: the search validated it (enumeration or the lever search ran its rules)."""
    settings = launch_settings(plan, resolved, checked=True)
    return Launch(plan, settings["framework"], settings["files"], settings["notes"])


def _sized(resolved: Resolved, spec: WorkloadSpec) -> Resolved:
    """`resolved` for the same workload on another cluster size (itself where `spec` is its own)."""
    return resolved if spec is resolved.spec else resolve(spec, resolved.given_device)


def build_report(*, resolved: Resolved, spec_path: str, predictor: dict[str, Any], space_name: str,
                 space: SpaceConfig, enumeration: Enumeration, result: SearchResult, by: str = "time",
                 price: float | None = None, top_k: int = 10, sizes: list[WorkloadSpec] | None = None,
                 goal: TrainingGoal = TrainingGoal(), repredictor: Repredictor | None = None) -> Report:
    """The report of `result` for the resolved spec. `sizes`: the spec at each cluster size searched (default: the
    spec's); the winner's launch settings are for its size. `repredictor`: predicts the levers tried on the plans closest to fitting
    when none fits (without it they are listed with no lever)."""
    spec, device = resolved.spec, resolved.device
    limit_gib = result.stats["memory_limit_gib"]
    sizes = sizes or [spec]
    t, gpus = result.table.iter_time_s, result.gpus
    goal_set = goal.deadline_days is not None or goal.budget_usd is not None  # it may filter out the first rows
    order = rank(result, by, price, named=None if goal_set else max(top_k, LIST_CAP))
    ranked = order[within_goal(t[order], gpus[order], spec, price, goal)]
    listed = ranked[: max(top_k, LIST_CAP)]
    interval = Interval.of(predictor.get("accuracy"))
    spans, alike = intervals(result, ranked, interval, by)
    explanation = explain(result, ranked, resolved, limit_gib, by)
    if interval is not None and len(ranked):
        explanation += " " + interval_text(interval, int(alike.sum()))
    infeasible = np.flatnonzero(result.infeasible)
    infeasible = infeasible[np.argsort(t[infeasible], kind="stable")]
    valid = Counter(dict(zip(*(x.tolist() for x in np.unique(enumeration.plans.gpus(), return_counts=True)))))
    by_gpus = {s.cluster.gpus: s for s in sizes}
    closest = []
    if not len(ranked):
        closest = (close_plans.closest(result, sizes, repredictor) if repredictor is not None else
                   [ClosePlan(result.plans[i], float(t[i]), float(result.table.peak_memory_gib[i]),
                                     float(result.table.peak_memory_gib[i] - limit_gib), [])
                    for i in close_plans.least_overflow(result)])
    winner = result.plans[int(ranked[0])] if len(ranked) else None
    return Report(
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        spec_path=spec_path, spec=spec,
        device=DeviceInfo(device.name, device.mem_capacity / GIB, limit_gib, result.stats["headroom"],
                          device.flops(spec.training.precision) / 1e12, device.intra_node.bandwidth / 1e9,
                          device.inter_node.bandwidth / 1e9),
        predictor=predictor, ranking=Ranking(by, price, goal),
        sizes=[Size(s.cluster.nodes, s.cluster.gpus, valid[s.cluster.gpus]) for s in sizes],
        space=SpaceInfo(space_name, space.model_dump(mode="json"), enumeration.checked, len(enumeration.plans),
                        enumeration.rejected_count, [tuple(r) for r in enumeration.top_reasons(5)],
                        dict(enumeration.pruned)),
        search=result.stats,
        ranked=[RankedPlan(n + 1, result.plans[i], pred, costs(pred.iter_time_s, result.plans[i].gpus, spec, price, goal),
                           None if spans is None else (float(spans[n, 0]), float(spans[n, 1])), bool(alike[n]))
                for n, (i, pred) in enumerate(zip(listed.tolist(), result.table.rows(listed)))],
        ranked_total=len(ranked), over_goal_total=len(order) - len(ranked),
        interval=interval, indistinguishable_total=int(alike.sum()),
        pareto=pareto(result, ranked, spec, price, goal),
        infeasible=[InfeasiblePlan(result.plans[i], result.reason(i) or "", float(t[i]),
                                   float(result.table.peak_memory_gib[i])) for i in infeasible[:LIST_CAP].tolist()],
        infeasible_total=len(infeasible), closest=closest,
        failed=result.failed[:LIST_CAP], failed_total=len(result.failed), top_k=top_k,
        explanation=explanation,
        caution=caution(result.table.row(int(ranked[0])) if len(ranked) else None),
        launch=_launch(winner, _sized(resolved, by_gpus.get(winner.gpus, spec))) if winner is not None else None,
        points=points(result, ranked, spec, goal, price),
    )
