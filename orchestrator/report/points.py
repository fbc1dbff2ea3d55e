"""The report's plotted plans: (x, y, hover label) points on the memory-time and time-cost planes, labels formatted
only when read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from orchestrator.report.model import TrainingGoal
from orchestrator.report.ranking import costs, days_and_cost, front
from orchestrator.report.text import train_text
from orchestrator.search.types import SearchResult
from predictor.spec.workload import WorkloadSpec


class Point:
    """A plotted plan, read as the tuple (x, y, hover label), whose label is formatted only when read: the plots
    show a few thousand of a search's plans (`plots.thin`), and formatting every plan's label costs seconds."""

    __slots__ = ("x", "y", "row", "label")

    def __init__(self, x: float, y: float, row: int, label: Callable[[int], str]) -> None:
        self.x, self.y, self.row, self.label = x, y, row, label

    def __len__(self) -> int:
        return 3

    def __getitem__(self, k: int) -> float | str:
        if k == 0:
            return self.x
        if k == 1:
            return self.y
        if k == 2:
            return self.label(self.row)
        raise IndexError(k)


@dataclass(frozen=True)
class Points:
    feasible: list[Point]
    front: list[Point]  # the memory-time Pareto front of the feasible ones
    infeasible: list[Point]
    by_size: dict[str, list[Point]]  # the ranked plans on the time-cost plane, per cluster size


def cost_axes(goal: TrainingGoal, price: float | None) -> tuple[str, str, str, str]:
    """(x metric, y metric, x label, y label) of the time-cost plot: days and dollars to train where the run's tokens
    and a price are given, else seconds and GPU-hours per iteration (proportional to them)."""
    x = ("days_to_train", "days to train") if goal.train_tokens else ("iter_time_s", "iteration time (s)")
    y = (("cost_usd_to_train", "cost to train (USD)") if goal.train_tokens and price is not None
         else ("gpu_hours_per_iteration", "GPU-hours per iteration"))
    return x[0], y[0], x[1], y[1]


def point_text(nodes: int, gpus: int, iter_time_s: float, days: float | None, cost: float | None) -> str:
    """A plan's size, time and cost in a hover label."""
    return f"{nodes} nodes ({gpus} GPUs): {iter_time_s:.3f} s/iteration{train_text(days, cost)}"


def memory_points(result: SearchResult, rows: np.ndarray) -> list[Point]:
    """The plans of `rows` on the memory-time plane."""
    def label(i: int) -> str:
        plan, t, peak, reason = result.plans[i], result.table.iter_time_s[i], result.table.peak_memory_gib[i], result.reason(i)
        return f"{plan}<br>{plan.gpus} GPUs: {t:.3f} s, {peak:.1f} GiB" + (f"<br>{reason}" if reason else "")

    peak, t = result.table.peak_memory_gib[rows].tolist(), result.table.iter_time_s[rows].tolist()
    return [Point(x, y, i, label) for x, y, i in zip(peak, t, rows.tolist())]


def cost_points(result: SearchResult, ranked: np.ndarray, spec: WorkloadSpec, goal: TrainingGoal,
                price: float | None) -> dict[str, list[Point]]:
    """The ranked plans on the time-cost plane, per cluster size."""
    x, y, _, _ = cost_axes(goal, price)
    t, gpus = result.table.iter_time_s[ranked], result.gpus[ranked]
    days, cost = days_and_cost(t, gpus, spec, price, goal)
    values = {"iter_time_s": t, "gpu_hours_per_iteration": t * gpus / 3600, "days_to_train": days, "cost_usd_to_train": cost}

    def label(i: int) -> str:
        time_s = float(result.table.iter_time_s[i])
        c = costs(time_s, result.plans[i].gpus, spec, price, goal)
        return f"{result.plans[i]}<br>{point_text(c.nodes, c.gpus, time_s, c.days_to_train, c.cost_usd_to_train)}"

    nodes = gpus // spec.cluster.gpus_per_node
    out: dict[str, list[Point]] = {}
    for n in nodes[np.sort(np.unique(nodes, return_index=True)[1])].tolist():
        mine = nodes == n
        out[f"{n} nodes"] = [Point(a, b, i, label) for a, b, i in zip(
            values[x][mine].tolist(), values[y][mine].tolist(), ranked[mine].tolist())]  # type: ignore[index]
    return out


def points(result: SearchResult, ranked: np.ndarray, spec: WorkloadSpec, goal: TrainingGoal,
           price: float | None) -> Points:
    """Every plot's points of a search."""
    t = result.table.iter_time_s
    fits = np.flatnonzero(~result.infeasible)
    infeasible = np.flatnonzero(result.infeasible)
    infeasible = infeasible[np.argsort(t[infeasible], kind="stable")]
    return Points(feasible=memory_points(result, fits),
                  front=memory_points(result, fits[front(result.table.peak_memory_gib[fits], t[fits])]),
                  infeasible=memory_points(result, infeasible),
                  by_size=cost_points(result, ranked, spec, goal, price))
