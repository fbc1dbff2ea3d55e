"""Validation results as tables and sentences: report.md's and report.html's section, the terminal's table."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Sequence

from orchestrator.validation.jobs import ValidationResult
from predictor.models.intervals import Interval
from predictor.plan import Plan


def winner_note(results: Sequence[ValidationResult]) -> str:
    """A sentence when the measured fastest plan is not the predicted fastest, by more than the measurement's noise
    (the spread of its steps; '' otherwise)."""
    ok = [r for r in results if r.status == "ok" and r.predicted_time_s is not None]
    if len(ok) < 2:
        return ""
    predicted = min(ok, key=lambda r: r.predicted_time_s)  # type: ignore[arg-type, return-value]
    measured = min(ok, key=lambda r: r.measured_time_s)  # type: ignore[arg-type, return-value]
    if predicted is measured:
        return ""
    # A gap inside the steps' spread is noise: the measured winner's slowest step must beat the predicted best's
    # fastest one.
    slowest = measured.measured_time_max_s or measured.measured_time_s
    fastest = predicted.measured_time_min_s or predicted.measured_time_s
    if slowest >= fastest:  # type: ignore[operator]
        return ""
    return (f"measured winner differs from the predicted one: {measured.plan} ran in {measured.measured_time_s:.4g} s "
            f"(predicted {measured.predicted_time_s:.4g} s) while predicted-best {predicted.plan} ran in "
            f"{predicted.measured_time_s:.4g} s (predicted {predicted.predicted_time_s:.4g} s)")


def interval_note(results: Sequence[ValidationResult], interval: Interval | None) -> str:
    """A sentence naming the runs whose measured time lies outside the predictor's interval for the spec's own
    (framework, device) (the report's, from `predictor.models.registry.measured_accuracy`), with each one's residual
    measured / predicted - 1 against the prediction for the run as it ran; '' when all lie inside or none was
    measured. A CPU run is judged by the CPU predictor's interval, never by another device's or framework's."""
    ok = [r for r in results if r.status == "ok" and r.measured_time_s and r.compared_time_s is not None]
    outside = [r for r in ok if interval is not None
               and not interval.contains(r.measured_time_s, r.compared_time_s)]  # type: ignore[arg-type]
    if interval is None or not outside:
        return ""
    runs = ", ".join(f"{short_plan(r.plan)} {r.measured_time_s / r.compared_time_s - 1:+.1%}"  # type: ignore[operator]
                     for r in outside)
    return (f"{len(outside)} of {len(ok)} measured times lie outside the predictor's {interval.coverage:.0%} interval "
            f"({interval.low:+.1%} to {interval.high:+.1%} of a prediction; {interval.basis}): {runs}")


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def short_plan(text: str) -> str:
    """dp/tp/pp and the fields that differ from their defaults: what a table has room for."""
    plan, default = Plan.parse(text), Plan()
    return ",".join(f"{f.name}={str(getattr(plan, f.name)).lower()}" for f in fields(plan)
                    if f.name in ("dp", "tp", "pp") or getattr(plan, f.name) != getattr(default, f.name))


def validation_rows(section: dict[str, Any]) -> list[list[str]]:
    """Table rows: plan, predicted s, measured s, time error, predicted GiB, measured GiB, status."""
    rows = []
    for p in section["plans"]:
        status = p["status"] if p["status"] == "ok" else f"{p['status']}: {p['detail'].splitlines()[0][:80] if p['detail'] else ''}"
        error = "-" if p["time_error"] is None else f"{100 * p['time_error']:+.1f}%"
        predicted = _fmt(p["predicted_time_s"], ".4g")
        sharing = p.get("core_sharing", 1.0)
        if sharing > 1 and p["predicted_time_s"] is not None:  # the prediction for the run as it ran
            predicted += f" x{sharing:.3g} = {p['compared_time_s']:.4g}"
        rows.append([short_plan(p["plan"]), predicted, _fmt(p["measured_time_s"], ".4g"), error,
                     _fmt(p["predicted_memory_gib"], ".3g"), _fmt(p["measured_memory_gib"], ".3g"), status])
    return rows


VALIDATION_HEADER = ["plan", "predicted s", "measured s", "time error", "predicted GiB", "measured GiB", "status"]


def validation_intro(section: dict[str, Any]) -> str:
    """The sentence that opens a validation section (report.md and report.html)."""
    text = (f"The {section['k']} best plans, {section['warmup']} warm-up + {section['steps']} measured steps each "
            "(measured memory: the largest rank's training memory).")
    sharing = max((p.get("core_sharing", 1.0) for p in section["plans"]), default=1.0)
    if sharing > 1:
        text += (f" Ranks shared CPU cores (up to {sharing:.3g} rank threads per core): the prediction prices a core "
                 "per rank, so such a run is compared with the prediction times its ranks per core (x R/C).")
    return text


def print_validation(section: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"measured by real runs (top {section['k']})")
    for h in VALIDATION_HEADER:
        table.add_column(h, justify="left" if h in ("plan", "status") else "right")
    for row in validation_rows(section):
        table.add_row(*row)
    console.print(table)
    if section["note"]:
        console.print(f"note: {section['note']}")
