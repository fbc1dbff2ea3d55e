"""Why the winner wins, in words derived from its breakdown and plan against the runners-up and the faster plans
that do not fit (nothing canned: another workload gives another paragraph)."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from orchestrator.search.types import SearchResult
from predictor.costs.prediction import TIME_PARTS, Prediction
from predictor.plan import HIDDEN_WORDS, PART_WORDS, PRICING_ORDER, Plan
from predictor.spec.resolver import Resolved

def _degrees(p: Plan) -> tuple[int, ...]:
    return tuple(p.degrees().values())


def _diff_fields(a: Plan, b: Plan) -> str:
    return ", ".join(f"{k}={getattr(b, k)}" for k in asdict(a) if getattr(a, k) != getattr(b, k))


def _compare(wp: Prediction, op: Prediction, name: str) -> str:
    """How much faster the winner (predicted `wp`) is than `op` (called `name`), and which breakdown parts make it so."""
    deltas = sorted(((op.breakdown.get(k, 0.0) - wp.breakdown.get(k, 0.0), k) for k in TIME_PARTS), reverse=True)
    small = 0.005 * wp.iter_time_s  # differences under 0.5 % of the iteration are noise in the sentence
    gains = [f"{d:.2f} s less {PART_WORDS[k]}" for d, k in deltas if d > small][:2]
    losses = [f"{-d:.2f} s more {PART_WORDS[k]}" for d, k in deltas[::-1] if -d > small][:1]
    total = op.iter_time_s - wp.iter_time_s
    why = " and ".join(gains) if gains else "small savings spread over every part"
    cost = f", for {losses[0]}" if losses else ""
    return f"it is {total:.2f} s ({100 * total / op.iter_time_s:.1f} %) faster than {name} thanks to {why}{cost}"


def explain(result: SearchResult, ranked: np.ndarray, resolved: Resolved, limit_gib: float, by: str = "time") -> str:
    """Why the winner (the first of the `ranked` rows) wins, from its breakdown and plan against the runners-up and
    the faster plans that do not fit (of its cluster size: within one size, cost and throughput per GPU order plans
    as time does)."""
    spec = resolved.spec
    if not len(ranked):
        return ("No evaluated plan fits in memory (within the deadline and budget); see the plans closest to fitting "
                "and the change that would make each fit.")
    win = int(ranked[0])
    p, pred = result.plans[win], result.table.row(win)
    ranked = ranked[result.gpus[ranked] == p.gpus]
    share = {k: pred.breakdown.get(k, 0.0) / pred.iter_time_s for k in TIME_PARTS}
    best = "predicted fastest" if by == "time" else f"the cheapest per token (on {p.gpus} GPUs)"
    facts = [f"{p} is {best} at {pred.iter_time_s:.2f} s per iteration ({pred.mfu * 100:.0f} % MFU), "
             f"{share['compute'] * 100:.0f} % of it compute"]
    for axis in PRICING_ORDER:
        if axis.degree(p) > 1:
            percent = 100 * sum(share.get(part.name, 0.0) for part in axis.parts)
            named = axis.function("facts")
            facts.append(axis.explain.format(degree=axis.degree(p), share=percent, **(named(p, spec) if named else {})))
    hidden = sum(pred.hidden_comm.values())
    if hidden > 0:
        facts.append(f"{resolved.framework.title} hides {hidden:.2f} s of communication behind computation "
                     f"({', '.join(HIDDEN_WORDS.get(k, k) for k in pred.hidden_comm)})")
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
