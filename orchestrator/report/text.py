"""Sentences and short forms every renderer shares: a plan in a few words, costs, accuracy, intervals, the front."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from predictor.costs.prediction import Prediction
from predictor.models.domain import advice
from predictor.models.intervals import Interval
from predictor.plan import Plan

# Short forms of option values in narrow tables.
_SHORT_VALUES = {"recompute": {"selective": "rc-sel", "full": "rc-full"}, "schedule": {"gpipe": "gpipe"}}


def compact(plan: Plan) -> str:
    """A plan in a few words for narrow tables, e.g. 'dp16 tp8 pp8 mbs4 z1 sp v6': every degree above 1 (dp, tp
    and pp always), the micro-batch, then only the options that differ from their defaults."""
    default, degrees = Plan(), plan.degrees()
    words = []
    for f in fields(plan):
        value = getattr(plan, f.name)
        if f.name in degrees:
            if value > 1 or f.name in ("dp", "tp", "pp"):
                words.append(f"{f.name}{value}")
        elif f.name == "mbs":
            words.append(f"mbs{value}")
        elif f.name == "schedule" or value == getattr(default, f.name):
            continue  # an interleaved schedule shows as its v
        elif f.name == "zero":
            words.append(f"z{value}")
        elif f.name == "sp":
            words.append("sp" if value else "no-sp")
        elif f.name == "v":
            words.append(f"v{value}")
        else:
            words.append(_SHORT_VALUES.get(f.name, {}).get(value, f"{f.name}={value}"))
    if plan.schedule == "gpipe":
        words.append("gpipe")
    return " ".join(words)


def or_dash(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def train_text(days: float | None, cost: float | None) -> str:
    """`, N days, $C` of a plan's days and cost to train, each left out where unknown."""
    return (f", {days:.1f} days" if days is not None else "") + (f", ${cost:,.0f}" if cost is not None else "")


def accuracy_text(accuracy: dict[str, Any] | None) -> str:
    """The predictor's measured accuracy in words, e.g. 'measured error 11.2% over 109 runs of ...'."""
    if not accuracy:
        return "accuracy never measured for this device: treat the times as estimates"
    if accuracy.get("measured") is False:
        return f"accuracy never measured for this framework on this device ({accuracy['source']})"
    return f"measured error {accuracy['mape_pct']:.1f}% over {accuracy['rows']} runs of {accuracy['source']}"


def interval_text(interval: Interval, indistinguishable: int) -> str:
    """What the intervals say about the top of the ranking, in words."""
    head = (f"The predictor's {interval.coverage * 100:.0f} % interval runs from {interval.low * 100:+.1f} % to "
            f"{interval.high * 100:+.1f} % of a prediction ({interval.basis}).")
    if not indistinguishable:
        return head + " No other plan's interval overlaps the winner's."
    return (head + f" The top {indistinguishable + 1} plans cannot be told apart: {indistinguishable} plans' intervals "
            "overlap the winner's; `--validate K` runs the first K of them for real.")


def caution(winner: Prediction | None) -> str:
    """A warning when the best plan (predicted `winner`) lies outside the learned predictor's training data ('' otherwise):
    its measured accuracy does not cover such predictions."""
    outside = winner.extra.get("outside_training") if winner is not None else None
    if not outside:
        return ""
    return ("Caution: the predictor was never trained on a workload or plan like the best one ("
            + "; ".join(outside) + f"); {advice(outside)}; validate it (--validate) before relying on it.")
