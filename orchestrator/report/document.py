"""The report's sections as data, written once for report.md and report.html: paragraphs in inline Markdown
(`code`, **bold**), bullet lists, tables and code blocks. Each renderer writes the same sections, so the two files
never drift apart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from orchestrator.report.model import ClosePlan, FrontPlan, RankedPlan, Report
from orchestrator.report.text import accuracy_text, compact, or_dash, train_text


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]
    plans: bool = False  # the ranked plans' table (report.html makes it sortable and filterable)


@dataclass(frozen=True)
class Code:
    """A code block and what it is (a launch file)."""

    caption: str
    text: str


@dataclass(frozen=True)
class Bullets:
    items: list[str]


Block = Union[str, Table, Code, Bullets]


@dataclass(frozen=True)
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)
    key: str = ""  # which section (report.html places its figures after "front")


PLAN_HEADER = ["#", "plan", "nodes", "iter s", "80 % range s", "tokens/s", "peak GiB", "MFU %", "$/iter", "days",
               "$ to train"]


def plan_row(r: RankedPlan) -> list[str]:
    c = r.costs
    return [str(r.rank) + ("=" if r.indistinguishable else ""), str(r.plan), str(c.nodes), f"{r.iter_time_s:.3f}",
            f"{r.interval_s[0]:.2f}-{r.interval_s[1]:.2f}" if r.interval_s else "-", f"{c.tokens_per_s:,.0f}",
            f"{r.peak_memory_gib:.1f}", f"{r.prediction.mfu * 100:.1f}", or_dash(c.cost_usd_per_iteration, ".2f"),
            or_dash(c.days_to_train, ".1f"), or_dash(c.cost_usd_to_train, ",.0f")]


def summary(report: Report) -> list[str]:
    """The two sentences under the title: the hardware and predictor, then the space and the search."""
    s, sp, dev = report.search, report.space, report.device
    over = f", {report.over_goal_total} miss the deadline or budget." if report.over_goal_total else "."
    return [f"Device {dev.name} ({dev.capacity_gib:.0f} GiB, limit {dev.memory_limit_gib:.1f} GiB), "
            f"{'/'.join(str(z.nodes) for z in report.sizes)}x{report.spec.cluster.gpus_per_node} GPUs; "
            f"predictor {report.predictor['name']} ({accuracy_text(report.predictor.get('accuracy'))}).",
            f"Space {sp.name}: {sp.candidates} candidates, {sp.valid} valid; searcher {s['searcher']} "
            f"evaluated {s['evaluated_plans']} plans in {s['trials']} {'trials' if s.get('tune', True) else 'batches'} "
            f"({s['trials_failed']} failed), "
            f"{s['search_s']} s, {s['plans_per_s']} plans/s; {report.ranked_total} fit in memory, "
            f"{report.infeasible_total} do not" + over]


def pareto_intro(report: Report) -> str:
    """What the front is, over which sizes, and what its ends are."""
    sizes = ", ".join(str(z.nodes) for z in report.sizes)
    n = len(report.pareto)
    tokens = "" if report.ranking.goal.train_tokens else " Give --train-tokens (and a price) for days and dollars."
    return (f"Over {sizes} nodes, {n} plan{'s are' if n != 1 else ' is'} beaten by no other on both time to train and "
            f"cost (GPU-hours){'; the fastest first' if n > 1 else ''}." + tokens)


def front_line(r: FrontPlan) -> str:
    """One Pareto plan in words."""
    return (f"{r.costs.nodes} nodes ({r.costs.gpus} GPUs): `{r.plan}`, {r.iter_time_s:.3f} s/iteration, "
            f"{r.gpu_hours_per_iteration:.2f} GPU-h/iteration{train_text(r.costs.days_to_train, r.costs.cost_usd_to_train)}")


def lever_line(c: ClosePlan, price: float | None) -> str:
    """What would make one plan that does not fit fit, in words (the levers that fit, else the one that comes
    closest)."""
    head = f"`{compact(c.plan)}` needs {c.peak_memory_gib:.1f} GiB ({c.overflow_gib:.1f} GiB over the limit)"
    if not c.levers:
        return head + "."
    fitting = [lv for lv in c.levers if lv.fits][:3]
    if not fitting:
        best = c.levers[0]
        return head + f"; no single change makes it fit (closest: {best.name}, {best.peak_memory_gib:.1f} GiB)."

    def cost(lv) -> str:  # noqa: ANN001 - a Lever
        usd = f", ${price * lv.gpu_hours_per_iteration:,.2f}/iteration" if price is not None else ""
        return (f"{lv.name}: {lv.peak_memory_gib:.1f} GiB, {lv.iter_time_s:.3f} s/iteration "
                f"({lv.iter_time_s / c.iter_time_s - 1:+.0%}), {lv.gpu_hours_per_iteration:.2f} GPU-h/iteration{usd}")

    return head + "; it fits with " + "; or ".join(cost(lv) for lv in fitting) + "."


def wider_line(report: Report) -> str:
    """Which wider space holds a better plan than the winner (or one that fits where none does), in words."""
    w = report.wider
    assert w is not None
    found = (f"`{w.plan}`: {w.iter_time_s:.3f} s/iteration, {w.peak_memory_gib:.1f} GiB")
    if report.ranked:
        winner = report.ranked[0]
        found += f", {1 - w.iter_time_s / winner.iter_time_s:.0%} faster than this space's winner"
        if report.ranking.by != "time":
            found += f" ({w.iter_time_s * w.plan.gpus / (winner.iter_time_s * winner.plan.gpus) - 1:+.0%} GPU-hours)"
    else:
        found += ", which fits"
    return (f"The {w.space} space holds better plans than the {report.space.name} space searched: among "
            f"{w.sampled:,} of its plans sampled, {found}. Search it with `--space {w.space}`.")


def sections(report: Report, plan_rows: int | None = None) -> list[Section]:
    """Every section of the report, in order. `plan_rows`: ranked plans in the plans table (default `--top-k`)."""
    out = [Section("", list(summary(report)), "summary")]
    if report.fits:
        rows = [plan_row(r) for r in report.ranked[: plan_rows or report.top_k]]
        best: list[Block] = [Table(PLAN_HEADER, rows, plans=True)]
        if report.caution:
            best.append(f"**{report.caution}**")
        out.append(Section("Best plans", best, "best"))
    else:
        out.append(Section("Nothing fits: the plans closest to fitting", [
            f"No plan fits in {report.device.memory_limit_gib:.1f} GiB per GPU. The plans that overflow it least, "
            "and the single changes that would make each fit (each re-predicted):",
            Bullets([lever_line(c, report.ranking.price_per_gpu_hour) for c in report.closest])], "closest"))
    out.append(Section("Why the winner wins" if report.fits else "Why nothing fits", [report.explanation], "why"))
    if report.wider:
        out.append(Section("A wider space finds better plans", [wider_line(report)], "wider"))
    if report.pareto:
        out.append(Section("Time against cost (Pareto front)",
                           [pareto_intro(report), Bullets([front_line(r) for r in report.pareto])], "front"))
    if report.validation:
        # lazy: --validate
        from orchestrator.validation.report_section import VALIDATION_HEADER, validation_intro, validation_rows

        v = report.validation
        out.append(Section("Measured by real runs", [validation_intro(v), Table(VALIDATION_HEADER, validation_rows(v))]
                           + ([f"Note: {v['note']}."] if v["note"] else []), "validation"))
    if report.launch:
        launch = report.launch
        blocks: list[Block] = [Code(f"`launch/{name}` ({launch.framework}):", text) for name, text in launch.files.items()]
        if launch.notes:
            blocks.append(Bullets([f"note: {n}" for n in launch.notes]))
        out.append(Section("Launch settings", blocks, "launch"))
    if report.infeasible:
        out.append(Section("Fastest plans that do not fit",
                           [Bullets([f"`{r.plan}`: {r.reason}" for r in report.infeasible[:10]])], "infeasible"))
    if report.failed:
        out.append(Section("Plans whose prediction failed",
                           [Bullets([f"`{plan}`: {error}" for plan, error in report.failed[:10]])], "failed"))
    if report.space.top_rejections:
        out.append(Section("Why candidates were rejected",
                           [Bullets([f"{n} candidates: {reason}" for reason, n in report.space.top_rejections]
                                    + [f"{n} candidates not searched: {reason}" for reason, n in report.space.pruned.items()])],
                           "rejected"))
    return out
