"""The terminal view: the top plans in a table that fits 80 columns (piped output included), why the winner wins
or what would make the closest plans fit, the Pareto front, and the validation."""

from __future__ import annotations

from typing import Any

from orchestrator.report.document import front_line, lever_line, pareto_intro, wider_line
from orchestrator.report.model import Report
from orchestrator.report.text import compact, or_dash


def _columns(report: Report) -> list[tuple[str, Any]]:
    """(header, cell of a RankedPlan) of the columns that say something for this report: sizes only when several
    were searched, the interval when measured, costs with a price, days with the run's tokens."""
    goal, price = report.ranking.goal, report.ranking.price_per_gpu_hour
    cols: list[tuple[str, Any]] = [("#", lambda r: str(r.rank) + ("=" if r.indistinguishable else "")),
                                   ("plan", lambda r: compact(r.plan))]
    if len(report.sizes) > 1:
        cols.append(("nodes", lambda r: str(r.costs.nodes)))
    cols.append(("iter s", lambda r: f"{r.iter_time_s:.3f}"))
    if report.interval is not None:
        cols.append((f"{report.interval.coverage * 100:.0f} % s", lambda r: f"{r.interval_s[0]:.2f}-{r.interval_s[1]:.2f}"))
    cols += [("GiB", lambda r: f"{r.peak_memory_gib:.1f}"), ("MFU %", lambda r: f"{r.prediction.mfu * 100:.1f}")]
    if price is not None:
        cols.append(("$/iter", lambda r: or_dash(r.costs.cost_usd_per_iteration, ".2f")))
    if goal.train_tokens:
        cols.append(("days", lambda r: or_dash(r.costs.days_to_train, ".1f")))
        if price is not None:
            cols.append(("$ train", lambda r: or_dash(r.costs.cost_usd_to_train, ",.0f")))
    return cols


def print_report(report: Report, console: Any = None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    if report.fits:
        title = (f"Top {len(report.shown)} of {report.ranked_total} feasible plans "
                 f"({report.search['evaluated_plans']} evaluated, ranked by {report.ranking.by})")
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
        cols = _columns(report)
        for header, _ in cols:
            table.add_column(header, justify="left" if header == "plan" else "right",
                             overflow="fold", no_wrap=header != "plan")
        for r in report.shown:
            table.add_row(*(cell(r) for _, cell in cols))
        console.print(table)
    else:
        console.print(f"[bold]No plan fits in {report.device.memory_limit_gib:.1f} GiB per GPU[/] "
                      f"({report.infeasible_total} evaluated). The closest, and what would make each fit:")
        for c in report.closest:
            console.print(f"  {lever_line(c, report.ranking.price_per_gpu_hour)}", markup=False)
    console.print(report.explanation, markup=False)
    if report.wider:
        console.print(wider_line(report), style="bold yellow", markup=False)
    if report.fits and (len(report.sizes) > 1 or report.ranking.goal.train_tokens):
        console.print(pareto_intro(report), markup=False)
        for r in report.pareto[:10]:
            console.print(f"  {front_line(r)}", markup=False)
    if report.caution:
        console.print(report.caution, style="bold yellow", markup=False)
    if report.validation:
        from orchestrator.validation.report_section import print_validation

        print_validation(report.validation, console)
