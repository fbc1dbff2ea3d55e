"""Ranking a search's plans: the order, the run's goal (deadline and budget), costs, intervals and the Pareto front,
all on the search's columns (a search holds up to millions of plans)."""

from __future__ import annotations

from typing import Any

import numpy as np

from orchestrator.report.model import Costs, TrainingGoal
from orchestrator.search.types import SearchResult
from predictor.models.intervals import Interval
from predictor.spec.workload import WorkloadSpec

RANK_BY = ("time", "throughput", "cost")


def tokens_per_iteration(spec: WorkloadSpec) -> int:
    return spec.training.global_batch * spec.model.tokens


def days_and_cost(t: float | np.ndarray, gpus: int | np.ndarray, spec: WorkloadSpec, price: float | None,
                  goal: TrainingGoal) -> tuple[Any, Any]:
    """Days and cost to train of a plan (numbers) or plans (arrays) taking `t` on `gpus`, or None where unknown."""
    days = goal.train_tokens / tokens_per_iteration(spec) * t / 86400 if goal.train_tokens else None
    return days, price * gpus * days * 24 if price is not None and days is not None else None


def costs(iter_time_s: float, gpus: int, spec: WorkloadSpec, price: float | None,
          goal: TrainingGoal = TrainingGoal()) -> Costs:
    """Size, throughput, time and cost of a plan taking `iter_time_s` on `gpus` GPUs."""
    t, tokens = iter_time_s, tokens_per_iteration(spec)
    days, cost = days_and_cost(t, gpus, spec, price, goal)
    return Costs(nodes=gpus // spec.cluster.gpus_per_node, gpus=gpus, tokens_per_s=tokens / t,
                 tokens_per_s_per_gpu=tokens / t / gpus, days_per_1t_tokens=1e12 / (tokens / t) / 86400,
                 cost_usd_per_iteration=price * gpus * t / 3600 if price is not None else None,
                 days_to_train=days, cost_usd_to_train=cost)


def measure(result: SearchResult, by: str) -> np.ndarray:
    """What a ranking orders the predicted plans by: iteration time, or GPU-seconds per iteration (total cost and GPUs
    per token/s are both proportional to it)."""
    t = result.table.iter_time_s
    return t if by == "time" else t * result.gpus


def rank(result: SearchResult, by: str = "time", price: float | None = None, named: int | None = None) -> np.ndarray:
    """The rows of the feasible plans, best first: by iteration time (days to train: every size runs the same global
    batch), or by GPU-seconds per iteration (throughput per GPU, and cost at one price per GPU-hour). Cost needs a price
    to report it. Plans alike in both break ties on their text among the first `named` rows (all when None; beyond
    them, the order they were searched in: a full space has tens of thousands of such ties, and naming each plan
    costs seconds where no report reads their order)."""
    if by not in RANK_BY:
        raise ValueError(f"rank by one of {', '.join(RANK_BY)}, not {by!r}")
    if by == "cost" and price is None:
        raise ValueError("ranking by cost needs --price-per-gpu-hour")
    rows = np.flatnonzero(~result.infeasible)
    m, peak = measure(result, by)[rows], result.table.peak_memory_gib[rows]
    # Ties break on memory so the more comfortable plan comes first, then on the plan's text.
    order = np.lexsort((peak, m))
    m, peak, order = m[order], peak[order], rows[order]
    starts = np.flatnonzero(np.concatenate([[True], (m[1:] != m[:-1]) | (peak[1:] != peak[:-1])]))
    ends = np.append(starts[1:], len(order))
    for a, b in zip(starts.tolist(), ends.tolist()):
        if named is not None and a >= named:
            break
        if b - a > 1:
            order[a:b] = sorted(order[a:b].tolist(), key=lambda i: str(result.plans[i]))
    return order


def within_goal(t: np.ndarray, gpus: np.ndarray, spec: WorkloadSpec, price: float | None,
                goal: TrainingGoal) -> np.ndarray:
    """Which plans taking `t` on `gpus` meet the deadline and the budget (either may be unset)."""
    days, cost = days_and_cost(t, gpus, spec, price, goal)
    keep = np.ones(len(t), dtype=bool)
    if goal.deadline_days is not None:
        keep &= days <= goal.deadline_days  # type: ignore[operator]
    if goal.budget_usd is not None:
        keep &= cost <= goal.budget_usd  # type: ignore[operator]
    return keep


def intervals(result: SearchResult, ranked: np.ndarray, interval: Interval | None,
              by: str) -> tuple[np.ndarray | None, np.ndarray]:
    """Each ranked plan's iteration-time interval ((plans, 2), None without one), and whether its interval, scaled
    to the ranking's measure (time, or GPU-seconds for throughput and cost), overlaps the winner's."""
    if interval is None or not len(ranked):
        return None, np.zeros(len(ranked), dtype=bool)
    return interval.around(result.table.iter_time_s[ranked]), interval.overlaps_first(measure(result, by)[ranked])


def front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Positions of the points no other beats in both coordinates (lower is better), by x: `plots.pareto_front` on
    columns."""
    order = np.lexsort((y, x))
    ys = y[order]
    before = np.minimum.accumulate(np.concatenate([[np.inf], ys[:-1]]))
    return order[ys < before]
