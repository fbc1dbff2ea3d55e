"""The report's figures: interactive plots as HTML fragments (plotly, its library inlined once per page, so the
report loads nothing from the network), and the breakdown bars as PNG bytes (matplotlib, Agg backend)."""

from __future__ import annotations

import io
from typing import Any, Sequence

from predictor.costs.prediction import MEMORY_PARTS, TIME_PARTS
from predictor.plan import Plan


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


# A plotted plan: (x, y, hover label). Traces are thinned to this many points (the best by y first, then an even
# sample of the rest), so a million-plan search still gives a page a browser opens at once.
Point = tuple[float, float, str]
MAX_POINTS = 4000


def thin(points: Sequence[Point], cap: int = MAX_POINTS) -> list[Point]:
    """At most `cap` points: the quarter with the lowest y, and an evenly spaced sample of the others."""
    if len(points) <= cap:
        return list(points)
    ordered = sorted(points, key=lambda p: p[1])
    head, rest = ordered[: cap // 4], ordered[cap // 4:]
    step = len(rest) / (cap - len(head))
    return head + [rest[int(i * step)] for i in range(cap - len(head))]


def _scatter(points: Sequence[Point], name: str, **style: Any) -> Any:
    import plotly.graph_objects as go

    shown = thin(points)
    label = name if len(shown) == len(points) else f"{name}, {len(shown)} of {len(points)} shown"
    return go.Scatter(x=[p[0] for p in shown], y=[p[1] for p in shown], text=[p[2] for p in shown], name=label,
                      hovertemplate="%{text}<extra></extra>", **style)


def _html(fig: Any, title: str, xlabel: str, ylabel: str, include_js: bool, log_y: bool = False) -> str:
    fig.update_layout(title=title, xaxis_title=xlabel, yaxis_title=ylabel, template="plotly_white", height=500,
                      margin={"l": 60, "r": 20, "t": 50, "b": 50}, legend={"font": {"size": 11}})
    if log_y:
        fig.update_yaxes(type="log", dtick="D2", tickformat="~g")  # 1, 2, 5 per decade, each labelled in full
    return fig.to_html(full_html=False, include_plotlyjs=include_js, config={"displaylogo": False, "responsive": True})


def time_vs_memory(feasible: Sequence[Point], infeasible: Sequence[Point], front: Sequence[Point], limit_gib: float,
                   best: Point | None, include_js: bool = True) -> str:
    """Every evaluated plan as (peak memory GiB, iteration s, label), with `front`, the memory-time Pareto front of
    the feasible ones (`pareto_front`'s order; the report finds it on its columns, which for a million plans is
    seconds faster than on the points): an HTML fragment, hover on a point for its plan."""
    import plotly.graph_objects as go

    fig = go.Figure()
    if infeasible:
        fig.add_trace(_scatter(infeasible, f"infeasible ({len(infeasible)})", mode="markers",
                               marker={"size": 4, "color": "#d62728", "opacity": 0.35}))
    if feasible:
        fig.add_trace(_scatter(feasible, f"feasible ({len(feasible)})", mode="markers",
                               marker={"size": 4, "color": "#1f77b4", "opacity": 0.5}))
        fig.add_trace(_scatter(front, "memory-time front", mode="lines+markers",
                               line={"color": "black", "width": 1.2}, marker={"size": 5}))
    if best:
        fig.add_trace(_scatter([best], "best", mode="markers",
                               marker={"symbol": "star", "size": 16, "color": "gold", "line": {"color": "black", "width": 1}}))
    fig.add_vline(x=limit_gib, line_dash="dash", line_color="gray", annotation_text=f"limit {limit_gib:.0f} GiB")
    return _html(fig, "Plans: time vs memory", "predicted peak memory per GPU (GiB)", "predicted iteration time (s)",
                 include_js, log_y=True)


def time_vs_cost(sizes: dict[str, Sequence[Point]], front: Sequence[Point], xlabel: str, ylabel: str,
                 include_js: bool = False) -> str:
    """The plans that fit, one trace per cluster size (`sizes`: name -> points of (time, cost, label)), and the
    time-cost Pareto front: an HTML fragment, hover on a point for its plan."""
    import plotly.graph_objects as go

    fig = go.Figure([_scatter(points, name, mode="markers", marker={"size": 5, "opacity": 0.55})
                     for name, points in sizes.items()])
    fig.add_trace(_scatter(front, f"Pareto front ({len(front)})", mode="lines+markers",
                           line={"color": "black", "width": 1.5}, marker={"size": 9, "symbol": "diamond"}))
    return _html(fig, "Time against cost: the plans no other beats on both", xlabel, ylabel, include_js)


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
    # Beside the bars, not over them: a legend inside the axes hides the tallest stacks.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _png(fig)


def bar_label(plan: Plan) -> str:
    """A plan under its bar: degrees on the first line, micro-batch, ZeRO and recomputation on the second."""
    return f"d{plan.dp} t{plan.tp} p{plan.pp}\nm{plan.mbs} z{plan.zero} {plan.recompute[:3]}{' v' + str(plan.v) if plan.v > 1 else ''}"


def time_breakdown(labels: list[str], parts: list[dict[str, float]]) -> bytes:
    return stacked(labels, parts, TIME_PARTS, "seconds per iteration", "Where the time goes (top plans)")


def memory_breakdown(labels: list[str], parts: list[dict[str, float]], limit_gib: float) -> bytes:
    return stacked(labels, parts, MEMORY_PARTS, "GiB on the peak rank", "Where the memory goes (top plans)", limit_gib)
