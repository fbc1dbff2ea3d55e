"""The report's figures as PNG bytes (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import io
from typing import Sequence

from predictor.prediction import MEMORY_PARTS, TIME_PARTS


def _png(fig) -> bytes:  # noqa: ANN001 - a matplotlib Figure
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def pyplot():  # noqa: ANN202 - matplotlib.pyplot, imported on first use (about a second)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (lower is better), by x."""
    front, best_y = [], float("inf")
    for i in sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1])):
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def time_vs_memory(feasible: list[tuple[float, float]], infeasible: list[tuple[float, float]],
                   limit_gib: float, best: tuple[float, float] | None) -> bytes:
    """Every evaluated plan as (peak memory GiB, iteration s), the Pareto front of the feasible ones."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if infeasible:
        ax.scatter(*zip(*infeasible), s=6, c="#d62728", alpha=0.35, label=f"infeasible ({len(infeasible)})")
    if feasible:
        ax.scatter(*zip(*feasible), s=6, c="#1f77b4", alpha=0.5, label=f"feasible ({len(feasible)})")
        front = [feasible[i] for i in pareto_front(feasible)]
        ax.plot(*zip(*front), "-o", c="black", ms=3, lw=1.2, label="Pareto front")
    if best:
        ax.scatter([best[0]], [best[1]], marker="*", s=220, c="gold", edgecolors="black", zorder=5, label="best")
    ax.axvline(limit_gib, ls="--", c="gray", lw=1, label=f"memory limit {limit_gib:.0f} GiB")
    ax.set_xlabel("predicted peak memory per GPU (GiB)")
    ax.set_ylabel("predicted iteration time (s)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("Plans: time vs memory")
    return _png(fig)


def stacked(labels: list[str], parts: list[dict[str, float]], keys: Sequence[str], ylabel: str, title: str,
            limit: float | None = None) -> bytes:
    """A stacked bar per plan (labels) of its breakdown `parts` over `keys`."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(labels) + 2), 4))
    bottom = [0.0] * len(labels)
    for key in keys:
        values = [p.get(key, 0.0) for p in parts]
        ax.bar(range(len(labels)), values, bottom=bottom, label=key)
        bottom = [b + v for b, v in zip(bottom, values)]
    if limit is not None:
        ax.axhline(limit, ls="--", c="gray", lw=1, label="limit")
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=3)
    return _png(fig)


def time_breakdown(labels: list[str], parts: list[dict[str, float]]) -> bytes:
    return stacked(labels, parts, TIME_PARTS, "seconds per iteration", "Where the time goes (top plans)")


def memory_breakdown(labels: list[str], parts: list[dict[str, float]], limit_gib: float) -> bytes:
    return stacked(labels, parts, MEMORY_PARTS, "GiB on the peak rank", "Where the memory goes (top plans)", limit_gib)
