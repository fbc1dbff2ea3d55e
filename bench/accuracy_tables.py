"""Write bench/results/log.md, the record of every benchmark run, from the results files in bench/results/; and
read the headline figures of the long runs out of them for docs/accuracy.md (`headline`, used by bench.accuracy).

    python -m bench.accuracy_tables           # rewrite bench/results/log.md
    python -m bench.accuracy_tables --check   # exit 1 if bench/results/log.md differs from what the results give

Each results file is a log: a rerun of a benchmark adds a section (separated by a `# ====` or
`# ----` line) holding the command, the date, the tables the benchmark printed and notes, and the
older sections stay below as the record. Tables are the lines that do not start with `#`; the
comment lines around a table are its provenance. This script copies tables and their comment lines
verbatim and reads the headline cells out of the copied tables, so no figure in the log or in docs/accuracy.md
is typed by hand: a figure that is wrong there is wrong in the results file.

Which table of a file is shown is a rule in `FILES` below (a pattern the table or its section must
contain), not a line number: sections are not in date order inside a file (a later session may
prepend, or append a numbered step), so "the first table" is not always the current one. A rule
that matches nothing is an error, so a results file that changes shape stops the script instead of
silently showing the wrong table. A results file with no rule gets its first table.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bench import common
from bench.common import RESULTS, ROOT

OUT = RESULTS / "log.md"
FROM_DOCS = "../bench/results/"  # how docs/accuracy.md links a results file; the log sits beside them
ANALYTICAL_ACCURACY = ROOT / "predictor" / "checkpoints" / "analytical-accuracy.json"

SEPARATOR = re.compile(r"^# ?[=-]{20,}\s*$")
DATE = re.compile(r"\b(\d{1,2} (?:Nov|Dec) 20\d\d|20\d\d-\d\d-\d\d)\b")
# A command line of the record: `# [command: ][nice -n 5 ]<command>  [(when, how long)]  [# remark]`.
COMMAND = re.compile(r"^#\s*(?:command:\s*)?(?:nice -n \d+ )?((?:\.venv/bin/)?(?:python bench/\S+\.py|scaledl \w+).*)$")
MACHINE = re.compile(r"AMD EPYC|Intel\(R\) Xeon\(R\)|Intel Xeon")
# Lines a benchmark prints about where it wrote files: not results, and they name private scratch paths.
NOISE = re.compile(r"^wrote ")


# ---------------------------------------------------------------- parsing


@dataclass
class Block:
    """One table: consecutive non-comment lines of a results file (internal blank lines kept)."""

    file: str
    start: int  # 1-based line number of its first line
    lines: list[str]
    before: list[tuple[int, str]]  # comment lines since the previous table of its section
    after: list[tuple[int, str]]  # comment lines up to the next table or the section's end
    section: "Section"

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def end(self) -> int:
        return self.start + len(self.lines) - 1

    def date(self) -> str:
        """The date nearest above the table in its section, else the section's first date."""
        for _, line in reversed(self.before):
            if found := DATE.search(line):
                return found.group(1)
        return self.section.date()

    def command(self) -> str:
        """The benchmark command nearest above the table in its section ('' if the record gives none)."""
        for _, line in reversed(self.section.comments_before(self.start)):
            if found := COMMAND.match(line):
                command = re.split(r"\s{2,}#|\s+\(", found.group(1))[0]
                return command.strip()
        return ""

    def machine(self) -> str:
        """The machine the section's notes above the table name first ('' when they name none; the first
        mention, as a later line may name another machine for comparison)."""
        for _, line in self.section.comments_before(self.start):
            if found := MACHINE.search(line):
                return "AMD EPYC" if found.group(0) == "AMD EPYC" else "Intel Xeon"
        return ""


@dataclass
class Section:
    file: str
    start: int
    lines: list[tuple[int, str]]  # (line number, text) of every line between two separators
    blocks: list[Block] = field(default_factory=list)

    def comments(self) -> list[tuple[int, str]]:
        return [(n, t) for n, t in self.lines if t.startswith("#")]

    def comments_before(self, line_no: int) -> list[tuple[int, str]]:
        return [(n, t) for n, t in self.comments() if n < line_no]

    def title(self) -> str:
        """The section's opening words: its first comment lines joined (the record wraps its sentences)."""
        words = []
        for _, text in self.comments():
            line = text.lstrip("# ").strip()
            if not line and words:
                break
            words.append(line)
            if len(" ".join(words)) > 160:
                break
        return " ".join(w for w in words if w)

    def date(self) -> str:
        for _, line in self.comments():
            if found := DATE.search(line):
                return found.group(1)
        return ""


def parse(path: Path) -> list[Section]:
    """A results file as sections, each with its tables and their comment lines."""
    sections: list[Section] = []
    current: list[tuple[int, str]] = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        if SEPARATOR.match(raw):
            if current:
                sections.append(Section(path.name, current[0][0], current))
            current = []
        else:
            current.append((number, raw.rstrip()))
    if current:
        sections.append(Section(path.name, current[0][0], current))
    for section in sections:
        _split_blocks(section)
    return [s for s in sections if s.blocks or s.comments()]


def _split_blocks(section: Section) -> None:
    pending: list[tuple[int, str]] = []  # comment lines not yet attached before a table
    table: list[tuple[int, str]] = []

    def close() -> None:
        rows = [(n, t) for n, t in table if not NOISE.match(t)]
        while rows and not rows[-1][1].strip():
            rows.pop()
        while rows and not rows[0][1].strip():
            rows.pop(0)
        if rows:
            block = Block(section.file, rows[0][0], [t for _, t in rows], list(pending), [], section)
            if section.blocks:
                section.blocks[-1].after = list(pending)
            section.blocks.append(block)
            pending.clear()
        table.clear()

    for number, text in section.lines:
        if text.startswith("#"):
            if table:
                close()
            pending.append((number, text))
        elif text.strip() or table:
            table.append((number, text))
    if table:
        close()
    if section.blocks:
        section.blocks[-1].after = list(pending)


def cells(line: str) -> list[str]:
    """A table row's cells: the columns are separated by two or more spaces."""
    return [c.strip() for c in re.split(r"\s{2,}", line.strip()) if c.strip()]


def overall_rows(block: Block) -> dict[str, dict[str, str]]:
    """{protocol: {column: cell}} of the 'Overall' rows of a paper-protocol table.

    A table holds one protocol per title line ('In-domain (...' / 'Out-of-domain (...') or several
    under subheading lines ('in-domain', 'out of domain'), each with a 'model' header line."""
    found: dict[str, dict[str, str]] = {}
    protocol, header = "", []
    for line in block.lines:
        low = line.strip().lower()
        if low.startswith(("in-domain (", "in-domain")) and "average" not in low:
            protocol = "in-domain"
        elif low.startswith(("out-of-domain (", "out of domain")) and "average" not in low:
            protocol = "out of domain"
        elif "average" in low:
            protocol = ""
        row = cells(line)
        if row and row[0] == "model":
            header = row[1:]
        elif row and row[0] == "Overall" and protocol and header:
            found[protocol] = dict(zip(header, row[1:]))
    return found


def average_rows(block: Block) -> dict[str, dict[str, dict[str, str]]]:
    """{protocol: {method: {column: cell}}} of the 'average over models' tables (which carry memory MRE)."""
    found: dict[str, dict[str, dict[str, str]]] = {}
    protocol, header = "", []
    for line in block.lines:
        low = line.strip().lower()
        if "average over" in low:
            protocol = "in-domain" if low.startswith("in-domain") else "out of domain"
            header = []
            continue
        row = cells(line)
        if not protocol or not row:
            continue
        if row[0] == "method":
            header = row[1:]
        elif header and not low.startswith(("in-domain", "out-of-domain", "model", "cells:")):
            found.setdefault(protocol, {})[row[0]] = dict(zip(header, row[1:]))
        else:
            protocol = ""
    return found


# ---------------------------------------------------------------- selection


class RuleError(LookupError):
    pass


def find(sections: list[Section], block_has: str = "", after: str = "") -> Block:
    """The first table (in file order) whose text matches `block_has`; with `after`, only the tables below
    the first comment line matching it in the same section (a numbered step of a section, say)."""
    for section in sections:
        start = 0
        if after:
            marks = [n for n, t in section.comments() if re.search(after, t)]
            if not marks:
                continue
            start = marks[0]
        for block in section.blocks:
            if block.start > start and (not block_has or re.search(block_has, block.text, re.M)):
                return block
    raise RuleError(f"no table matching {block_has!r}" + (f" below a comment matching {after!r}" if after else ""))


def first(sections: list[Section]) -> Block:
    return find(sections)


@dataclass
class Shown:
    label: str
    pick: Callable[[list[Section]], Block]


@dataclass
class ResultsFile:
    name: str
    title: str
    about: str  # what the benchmark measures (prose, no figures: the figures come from the file)
    shown: list[Shown]


FILES: list[ResultsFile] = [
    ResultsFile(
        "accuracy.txt", "Every table, one command",
        "`bench/accuracy.py` predicts every table of measurements in one run (vTrain, Megatron-Bridge 25.11 "
        "in-file and leave-one-system-out, SimuMax B200, the CPU checkpoint's held-out configurations) and "
        "compares each MAPE with the figure recorded in [accuracy.json](accuracy.json). The file holds its "
        "latest run.",
        [Shown("Latest run", first)]),
    ResultsFile(
        "paper_table.txt", "CPU dataset, the paper's protocols",
        "`bench/paper_table.py` trains and scores every method on the shipped CPU profile dataset "
        "(`predictor/data/cpu`) with the ScaleDL paper's protocols: in-domain, a seeded split of each "
        "architecture's D-optimal configurations (160 train / 40 test); out of domain, one architecture "
        "left out of training. Cells are MRE % / RMSE ms of the iteration time; *Overall* pools every "
        "test sample. The baselines (rf, mlp-acc, birnn) do not use ScaleDL's composition, so changes to "
        "it leave their rows as recorded; the analytical model's rows are from its last change.",
        [Shown("ScaleDL, the routed default", lambda s: find(s, r"routed \(default\)")),
         Shown("ScaleDL and its ablations", lambda s: find(s, r"scaledl-plainsum.*scaledl-nocomm|routed \(full\)")),
         Shown("Baselines, in-domain", lambda s: find(s, r"^In-domain \(per model.*\n.*\brf\b.*\bbirnn\b", "The pinned profile alone")),
         Shown("Baselines, out of domain", lambda s: find(s, r"^Out-of-domain \(leave.*\n.*\brf\b.*\bbirnn\b", "The pinned profile alone")),
         Shown("The analytical model, in-domain", lambda s: find(s, r"^In-domain \(per model.*\n.*\banalytical\b", r"^# 2\. Per-op links")),
         Shown("The analytical model, out of domain", lambda s: find(s, r"^Out-of-domain \(leave.*\n.*\banalytical\b", r"^# 2\. Per-op links")),
         Shown("Every method over three split seeds", lambda s: find(s, r"^protocol method[\s\S]*\bbirnn\b[\s\S]*\brf\b"))]),
    ResultsFile(
        "h200_table.txt", "H200 dataset (single GPU), the paper's protocols",
        "`scaledl evaluate --data predictor/data/h200`: the same protocols on 197 single-GPU bf16 "
        "configurations measured on one H200 (`predictor/data/h200/README.md`). The in-domain splits "
        "are small (tens of rows per model).",
        [Shown("Latest run", first)]),
    ResultsFile(
        "a100_eval.txt", "A100: trained on vTrain's single-node runs, scored on its multi-node runs",
        "`bench/a100_eval.py` chooses ScaleDL's settings by cross-validation on vTrain's single-node "
        "Megatron-DeepSpeed A100 measurements, trains the chosen model, and scores it once on vTrain's "
        "multi-node file (64-512 GPUs), which nothing is fitted on. Spearman is the rank correlation "
        "within a model's plans; regret is the measured time of the predicted-best plan over the "
        "measured best, less one.",
        [Shown("Latest run", first)]),
    ResultsFile(
        "validate_plans.txt", "Real runs of predicted plans",
        "`bench/validate_plans.py` runs eight small-model plans (dp, tp, pp, FSDP) for real on a local "
        "two-node Ray cluster, twice each, through the same code as `scaledl plan --validate`, and "
        "compares the predicted iteration time with the mean measured one. Rounds whose notes name no "
        "machine ran on the Intel Xeon the CPU dataset was measured on.",
        [Shown("Latest round", first)]),
    ResultsFile(
        "transfer.txt", "The CPU checkpoint on another CPU model",
        "`bench/transfer.py` scores the shipped CPU checkpoint (trained on an Intel Xeon's data) on "
        "held-out runs of an AMD EPYC (`predictor/data/cpu-amd-epyc`), unadapted and fine-tuned on k "
        "of that machine's runs, as `scaledl adapt` does.",
        [Shown("Latest run", first)]),
    ResultsFile(
        "data_cost.txt", "Training-data cost",
        "`bench/data_cost.py`: test MRE of ScaleDL trained on k BERT configurations chosen by "
        "D-optimal design or at random, against the whole pool. The plot of the latest run is "
        "[data_cost.png](../bench/results/data_cost.png).",
        [Shown("Latest run", first)]),
    ResultsFile(
        "memory_cv.txt", "Peak-memory residual",
        "`bench/memory_cv.py`: nested leave-one-architecture-out cross-validation, inside each "
        "out-of-domain training set, of the learned peak-memory correction.",
        [Shown("Latest run", first)]),
    ResultsFile(
        "checkpoint_cv.txt", "Ensemble size on the checkpoint's training split",
        "`bench/checkpoint_cv.py`: two-fold cross-validation inside the shipped checkpoint's training split.",
        [Shown("Latest run", first)]),
    ResultsFile(
        "cpu_collective_cost.txt", "A collective's cost inside a CPU step",
        "`bench/cpu_collective_cost.py`: what a gloo all-reduce, a send/recv and a DTensor-sharded "
        "linear cost between computing ranks, against the same call at rest (the α-β link).",
        [Shown("Latest run", first)]),
    ResultsFile(
        "interval_coverage.txt", "Coverage of the 80 % prediction intervals",
        "`bench/interval_coverage.py`: the analytical model's intervals (10th-90th percentile of measured / "
        "predicted - 1) placed from one part of the public runs, coverage counted on the other.",
        [Shown("Latest run", first)]),
    ResultsFile(
        "predict_speed.txt", "Prediction rate",
        "`bench/predict_speed.py`: plans predicted per second on the GPT-3 175B graph: every valid plan of the "
        "`full` space in calls of 5,000, first seen (cold) and again (warm).",
        [Shown("Latest run", first)]),
    ResultsFile(
        "plan_speed.txt", "End-to-end `scaledl plan` time",
        "`bench/plan_speed.py`: the `make plan` example timed end to end, Ray start included, and "
        "checked against exhaustive enumeration without Ray.",
        [Shown("Latest run", first)]),
    ResultsFile(
        "ensemble_cv.txt", "Cross-validation that chose the learned predictor's settings",
        "`bench/ensemble_cv.py` compares settings of ScaleDL by cross-validation inside the training "
        "splits only (in-domain: 4 folds; out of domain: nested leave-one-architecture-out), each "
        "decision under a rule written before its results. The sections below are the decisions, "
        "newest first; the file holds their tables.",
        []),
]


# ---------------------------------------------------------------- rendering


def link(name: str, line: int | None = None, base: str = "") -> str:
    target = f"{base}{name}" + (f"#L{line}" if line else "")
    return f"[{name}{f':{line}' if line else ''}]({target})"


def fence(lines: list[str]) -> list[str]:
    return ["```text", *lines, "```"]


def strip_comment(text: str) -> str:
    return re.sub(r"^# ?", "", text)


def render_block(block: Block, label: str, shown_lines: set[int]) -> list[str]:
    notes_before = [strip_comment(t) for n, t in block.before if n not in shown_lines and strip_comment(t).strip()]
    # The notes above a table hold its commands; where they were shown with the previous table, name the
    # command here.
    command = "" if notes_before or not block.command() else f"; command: `{block.command()}`"
    out = [f"#### {label}", "",
           f"Recorded {block.date() or '(no date in the record)'}; {link(block.file, block.start)}{command}.", ""]
    if notes_before:
        out += ["The record's notes above the table:", "", *fence(notes_before), ""]
    out += fence(block.lines) + [""]
    notes_after = [strip_comment(t) for n, t in block.after if n not in shown_lines and strip_comment(t).strip()]
    if notes_after:
        out += ["The record's lines below the table, up to the next table:", "", *fence(notes_after), ""]
    shown_lines.update(n for n, _ in block.before + block.after)
    return out


def summary(parsed: dict[str, list[Section]], picks: dict[tuple[str, str], Block],
            analytical_accuracy: Path = ANALYTICAL_ACCURACY) -> list[str]:
    """Headline figures read out of the selected tables, linked from docs/."""
    out = ["Read out of the results files' tables (each row names its table; the log shows them with their notes). "
           "MRE % / RMSE ms of the iteration time unless marked.", ""]
    paper = "paper_table.txt"
    routed = picks.get((paper, "ScaleDL, the routed default"))
    rows = []
    if routed:
        cells_of = overall_rows(routed)
        column = next(iter(cells_of.get("in-domain", {})), "")
        rows.append((f"ScaleDL, {column}", cells_of.get("in-domain", {}).get(column, ""),
                     cells_of.get("out of domain", {}).get(column, ""), routed, routed))
    id_base = picks.get((paper, "Baselines, in-domain"))
    ood_base = picks.get((paper, "Baselines, out of domain"))
    if id_base and ood_base:
        idc, oodc = overall_rows(id_base).get("in-domain", {}), overall_rows(ood_base).get("out of domain", {})
        for method in idc:
            if method.startswith("scaledl") or method == "analytical":
                continue  # ScaleDL's rows are the routed default's; the analytical model's have their own run
            rows.append((method, idc[method], oodc.get(method, ""), id_base, ood_base))
    id_ana = picks.get((paper, "The analytical model, in-domain"))
    ood_ana = picks.get((paper, "The analytical model, out of domain"))
    if id_ana and ood_ana:
        rows.append(("analytical", overall_rows(id_ana).get("in-domain", {}).get("analytical", ""),
                     overall_rows(ood_ana).get("out of domain", {}).get("analytical", ""), id_ana, ood_ana))
    if rows:
        out += ["**CPU dataset, paper protocols** (seed 0, pooled):", "",
                "| method | in-domain | out of domain | recorded | tables |", "|---|---|---|---|---|"]
        for method, i, o, bi, bo in rows:
            where = link(bi.file, bi.start, FROM_DOCS) if bi is bo else f"{link(bi.file, bi.start, FROM_DOCS)}, {link(bo.file, bo.start, FROM_DOCS)}"
            out.append(f"| {method} | {i} | {o} | {bi.date()} | {where} |")
        out.append("")
    memory = _memory_note(routed) if routed else None
    memory = memory or _newest_memory(parsed.get(paper, []))
    if memory:
        block, figures = memory
        out += [f"ScaleDL's peak-memory MRE on the CPU dataset: {figures.get('in-domain', '?')} % in-domain, "
                f"{figures.get('out of domain', '?')} % out of domain ({link(block.file, block.start, FROM_DOCS)}, "
                f"recorded {block.date()}).", ""]

    h200 = picks.get(("h200_table.txt", "Latest run"))
    if h200:
        overall = overall_rows(h200)
        methods = list(overall.get("in-domain", {}))
        out += ["**H200 dataset, paper protocols** (pooled):", "",
                "| method | in-domain | out of domain |", "|---|---|---|"]
        out += [f"| {m} | {overall['in-domain'].get(m, '')} | {overall.get('out of domain', {}).get(m, '')} |"
                for m in methods]
        mem = average_rows(h200)
        if "scaledl" in mem.get("in-domain", {}):
            out += ["", f"ScaleDL's peak-memory MRE: {mem['in-domain']['scaledl'].get('mem MRE %', '?')} % in-domain, "
                        f"{mem.get('out of domain', {}).get('scaledl', {}).get('mem MRE %', '?')} % out of domain."]
        out += ["", f"Recorded {h200.date()}, {link(h200.file, h200.start, FROM_DOCS)}.", ""]

    a100 = picks.get(("a100_eval.txt", "Latest run"))
    if a100:
        lines = [t for t in a100.lines if re.match(r"^(\S.*multi-node MAPE|reference:|chosen by)", t)]
        out += ["**A100, vTrain's multi-node runs** (MAPE; nothing is fitted on these runs):", "",
                *fence(lines), "", f"Recorded {a100.date()}, {link(a100.file, a100.start, FROM_DOCS)}.", ""]
    if analytical_accuracy.is_file():
        recorded = json.loads(analytical_accuracy.read_text())
        out += ["**The analytical model's recorded accuracy**, which `scaledl plan` reports show "
                "([predictor/checkpoints/analytical-accuracy.json](../predictor/checkpoints/analytical-accuracy.json), "
                "written by `python -m bench.vtrain_eval --record` and `python -m bench.modern_eval --record`, one record per device and framework):", "",
                "| device | MAPE % | rows | source | date |", "|---|---|---|---|---|"]
        out += [f"| {device} | {r.get('mape_pct')} | {r.get('rows')} | {r.get('source')} | {r.get('date')} |"
                for device, r in sorted(recorded.items())]
        out.append("")

    runs = [b for s in parsed.get("validate_plans.txt", []) for b in s.blocks]
    if runs:
        out += ["**Real runs** (`bench/validate_plans.py`, mean |error| of the predicted iteration time), "
                "every round recorded, newest first:", "",
                "| recorded | machine | predictor | mean \\|error\\| | table |", "|---|---|---|---|---|"]
        for block in runs:
            predictor = next((t.removeprefix("predictor:").split(";")[0].strip() for t in block.lines
                              if t.startswith("predictor:")), "")
            predictor = MACHINE_DIRS.sub("", predictor)  # a checkpoint by its file name, not one machine's path
            error = next((t.removeprefix("mean |error|").strip() for t in block.lines
                          if t.startswith("mean |error|")), "")
            out.append(f"| {block.date() or '—'} | {block.machine() or '—'} | {predictor} | {error} | "
                       f"{link(block.file, block.start, FROM_DOCS)} |")
        out.append("")
    return out


# The folders of an absolute path (a checkpoint's, in a results file): a document names the file only.
MACHINE_DIRS = re.compile(r"(?<![\w.])/(?:[\w.-]+/)+")
MEMORY_NOTE = re.compile(r"mem MRE: ([\d.]+) % in-domain.*?([\d.]+) % out of domain")


def _memory_note(block: Block) -> tuple[Block, dict[str, str]] | None:
    """ScaleDL's memory MRE as the notes of a table's run state it (`mem MRE: X % in-domain, Y % out of domain`)."""
    for _, line in block.before + block.after:
        if found := MEMORY_NOTE.search(line):
            return block, {"in-domain": found.group(1), "out of domain": found.group(2)}
    return None


def _newest_memory(sections: list[Section]) -> tuple[Block, dict[str, str]] | None:
    """ScaleDL's memory MRE from the first average tables that list it (memory does not depend on the
    correction networks, so the latest run of any ScaleDL variant that reports it holds the figure)."""
    figures: dict[str, str] = {}
    found: Block | None = None
    for section in sections:
        for block in section.blocks:
            for protocol, methods in average_rows(block).items():
                if "scaledl" in methods and protocol not in figures:
                    figures[protocol] = methods["scaledl"].get("mem MRE %", "")
                    found = found or block
            if len(figures) == 2:
                return found, figures
    return (found, figures) if found else None


def _parse(results: Path) -> tuple[list[ResultsFile], dict[str, list[Section]], dict[tuple[str, str], Block]]:
    """The results files (with their rules), each parsed, and the table each rule picks."""
    parsed = {p.name: parse(p) for p in sorted(results.glob("*.txt"))}
    known = {f.name for f in FILES}
    files = [f for f in FILES if f.name in parsed]
    files += [ResultsFile(name, name, "", [Shown("Latest table", first)]) for name in parsed if name not in known]
    picks: dict[tuple[str, str], Block] = {}
    for f in files:
        for shown in f.shown:
            try:
                picks[(f.name, shown.label)] = shown.pick(parsed[f.name])
            except RuleError as err:
                raise SystemExit(f"bench/accuracy_tables.py: {f.name}, '{shown.label}': {err}; "
                                 f"update its rule in FILES") from None
    return files, parsed, picks


def headline(results: Path = RESULTS, analytical_accuracy: Path = ANALYTICAL_ACCURACY) -> list[str]:
    """The long runs' headline figures, as docs/accuracy.md shows them."""
    _, parsed, picks = _parse(results)
    return summary(parsed, picks, analytical_accuracy)


def render(results: Path = RESULTS) -> str:
    files, parsed, picks = _parse(results)
    out = ["# The record of every benchmark run", "",
           "<!-- Generated by `python -m bench.accuracy_tables` from bench/results/*.txt. Do not edit: rerun it. -->",
           "",
           "A results file keeps every run of its benchmark with the command, the date, the notes and the decisions "
           "it informed; this page shows the current table of each with its notes and lists the earlier runs. "
           "The headline figures are in [docs/accuracy.md](../../docs/accuracy.md).", ""]
    out += ["## The results files", ""]
    out += [f"- [{f.title}](#{_anchor(f.title)}): {link(f.name)}" for f in files]
    out.append("")
    for f in files:
        sections = parsed[f.name]
        out += [f"### {f.title}", "", f"{f.about} Source: {link(f.name)}.".strip(), ""]
        shown_lines: set[int] = set()
        shown_blocks = []
        for shown in f.shown:
            block = picks[(f.name, shown.label)]
            out += render_block(block, shown.label, shown_lines)
            shown_blocks.append(block)
        earlier = [s for s in sections if not any(b.section is s for b in shown_blocks)]
        if earlier:
            heading = "The decisions" if not f.shown else "Earlier runs"
            out += [f"{heading}, in the file's order (newest first, except inside a section):", ""]
            out += [f"- {link(f.name, s.start)} ({s.date() or 'undated'}): {_short(s.title())}" for s in earlier]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _short(text: str, limit: int = 150) -> str:
    text = text.replace("|", "\\|")
    if len(text) <= limit:
        return text
    return text[: text.rfind(" ", 0, limit)] + " …"


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the log is not what the results give")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the results files")
    args = parser.parse_args(argv)
    text = render(args.results)
    if args.check:
        current = args.out.read_text() if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is stale: run python -m bench.accuracy_tables", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
