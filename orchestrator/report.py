"""The search report: ranked plans, why the winner wins, plots and launch settings.

`OUT/report.json` (schema `scaledl.report/1`):
    schema, created (UTC ISO time), spec_path, spec (the validated workload spec),
    device: {name, capacity_gib, memory_limit_gib, headroom, peak_tflops, intra_node_gbps, inter_node_gbps},
    predictor: {name, accuracy: null when never measured, else {mape_pct (mean absolute % error of the iteration
        time), rows (how many measured runs), source (which runs, never trained on), measured_by, ...}},
    ranking: {by: time|throughput|cost, price_per_gpu_hour, train_tokens, deadline_days, budget_usd},
    sizes: [{nodes, gpus, valid (plans of that size)}] (the cluster sizes searched, `--nodes`),
    space: {name, config, candidates, valid, rejected, top_rejections: [[reason, count]]},
    search: the search statistics (searcher, trials, failed trials, evaluated plans, plans/s, ...),
    ranked: the best feasible plans within the deadline and budget (at most max(top_k, 100)), each {rank, plan,
        fields, nodes, gpus, tokens_per_s, tokens_per_s_per_gpu, cost_usd_per_iteration, days_per_1t_tokens,
        days_to_train and cost_usd_to_train (null without --train-tokens, resp. a price), iter_time_interval_s: [low,
        high] (null when the predictor's accuracy was never measured), indistinguishable_from_best (its interval,
        scaled to the ranking's measure, overlaps the winner's), and every Prediction field},
    intervals: null, or {coverage (0.8), low, high (relative to a prediction), rows, basis (which held-out
        residuals), indistinguishable_total (plans after the winner that it cannot be told apart from)},
    ranked_total, over_goal_total: feasible plans left out by --deadline-days / --budget-usd,
    pareto: the plans no other (feasible, within the goal) plan beats on both days and cost, fastest first,
        {plan, nodes, gpus, iter_time_s, gpu_hours_per_iteration, days_to_train, cost_usd_to_train}
        (days and cost are proportional to iteration time and GPU-hours per iteration, so the front exists
        without --train-tokens or a price), infeasible: the fastest plans that do not fit (at most 100) {plan, reason, iter_time_s,
        peak_memory_gib}, infeasible_total, failed: plans whose prediction failed {plan, error},
    explanation: one paragraph derived from the winner's breakdown against the runners-up,
    caution: '' or a warning that the winner lies outside the learned predictor's training data
        (the ranked plans' `extra.outside_training` lists what, per plan),
    launch: {plan, framework, files: {name: text}, notes} for the winner (null if none fits; no files and a
        note when its framework refuses it, see orchestrator.launch),
    validation (only with --validate K): {k, steps, warmup, plans: [ValidationResult.to_dict()], note}
        (see orchestrator.validate).
`report.md` says the same for people; `report.html` loads nothing from the network (plotly inlined once: a sortable,
filterable plan table, time-memory and time-cost plots with hover labels; the breakdowns as base64 PNGs);
`launch/` holds the winner's launch file for the spec's framework: `megatron_args.txt` (and `torchrun.sh`),
`torchtitan.toml` or `deepspeed_config.json`.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from orchestrator import plots
from orchestrator.launch import launch_settings
from orchestrator.search import SearchResult
from predictor.axes import AXIS
from predictor.frameworks import framework_of
from predictor.hardware import GIB, Device
from predictor.models.domain import advice
from predictor.models.registry import interval_factors
from predictor.plan import Plan, nvlink_domain
from predictor.prediction import TIME_PARTS, Prediction
from predictor.workload import WorkloadSpec
from search_spaces import Enumeration, SpaceConfig

RANK_BY = ("time", "throughput", "cost")
SCHEMA = "scaledl.report/1"
_LIST_CAP = 100
_HIDDEN_WORDS = {"tp_comm": "tensor-parallel", "cp_comm": "context-parallel", "ep_comm": "expert all-to-all", "dp_grad": "gradient reduction",
                 "dp_param": "parameter all-gather", "pp_p2p": "pipeline send/recv"}
_PART_WORDS = {
    "compute": "compute", "tp_comm": "tensor-parallel communication", "cp_comm": "context-parallel K/V exchange",
    "ep_comm": "expert-parallel token all-to-all",
    "dp_comm": "data-parallel gradient sync",
    "pp_bubble": "pipeline bubble", "pp_p2p": "pipeline send/recv", "optimizer": "optimizer step",
}


@dataclass(frozen=True)
class TrainingGoal:
    """The whole run a plan is for: its tokens (for days and cost to train) and the limits a plan must meet."""

    train_tokens: float | None = None
    deadline_days: float | None = None
    budget_usd: float | None = None


def tokens_per_iteration(spec: WorkloadSpec) -> int:
    return spec.training.global_batch * spec.model.tokens


def plan_metrics(iter_time_s: float, gpus: int, spec: WorkloadSpec, price: float | None,
                 goal: TrainingGoal = TrainingGoal()) -> dict[str, Any]:
    """Size, throughput, time and cost of a plan taking `iter_time_s` on `gpus` GPUs, its cluster size (costs only
    with a price per GPU-hour, days and cost to train only with the run's tokens)."""
    t = iter_time_s
    tokens = tokens_per_iteration(spec)
    days, cost = _days_and_cost(t, gpus, spec, price, goal)
    return {"nodes": gpus // spec.cluster.gpus_per_node, "gpus": gpus, "tokens_per_s": tokens / t,
            "tokens_per_s_per_gpu": tokens / t / gpus, "days_per_1t_tokens": 1e12 / (tokens / t) / 86400,
            "cost_usd_per_iteration": price * gpus * t / 3600 if price is not None else None,
            "days_to_train": days, "cost_usd_to_train": cost}


def _measure(result: SearchResult, by: str) -> np.ndarray:
    """What a ranking orders the predicted plans by: iteration time, or GPU-seconds per iteration (total cost and GPUs
    per token/s are both proportional to it)."""
    t = result.table.iter_time_s
    return t if by == "time" else t * result.gpus


def rank(result: SearchResult, by: str = "time", price: float | None = None) -> np.ndarray:
    """The rows of the feasible plans, best first: by iteration time (days to train: every size runs the same global
    batch), or by GPU-seconds per iteration (throughput per GPU, and cost at one price per GPU-hour). Cost needs a price
    to report it."""
    if by not in RANK_BY:
        raise ValueError(f"rank by one of {', '.join(RANK_BY)}, not {by!r}")
    if by == "cost" and price is None:
        raise ValueError("ranking by cost needs --price-per-gpu-hour")
    rows = np.flatnonzero(~result.infeasible)
    measure, peak = _measure(result, by)[rows], result.table.peak_memory_gib[rows]
    # Ties break on memory so the more comfortable plan comes first, then on the plan's text.
    order = np.lexsort((peak, measure))
    measure, peak, order = measure[order], peak[order], rows[order]
    starts = np.flatnonzero(np.concatenate([[True], (measure[1:] != measure[:-1]) | (peak[1:] != peak[:-1])]))
    ends = np.append(starts[1:], len(order))
    for a, b in zip(starts.tolist(), ends.tolist()):
        if b - a > 1:
            order[a:b] = sorted(order[a:b].tolist(), key=lambda i: str(result.plans[i]))
    return order


def _days_and_cost(t: float | np.ndarray, gpus: int | np.ndarray, spec: WorkloadSpec, price: float | None,
                   goal: TrainingGoal) -> tuple[Any, Any]:
    """Days and cost to train of a plan (numbers) or plans (arrays) taking `t` on `gpus`, or None where unknown."""
    days = goal.train_tokens / tokens_per_iteration(spec) * t / 86400 if goal.train_tokens else None
    return days, price * gpus * days * 24 if price is not None and days is not None else None


def within_goal(t: np.ndarray, gpus: np.ndarray, spec: WorkloadSpec, price: float | None,
                goal: TrainingGoal) -> np.ndarray:
    """Which plans taking `t` on `gpus` meet the deadline and the budget (either may be unset)."""
    days, cost = _days_and_cost(t, gpus, spec, price, goal)
    keep = np.ones(len(t), dtype=bool)
    if goal.deadline_days is not None:
        keep &= days <= goal.deadline_days  # type: ignore[operator]
    if goal.budget_usd is not None:
        keep &= cost <= goal.budget_usd  # type: ignore[operator]
    return keep


def intervals(result: SearchResult, ranked: np.ndarray, factors: dict[str, Any] | None,
              by: str) -> tuple[np.ndarray | None, np.ndarray]:
    """Each ranked plan's iteration-time interval ((plans, 2), None without factors), and whether its interval, scaled
    to the ranking's measure (time, or GPU-seconds for throughput and cost), overlaps the winner's: the predictor
    cannot tell those apart."""
    if factors is None or not len(ranked):
        return None, np.zeros(len(ranked), dtype=bool)
    lo, hi = 1 + factors["low"], 1 + factors["high"]
    measure = _measure(result, by)[ranked]
    t = result.table.iter_time_s[ranked]
    alike = measure * lo <= measure[0] * hi
    alike[0] = False
    return np.stack([t * lo, t * hi], axis=1), alike


def interval_text(section: dict[str, Any]) -> str:
    """What the intervals say about the top of the ranking, in words."""
    head = (f"The predictor's {section['coverage'] * 100:.0f} % interval runs from {section['low'] * 100:+.1f} % to "
            f"{section['high'] * 100:+.1f} % of a prediction ({section['basis']}).")
    n = section["indistinguishable_total"]
    if not n:
        return head + " No other plan's interval overlaps the winner's."
    return (head + f" The top {n + 1} plans cannot be told apart: {n} plans' intervals overlap the winner's; "
            f"`--validate K` runs the first K of them for real.")


def _front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Positions of the points no other beats in both coordinates (lower is better), by x: `plots.pareto_front` on
    columns."""
    order = np.lexsort((y, x))
    ys = y[order]
    before = np.minimum.accumulate(np.concatenate([[np.inf], ys[:-1]]))
    return order[ys < before]


def pareto(result: SearchResult, ranked: np.ndarray, spec: WorkloadSpec, price: float | None,
           goal: TrainingGoal) -> list[dict[str, Any]]:
    """The ranked plans no other beats on both days (iteration time) and cost (GPU-hours per iteration), fastest
    first."""
    t, gpu_s = result.table.iter_time_s[ranked], _measure(result, "cost")[ranked]
    out = []
    for i in ranked[_front(t, gpu_s)].tolist():
        time_s, gpus = float(result.table.iter_time_s[i]), int(result.gpus[i])
        m = plan_metrics(time_s, gpus, spec, price, goal)
        out.append({"plan": str(result.plans[i]), "nodes": m["nodes"], "gpus": gpus, "iter_time_s": time_s,
                    "gpu_hours_per_iteration": time_s * gpus / 3600, "days_to_train": m["days_to_train"],
                    "cost_usd_to_train": m["cost_usd_to_train"]})
    return out


def _degrees(p: Plan) -> tuple[int, ...]:
    return tuple(p.degrees().values())


def _diff_fields(a: Plan, b: Plan) -> str:
    return ", ".join(f"{k}={getattr(b, k)}" for k in asdict(a) if getattr(a, k) != getattr(b, k))


def _compare(wp: Prediction, op: Prediction, name: str) -> str:
    """How much faster the winner (predicted `wp`) is than `op` (called `name`), and which breakdown parts make it so."""
    deltas = sorted(((op.breakdown.get(k, 0.0) - wp.breakdown.get(k, 0.0), k) for k in TIME_PARTS), reverse=True)
    small = 0.005 * wp.iter_time_s  # differences under 0.5 % of the iteration are noise in the sentence
    gains = [f"{d:.2f} s less {_PART_WORDS[k]}" for d, k in deltas if d > small][:2]
    losses = [f"{-d:.2f} s more {_PART_WORDS[k]}" for d, k in deltas[::-1] if -d > small][:1]
    total = op.iter_time_s - wp.iter_time_s
    why = " and ".join(gains) if gains else "small savings spread over every part"
    cost = f", for {losses[0]}" if losses else ""
    return f"it is {total:.2f} s ({100 * total / op.iter_time_s:.1f} %) faster than {name} thanks to {why}{cost}"


def explain(result: SearchResult, ranked: np.ndarray, spec: WorkloadSpec, limit_gib: float, by: str = "time") -> str:
    """Why the winner (the first of the `ranked` rows) wins, from its breakdown and plan against the runners-up and
    the faster plans that do not fit (of its cluster size: within one size, cost and throughput per GPU order plans
    as time does)."""
    if not len(ranked):
        return "No evaluated plan fits in memory (within the deadline and budget); see the infeasible plans and their reasons."
    win = int(ranked[0])
    p, pred = result.plans[win], result.table.row(win)
    ranked = ranked[result.gpus[ranked] == p.gpus]
    share = {k: pred.breakdown.get(k, 0.0) / pred.iter_time_s for k in TIME_PARTS}
    m = p.microbatches(spec.training.global_batch)
    best = "predicted fastest" if by == "time" else f"the cheapest per token (on {p.gpus} GPUs)"
    facts = [f"{p} is {best} at {pred.iter_time_s:.2f} s per iteration ({pred.mfu * 100:.0f} % MFU), "
             f"{share['compute'] * 100:.0f} % of it compute"]
    if p.tp > 1:
        where = "inside an NVLink domain" if p.group_span("tp") <= nvlink_domain(spec) else "across nodes"
        facts.append(f"tp={p.tp} keeps its all-reduces {where} ({share['tp_comm'] * 100:.0f} % of the time)")
    if p.cp > 1:
        facts.append(f"cp={p.cp} splits every sequence over {p.cp} ranks ({AXIS['cp'].shards}); its K/V exchange "
                     f"({p.cp_comm}) costs {share['cp_comm'] * 100:.0f} % of the time")
    if p.ep > 1:
        facts.append(f"ep={p.ep} holds {spec.model.experts // p.ep} of the {spec.model.experts} experts of each MoE "
                     f"layer per rank; its token all-to-all costs {share['ep_comm'] * 100:.0f} % of the time exposed")
    if p.pp > 1:
        bubble = (p.pp - 1) / (p.v * m)
        facts.append(f"pp={p.pp} with {m} micro-batches{f' and v={p.v} virtual stages' if p.v > 1 else ''} "
                     f"leaves a {bubble * 100:.1f} % bubble ({share['pp_bubble'] * 100:.0f} % of the time)")
    if p.dp * p.cp > 1:
        over = f" over dp*cp = {p.dp * p.cp} ranks" if p.cp > 1 else ""
        facts.append(f"dp={p.dp} spends {share['dp_comm'] * 100:.0f} % in gradient sync{over}")
    hidden = sum(pred.hidden_comm.values())
    if hidden > 0:
        facts.append(f"{framework_of(spec).title} hides {hidden:.2f} s of communication behind computation "
                     f"({', '.join(_HIDDEN_WORDS.get(k, k) for k in pred.hidden_comm)})")
    text = "; ".join(facts) + ". "
    if len(ranked) > 1:
        runner = result.plans[int(ranked[1])]
        text += ("Against the runner-up, " + _compare(pred, result.table.row(int(ranked[1])), _diff_fields(p, runner)
                                                      or str(runner)) + ". ")
    other = next((i for i in ranked[1:].tolist() if _degrees(result.plans[i]) != _degrees(p)), None)
    if other is not None and other != ranked[1]:
        split = ", ".join(f"{a}={d}" for a, d in result.plans[other].degrees().items() if d > 1 or a in ("dp", "tp", "pp"))
        name = f"the best other split ({split}: {result.plans[other]})"
        text += "Against other degrees, " + _compare(pred, result.table.row(other), name) + ". "
    t = result.table.iter_time_s
    faster = np.flatnonzero(result.infeasible & (result.gpus == p.gpus) & (t < pred.iter_time_s))
    if len(faster):
        f = int(faster[np.argmin(t[faster])])
        text += (f"{len(faster)} plans would be faster but do not fit: the fastest, {_diff_fields(p, result.plans[f])}, "
                 f"needs {result.table.peak_memory_gib[f]:.1f} GiB against the {limit_gib:.1f} GiB limit, "
                 f"while the winner peaks at {pred.peak_memory_gib:.1f} GiB.")
    else:
        text += f"It peaks at {pred.peak_memory_gib:.1f} GiB of the {limit_gib:.1f} GiB limit."
    return text.strip()


def build_report(*, spec: WorkloadSpec, spec_path: str, device: Device, predictor: dict[str, Any], space_name: str,
                 space: SpaceConfig, enumeration: Enumeration, result: SearchResult, by: str = "time",
                 price: float | None = None, top_k: int = 10, sizes: list[WorkloadSpec] | None = None,
                 goal: TrainingGoal = TrainingGoal()) -> dict[str, Any]:
    """Everything report.json holds (see the module docstring for the schema), from the search's columns: Prediction
    objects only for the plans it lists. `sizes`: the spec at each cluster size searched (default: the spec's); the
    winner's launch settings are for its size."""
    limit_gib = result.stats["memory_limit_gib"]
    sizes = sizes or [spec]
    t, gpus = result.table.iter_time_s, result.gpus
    order = rank(result, by, price)
    keep = within_goal(t[order], gpus[order], spec, price, goal)
    ranked = order[keep]
    listed = ranked[: max(top_k, _LIST_CAP)]
    by_gpus = {s.cluster.gpus: s for s in sizes}
    factors = interval_factors(predictor.get("accuracy"))
    spans, alike = intervals(result, ranked, factors, by)
    section = factors and {**factors, "indistinguishable_total": int(alike.sum())}
    explanation = explain(result, ranked, spec, limit_gib, by)
    infeasible = np.flatnonzero(result.infeasible)
    infeasible = infeasible[np.argsort(t[infeasible], kind="stable")]
    fits = np.flatnonzero(~result.infeasible)
    winner = result.table.row(int(ranked[0])) if len(ranked) else None
    valid = Counter(p.gpus for p in enumeration.plans)
    prec = spec.training.precision
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "spec_path": spec_path,
        "spec": spec.model_dump(mode="json", exclude_none=True),
        "device": {"name": device.name, "capacity_gib": device.mem_capacity / GIB, "memory_limit_gib": limit_gib,
                   "headroom": result.stats["headroom"], "peak_tflops": device.flops(prec) / 1e12,
                   "intra_node_gbps": device.intra_node.bandwidth / 1e9, "inter_node_gbps": device.inter_node.bandwidth / 1e9},
        "predictor": predictor,
        "ranking": {"by": by, "price_per_gpu_hour": price, **asdict(goal)},
        "sizes": [{"nodes": s.cluster.nodes, "gpus": s.cluster.gpus, "valid": valid[s.cluster.gpus]} for s in sizes],
        "space": {"name": space_name, "config": space.model_dump(mode="json"), "candidates": enumeration.checked,
                  "valid": len(enumeration.plans), "rejected": enumeration.rejected_count,
                  "top_rejections": [list(r) for r in enumeration.top_reasons(5)]},
        "search": result.stats,
        "ranked": [{"rank": n + 1, "plan": str(result.plans[i]), "fields": asdict(result.plans[i]),
                    **plan_metrics(pred.iter_time_s, result.plans[i].gpus, spec, price, goal),
                    "iter_time_interval_s": None if spans is None else spans[n].tolist(),
                    "indistinguishable_from_best": bool(alike[n]), **pred.to_dict()}
                   for n, (i, pred) in enumerate(zip(listed.tolist(), result.table.rows(listed)))],
        "intervals": section,
        "ranked_total": len(ranked),
        "over_goal_total": len(order) - len(ranked),
        "pareto": pareto(result, ranked, spec, price, goal),
        "infeasible": [{"plan": str(result.plans[i]), "reason": result.reason(i), "iter_time_s": float(t[i]),
                        "peak_memory_gib": float(result.table.peak_memory_gib[i])} for i in infeasible[:_LIST_CAP].tolist()],
        "infeasible_total": len(infeasible),
        "failed": [{"plan": str(plan), "error": error} for plan, error in result.failed[:_LIST_CAP]],
        "failed_total": len(result.failed),
        "top_k": top_k,
        "explanation": explanation + (" " + interval_text(section) if section and len(ranked) else ""),
        "caution": caution(winner),
        "launch": launch_settings(result.plans[ranked[0]], by_gpus.get(result.plans[ranked[0]].gpus, spec)) if len(ranked) else None,
        "_points": {  # for the plots only; dropped from report.json
            "feasible": _memory_points(result, fits),
            "front": _memory_points(result, fits[_front(result.table.peak_memory_gib[fits], t[fits])]),
            "infeasible": _memory_points(result, infeasible),
            "by_size": _cost_points(result, ranked, spec, goal, price),
        },
    }


class _Point:
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


def _memory_points(result: SearchResult, rows: np.ndarray) -> list[_Point]:
    """The plans of `rows` on the memory-time plane."""
    def label(i: int) -> str:
        plan, t, peak, reason = result.plans[i], result.table.iter_time_s[i], result.table.peak_memory_gib[i], result.reason(i)
        return f"{plan}<br>{plan.gpus} GPUs: {t:.3f} s, {peak:.1f} GiB" + (f"<br>{reason}" if reason else "")

    peak, t = result.table.peak_memory_gib[rows].tolist(), result.table.iter_time_s[rows].tolist()
    return [_Point(x, y, i, label) for x, y, i in zip(peak, t, rows.tolist())]


def cost_axes(goal: TrainingGoal, price: float | None) -> tuple[str, str, str, str]:
    """(x metric, y metric, x label, y label) of the time-cost plot: days and dollars to train where the run's tokens
    and a price are given, else seconds and GPU-hours per iteration (proportional to them)."""
    x = ("days_to_train", "days to train") if goal.train_tokens else ("iter_time_s", "iteration time (s)")
    y = (("cost_usd_to_train", "cost to train (USD)") if goal.train_tokens and price is not None
         else ("gpu_hours_per_iteration", "GPU-hours per iteration"))
    return x[0], y[0], x[1], y[1]


def _cost_points(result: SearchResult, ranked: np.ndarray, spec: WorkloadSpec, goal: TrainingGoal,
                 price: float | None) -> dict[str, list[_Point]]:
    """The ranked plans on the time-cost plane, per cluster size."""
    x, y, _, _ = cost_axes(goal, price)
    t, gpus = result.table.iter_time_s[ranked], result.gpus[ranked]
    days, cost = _days_and_cost(t, gpus, spec, price, goal)
    values = {"iter_time_s": t, "gpu_hours_per_iteration": t * gpus / 3600, "days_to_train": days, "cost_usd_to_train": cost}

    def label(i: int) -> str:
        time_s = float(result.table.iter_time_s[i])
        m = plan_metrics(time_s, result.plans[i].gpus, spec, price, goal)
        return f"{result.plans[i]}<br>{_point_text({**m, 'iter_time_s': time_s})}"

    nodes = gpus // spec.cluster.gpus_per_node
    out: dict[str, list[_Point]] = {}
    for n in nodes[np.sort(np.unique(nodes, return_index=True)[1])].tolist():
        mine = nodes == n
        out[f"{n} nodes"] = [_Point(a, b, i, label) for a, b, i in zip(
            values[x][mine].tolist(), values[y][mine].tolist(), ranked[mine].tolist())]  # type: ignore[index]
    return out


def _train_text(r: dict[str, Any]) -> str:
    """`, N days, $C` of a plan's days and cost to train, each left out where unknown."""
    days = f", {r['days_to_train']:.1f} days" if r["days_to_train"] is not None else ""
    cost = f", ${r['cost_usd_to_train']:,.0f}" if r["cost_usd_to_train"] is not None else ""
    return days + cost


def _point_text(r: dict[str, Any]) -> str:
    """A plan's size, time and cost in a hover label."""
    return f"{r['nodes']} nodes ({r['gpus']} GPUs): {r['iter_time_s']:.3f} s/iteration{_train_text(r)}"


def _atomic(path: Path, data: bytes | str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def _short(plan: str) -> str:
    p = Plan.parse(plan)
    return f"d{p.dp} t{p.tp} p{p.pp}\nm{p.mbs} z{p.zero} {p.recompute[:3]}{' v' + str(p.v) if p.v > 1 else ''}"


def _figures(report: dict[str, Any]) -> str:
    """The report's plots as HTML: the interactive time-memory and time-cost plots (plotly's library inlined in the
    first), then the breakdowns of the top plans as PNGs."""
    top = report["ranked"][: report["top_k"]]
    points = report["_points"]
    best = (top[0]["peak_memory_gib"], top[0]["iter_time_s"], f"best: {top[0]['plan']}") if top else None
    parts = [plots.time_vs_memory(points["feasible"], points["infeasible"], points["front"],
                                  report["device"]["memory_limit_gib"], best)]
    if top:
        ranking = report["ranking"]
        x, y, xlabel, ylabel = cost_axes(TrainingGoal(ranking["train_tokens"]), ranking["price_per_gpu_hour"])
        front = [(r[x], r[y], f"{r['plan']}<br>{_point_text(r)}") for r in report["pareto"]]
        parts.append(plots.time_vs_cost(points["by_size"], front, xlabel, ylabel))
        labels = [_short(r["plan"]) for r in top]
        pngs = {"time breakdown": plots.time_breakdown(labels, [r["breakdown"] for r in top]),
                "memory breakdown": plots.memory_breakdown(labels, [r["memory_breakdown"] for r in top],
                                                           report["device"]["memory_limit_gib"])}
        parts += [f'<h2>{name}</h2><img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
                  for name, png in pngs.items()]
    return "".join(parts)


def compact(plan: str) -> str:
    """A plan in a few words for narrow tables: the fields that differ from the defaults."""
    p, default = Plan.parse(plan), Plan()
    keep = ("dp", "tp", "pp", "mbs")
    return " ".join(f"{k}={str(v).lower()}" for k, v in asdict(p).items() if k in keep or v != getattr(default, k))


def _or_dash(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _table_rows(report: dict[str, Any], full: bool = True, limit: int | None = None) -> list[list[str]]:
    rows = []
    for r in report["ranked"][: limit or report["top_k"]]:
        span = r["iter_time_interval_s"]
        rows.append([str(r["rank"]) + ("=" if r["indistinguishable_from_best"] else ""),
                     r["plan"] if full else compact(r["plan"]), str(r["nodes"]), f"{r['iter_time_s']:.3f}",
                     f"{span[0]:.2f}-{span[1]:.2f}" if span else "-",
                     f"{r['tokens_per_s']:,.0f}", f"{r['peak_memory_gib']:.1f}", f"{r['mfu'] * 100:.1f}",
                     _or_dash(r["cost_usd_per_iteration"], ".2f"), _or_dash(r["days_to_train"], ".1f"),
                     _or_dash(r["cost_usd_to_train"], ",.0f")])
    return rows


_HEADER = ["#", "plan", "nodes", "iter s", "80 % range s", "tokens/s", "peak GiB", "MFU %", "$/iter", "days", "$ to train"]


def caution(winner: Prediction | None) -> str:
    """A warning when the best plan (predicted `winner`) lies outside the learned predictor's training data ('' otherwise):
    its measured accuracy does not cover such predictions."""
    outside = winner.extra.get("outside_training") if winner is not None else None
    if not outside:
        return ""
    return ("Caution: the predictor was never trained on a workload or plan like the best one ("
            + "; ".join(outside) + f"); {advice(outside)}; validate it (--validate) before relying on it.")


def accuracy_text(accuracy: dict[str, Any] | None) -> str:
    """The predictor's measured accuracy in words, e.g. 'measured error 11.2% over 109 runs of ...'."""
    if not accuracy:
        return "accuracy never measured for this device: treat the times as estimates"
    return f"measured error {accuracy['mape_pct']:.1f}% over {accuracy['rows']} runs of {accuracy['source']}"


def _markdown(report: dict[str, Any]) -> str:
    s, sp, dev = report["search"], report["space"], report["device"]
    lines = [f"# ScaleDL plan report: {report['spec_path']}", "",
             f"Device {dev['name']} ({dev['capacity_gib']:.0f} GiB, limit {dev['memory_limit_gib']:.1f} GiB), "
             f"{'/'.join(str(z['nodes']) for z in report['sizes'])}x{report['spec']['cluster']['gpus_per_node']} GPUs; "
             f"predictor {report['predictor']['name']} ({accuracy_text(report['predictor'].get('accuracy'))}).",
             f"Space {sp['name']}: {sp['candidates']} candidates, {sp['valid']} valid; searcher {s['searcher']} "
             f"evaluated {s['evaluated_plans']} plans in {s['trials']} trials ({s['trials_failed']} failed), "
             f"{s['search_s']} s, {s['plans_per_s']} plans/s; {report['ranked_total']} fit in memory, "
             f"{report['infeasible_total']} do not"
             + (f", {report['over_goal_total']} miss the deadline or budget." if report["over_goal_total"] else ".")
             , "", "## Best plans", "",
             "| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in _table_rows(report)]
    if report.get("caution"):
        lines += ["", f"**{report['caution']}**"]
    lines += ["", "## Why the winner wins", "", report["explanation"], "", "## Time against cost (Pareto front)", "",
              pareto_intro(report), ""]
    lines += [f"- {front_line(r)}" for r in report["pareto"]] + [""]
    if report.get("validation"):
        from orchestrator.validation_report import validation_lines  # lazy: only --validate needs the measurement stack

        lines += validation_lines(report["validation"])
    if report["launch"]:
        launch = report["launch"]
        lines += ["## Launch settings", ""]
        for name, text in launch["files"].items():
            lines += [f"`launch/{name}` ({launch['framework']}):", "", "```", text.rstrip("\n"), "```", ""]
        lines += [f"- note: {n}" for n in launch["notes"]]
    if report["infeasible"]:
        lines += ["", "## Fastest plans that do not fit", ""]
        lines += [f"- `{r['plan']}`: {r['reason']}" for r in report["infeasible"][:10]]
    if sp["top_rejections"]:
        lines += ["", "## Why candidates were rejected", ""]
        lines += [f"- {n} candidates: {reason}" for reason, n in sp["top_rejections"]]
    return "\n".join(lines) + "\n"


def pareto_intro(report: dict[str, Any]) -> str:
    """What the front is, over which sizes, and what its ends are."""
    sizes = ", ".join(str(z["nodes"]) for z in report["sizes"])
    n = len(report["pareto"])
    return (f"Over {sizes} nodes, {n} plan{'s are' if n != 1 else ' is'} beaten by no other on both time to train and "
            f"cost (GPU-hours){'; the fastest first' if n > 1 else ''}." + ("" if report["ranking"]["train_tokens"] else
                                                      " Give --train-tokens (and a price) for days and dollars."))


def front_line(r: dict[str, Any]) -> str:
    """One Pareto plan in words."""
    return (f"{r['nodes']} nodes ({r['gpus']} GPUs): `{r['plan']}`, {r['iter_time_s']:.3f} s/iteration, "
            f"{r['gpu_hours_per_iteration']:.2f} GPU-h/iteration{_train_text(r)}")


def _html_table(header: list[str], rows: list[list[str]], table_id: str = "") -> str:
    e = html.escape
    return (f"<table{f' id={table_id!r}' if table_id else ''}><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in header)
            + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows) + "</tbody></table>")


# The plan table's behaviour: a click on a column header sorts by it (numbers as numbers, again: the other way), and
# the filter box keeps the rows holding every word typed.
_TABLE_SCRIPT = """<script>
(function () {
  const table = document.getElementById("plans"), body = table.tBodies[0];
  const value = (row, i) => { const t = row.cells[i].textContent.trim(), n = parseFloat(t.replace(/,/g, ""));
                              return isNaN(n) ? t : n; };
  table.tHead.querySelectorAll("th").forEach((th, i) => th.addEventListener("click", () => {
    const up = th.dataset.order !== "up";
    table.tHead.querySelectorAll("th").forEach(h => delete h.dataset.order);
    th.dataset.order = up ? "up" : "down";
    Array.from(body.rows).sort((a, b) => { const x = value(a, i), y = value(b, i);
      return (typeof x === typeof y ? (x > y) - (x < y) : typeof x === "number" ? -1 : 1) * (up ? 1 : -1); })
      .forEach(r => body.appendChild(r));
  }));
  document.getElementById("filter").addEventListener("input", ev => {
    const words = ev.target.value.toLowerCase().split(/ +/).filter(Boolean);
    Array.from(body.rows).forEach(r => { const text = r.textContent.toLowerCase();
                                         r.hidden = !words.every(w => text.includes(w)); });
  });
})();
</script>"""


def _html(report: dict[str, Any], figures: str) -> str:
    e = html.escape
    launch = report["launch"]
    launch_html = "" if not launch else (
        "<h2>Launch settings</h2>"
        + "".join(f"<h3>launch/{e(name)}</h3><pre>{e(text)}</pre>" for name, text in launch["files"].items())
        + "".join(f"<p>note: {e(n)}</p>" for n in launch["notes"]))
    summary = _markdown(report).split("\n")[2:4]
    validation = ""
    if report.get("validation"):
        from orchestrator.validation_report import VALIDATION_HEADER, validation_intro, validation_rows

        section = report["validation"]
        validation = (f"<h2>Measured by real runs</h2><p>{e(validation_intro(section))}</p>"
                      + _html_table(VALIDATION_HEADER, validation_rows(section))
                      + (f"<p>Note: {e(section['note'])}.</p>" if section["note"] else ""))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>ScaleDL plan report</title><style>"
            "body{font-family:sans-serif;max-width:1200px;margin:2em auto}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
            "#plans th{cursor:pointer;background:#f4f4f4;position:sticky;top:0}#plans th[data-order=up]::after{content:' \\25B2'}"
            "#plans th[data-order=down]::after{content:' \\25BC'}#plans td:nth-child(2){font-family:monospace;font-size:85%;max-width:26em;overflow-wrap:anywhere}"
            "#filter{width:40em;margin:0 0 8px}.scroll{max-height:32em;overflow:auto}"
            f"pre{{background:#f4f4f4;padding:8px;white-space:pre-wrap}}</style></head><body>"
            f"<h1>ScaleDL plan report: {e(report['spec_path'])}</h1>" + "".join(f"<p>{e(s)}</p>" for s in summary)
            + f"<h2>Best plans</h2><p>The {len(report['ranked'])} best of {report['ranked_total']} plans that fit; click a "
            "column to sort, type to filter (every word must appear); <code>=</code>: its interval overlaps the winner's.</p>"
            + '<input id="filter" type="search" placeholder="filter, e.g. tp=8 64">'
            + '<div class="scroll">' + _html_table(_HEADER, _table_rows(report, limit=len(report["ranked"])), "plans")
            + "</div>" + _TABLE_SCRIPT
            + (f"<p><strong>{e(report['caution'])}</strong></p>" if report.get("caution") else "")
            + f"<h2>Why the winner wins</h2><p>{e(report['explanation'])}</p>"
            + f"<h2>Time against cost</h2><p>{e(pareto_intro(report))}</p><ul>"
            + "".join(f"<li>{e(front_line(r))}</li>" for r in report["pareto"]) + "</ul>"
            + f"{validation}{figures}{launch_html}</body></html>")


def write_report(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write report.json/md/html and the winner's launch files into `out_dir` (each file atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {k: v for k, v in report.items() if not k.startswith("_")}
    written = {out_dir / "report.json": json.dumps(data, indent=1), out_dir / "report.md": _markdown(report),
               out_dir / "report.html": _html(report, _figures(report))}
    if report["launch"]:
        launch_dir = out_dir / "launch"
        launch_dir.mkdir(exist_ok=True)
        for name, text in report["launch"]["files"].items():
            written[launch_dir / name] = text
    for path, text in written.items():
        _atomic(path, text)
    return list(written)


def print_report(report: dict[str, Any], console: Any = None) -> None:
    """The terminal view: a rich table of the top plans and the paragraph on why the winner wins."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    title = f"Top {min(report['top_k'], report['ranked_total'])} of {report['ranked_total']} feasible plans " \
            f"({report['search']['evaluated_plans']} evaluated, ranked by {report['ranking']['by']})"
    table = Table(title=title)
    for h in _HEADER:
        table.add_column(h, justify="left" if h == "plan" else "right")
    for row in _table_rows(report, full=False):
        table.add_row(*row)
    console.print(table)
    console.print(report["explanation"])
    if len(report["sizes"]) > 1 or report["ranking"]["train_tokens"]:
        console.print(pareto_intro(report))
        for r in report["pareto"][:10]:
            console.print(f"  {front_line(r)}")
    if report.get("caution"):
        console.print(f"[bold yellow]{report['caution']}[/]")
    if report.get("validation"):
        from orchestrator.validation_report import print_validation

        print_validation(report["validation"], console)
