"""One accuracy harness over every table of measurements: one command, one table, checked against the record.

    flock /tmp/scaledl-heavy.lock .venv/bin/python -m bench.accuracy [--shared PATH] [--record]

Each row is one set of measurements, predicted by the model that prices it, and says what was fitted on it
(../shared/ground_truth/README.md says what each file may be used for; a figure of constants chosen on the same rows
is reported as in-file, next to its cross-validated one):

- vTrain A100, single-node (1,440 runs): in-file and leave-one-model-out (DeepSpeed's host constants on A100 chosen
  on the file's every row, and without the row's model), and multi-node (109 runs on 64-512 GPUs, evaluation only):
  the recorded constants, nothing fitted on it (`bench.vtrain_eval`);
- Megatron-Bridge 25.11 recipes, dense and MoE apart: in-file (the Megatron-Core constants chosen on every row of
  the file) and leave-one-system-out (chosen without the row's system) (`bench.modern_eval`);
- SimuMax B200 Llama 3 70B iteration time (12 BF16 runs of 4 plans, `bench.memory_eval.simumax_workload`; that script
  checks their memory): Megatron-Core's BF16 linear GEMM rate on Blackwell chosen on them (`bench.simumax_time`),
  in-file and leave-one-plan-out, every other constant as recorded from the Megatron-Bridge file;
- torchtitan's published runs (`bench.torchtitan_eval`, sources T1-T5 of its file): time, and peak memory where
  published, nothing fitted (no torchtitan constant acts as a mechanism would: that module's docstring);
- the CPU dataset: the shipped ScaleDL checkpoint on the configurations its training held out (20 % of each
  architecture, seed 0: the split its accuracy record names), without retraining. The paper's protocols, which
  retrain every method, are `bench.paper_table` (about 50 minutes).

Columns: rows predicted, MAPE and the largest absolute percentage error; where the table holds workloads (same
model, cluster and global batch) of at least three plans, the mean Spearman correlation of predicted and measured
time over those workloads and the mean regret of the predicted-best plan (its measured time / the measured best
- 1): a plan search is judged by its order, not only by its mean error.

Writes bench/results/accuracy.txt (this run's table, its commit and run time) and docs/accuracy.md (the recorded
figures and the long runs' headline figures, `bench.accuracy_tables.headline`). Exits 1 when a table's MAPE is more
than TOLERANCE points above the figure recorded in bench/results/accuracy.json, or a recorded table is missing;
`--record` writes this run's figures there instead: run it with the change that is meant to move them.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from bench import (accuracy_tables, common, interval_coverage, memory_eval, modern_eval, simumax_time, torchtitan_eval,
                   vtrain_eval)
from bench.common import RESULTS, ROOT
from predictor import evaluate as ev
from predictor.evaluate import BRIDGE_DEVICES
from predictor.graph_cache import graph_for
from predictor.hardware import GENERATIONS
from predictor.machine import cpu_model_name
from predictor.models.registry import checkpoint_path, load_predictor

TOLERANCE = 1.0  # MAPE points a table may lose against its recorded figure before the run fails
RECORD = RESULTS / "accuracy.json"
REPORT = RESULTS / "accuracy.txt"
DOC = ROOT / "docs" / "accuracy.md"
CPU_HOLDOUT, CPU_SEED = 0.2, 0  # `scaledl train --designs all --holdout 0.2 --seed 0`, as the shipped checkpoint was


@dataclass(frozen=True)
class Figures:
    """One table's figures (percentages; NaN where the table has no workload of several plans)."""

    table: str
    rows: int
    mape_pct: float
    max_pct: float
    workloads: int  # workloads of at least common.MIN_PLANS plans, which Spearman and regret are over
    spearman: float  # the mean over those workloads
    min_spearman: float
    regret_pct: float
    fitted: str  # what was fitted on these rows
    size_kind: str = ""  # what `by_size` groups by: "params" (model size) or "tokens per expert" (MoE)
    by_size: tuple[dict[str, object], ...] = ()  # the MAPE per size group (`common.by_size`), smallest first


@dataclass(frozen=True)
class HeldOut:
    """A table's rows predicted without being fitted on (nothing fitted, or cross-validated), with the
    (framework, device generation) key whose interval would quote them: what `coverage` places intervals from."""

    table: str
    keys: np.ndarray
    measured: np.ndarray
    predicted: np.ndarray
    workloads: np.ndarray


HELD_OUT: list[HeldOut] = []  # filled by the sources below as they run


def figures(table: str, measured: np.ndarray, predicted: np.ndarray, workloads: np.ndarray, fitted: str,
            keys: np.ndarray | str | None = None, *, sizes: tuple[str, np.ndarray]) -> Figures:
    """The table's figures; `keys` (one per row, or one for all) marks its rows as held out for `coverage`; `sizes`
    (what they measure, one per row), required of every table, gives the error by size of work (issue 43: a size
    trend must show in each table)."""
    errors = common.ape(predicted, measured)
    ranked = common.ranking(np.asarray(measured), np.asarray(predicted), np.asarray(workloads))
    if keys is not None:
        HELD_OUT.append(HeldOut(table, np.broadcast_to(np.asarray(keys), len(errors)), np.asarray(measured, float),
                                np.asarray(predicted, float), np.asarray(workloads)))
    kind, by_size = sizes[0], tuple(common.by_size(errors, sizes[1]))
    return Figures(table, len(errors), float(errors.mean()), float(errors.max()), ranked.workloads, ranked.spearman,
                   ranked.min_spearman, 100 * ranked.regret, fitted, kind, by_size)


def coverage(held: list[HeldOut]) -> dict[str, dict[str, float]]:
    """Per (framework, generation) key, the share of its held-out runs inside the 80 % interval placed from the key's
    other workloads (leave-one-workload-out: `interval_coverage.held_out` over table/workload groups)."""
    if not held:
        return {}
    keys = np.concatenate([h.keys for h in held])
    measured = np.concatenate([h.measured for h in held])
    predicted = np.concatenate([h.predicted for h in held])
    groups = np.concatenate([np.char.add(f"{h.table}|", h.workloads.astype(str)) for h in held])
    out = {}
    for key in sorted(set(keys)):
        on = keys == key
        if len(set(groups[on])) < 2:
            out[key] = {"rows": int(on.sum()), "coverage_pct": None}  # one workload: nothing to hold out
            continue
        pooled, _ = interval_coverage.held_out(groups[on], measured[on], predicted[on])
        out[key] = {"rows": int(on.sum()), "coverage_pct": round(100 * pooled, 1)}
    return out


def vtrain_tables(shared: Path) -> Iterator[Figures]:
    single, multi = common.ground_truth(shared, *vtrain_eval.FILES)
    key = f"{vtrain_eval.FRAMEWORK}/{GENERATIONS[vtrain_eval.DEVICE]}"
    cal = vtrain_eval.calibrate(single)
    measured, workloads = cal.frame["iteration time (ms)"].to_numpy(), vtrain_eval.workloads(cal.frame)
    sizes = ("params", vtrain_eval.block_params(cal.frame))
    yield figures("vTrain A100 single-node, in-file", measured, cal.frame["predicted (ms)"].to_numpy(), workloads,
                  "DeepSpeed host and per-call constants chosen on every row of the file", sizes=sizes)
    yield figures("vTrain A100 single-node, leave-one-model-out", measured,
                  cal.frame["cross-validated (ms)"].to_numpy(), workloads, "constants chosen without the row's model",
                  key, sizes=sizes)
    df = vtrain_eval.predict_file(multi, "analytical").dropna(subset=["predicted (ms)"])
    yield figures("vTrain A100 multi-node", df["iteration time (ms)"].to_numpy(), df["predicted (ms)"].to_numpy(),
                  vtrain_eval.workloads(df), "nothing (recorded DeepSpeed constants, chosen on the single-node file)",
                  key, sizes=("params", vtrain_eval.block_params(df)))


def bridge_tables(shared: Path) -> Iterator[Figures]:
    (path,) = common.ground_truth(shared, modern_eval.FILE)
    result = modern_eval.evaluate(path, recorded=False)
    fitted = {"in-file": "Megatron-Core constants chosen on every row of the file",
              "leave-one-system-out": "constants chosen without the row's system"}
    for kind, rows, table in (("dense", result.dense, result.table), ("MoE", result.moe, result.moe_table)):
        keys = np.array([f"megatron/{GENERATIONS[BRIDGE_DEVICES[s]]}" for s in rows.systems])
        sizes = (("tokens per expert", modern_eval.tokens_per_expert(rows)) if kind == "MoE"
                 else ("params", np.array([graph.params for _, graph, _ in rows.rows], dtype=float)))
        for column, what in fitted.items():
            yield figures(f"Megatron-Bridge 25.11 {kind}, {column}", rows.measured, table[column],
                          modern_eval.workloads(rows), what, keys if column == "leave-one-system-out" else None,
                          sizes=sizes)


def simumax_table(shared: Path) -> Iterator[Figures]:
    (path,) = common.ground_truth(shared, memory_eval.SIMUMAX)
    result = simumax_time.fit(path)
    sizes = ("params", result.params)
    yield figures("SimuMax B200 Llama 3 70B time, in-file", result.measured, result.in_file, result.workloads,
                  f"Megatron-Core's {simumax_time.FIELD} chosen on every plan (the other constants chosen on "
                  f"Megatron-Bridge)", sizes=sizes)
    yield figures("SimuMax B200 Llama 3 70B time, leave-one-plan-out", result.measured, result.cv, result.workloads,
                  f"{simumax_time.FIELD} chosen without the row's plan", "megatron/blackwell", sizes=sizes)


def torchtitan_tables(shared: Path) -> Iterator[Figures]:
    (path,) = common.ground_truth(shared, torchtitan_eval.FILE)
    ev = torchtitan_eval.evaluate(path)
    rows, workloads = ev.rows, ev.rows.workloads
    keys = np.array([f"{torchtitan_eval.FRAMEWORK}/{GENERATIONS[spec.cluster.device]}" for spec, _, _ in rows.rows])
    params = np.array([graph.params for _, graph, _ in rows.rows], dtype=float)
    yield figures("torchtitan 2025 time", rows.measured, ev.time, workloads, "nothing (in-file = cross-validated)",
                  keys, sizes=("params", params))
    published = ~np.isnan(rows.memory)
    yield figures("torchtitan 2025 memory", rows.memory[published], ev.memory[published], workloads[published],
                  "nothing (in-file = cross-validated)", sizes=("params", params[published]))


def cpu_table(_shared: Path) -> Iterator[Figures]:
    path = checkpoint_path("cpu")
    model, _ = load_predictor(str(path), "cpu")
    where = model.provenance["dataset"]
    recorded = model.provenance["accuracy"]["source"]
    if recorded != ev.holdout_source(where, CPU_HOLDOUT, CPU_SEED):
        raise SystemExit(f"{path.name} was measured on '{recorded}', not the split this harness holds out")
    _, held = ev.holdout_split(ev.load_profile_dataset(ROOT / where, designs=None, with_layers=False),
                               CPU_HOLDOUT, CPU_SEED)
    predicted, _ = ev.predict_samples(model, held)
    params = {}
    for s in held:  # each model's graph once
        key = s.spec.model.model_dump_json()
        if key not in params:
            params[key] = graph_for(s.spec.model).params
    yield figures(f"CPU dataset, {path.name} held out", np.array([s.iter_time_s for s in held]), predicted,
                  np.array([s.spec.model_dump_json() for s in held]), "nothing (80 % of the configurations trained it)",
                  "pytorch/measured", sizes=("params", np.array([params[s.spec.model.model_dump_json()] for s in held],
                                                          dtype=float)))


SOURCES: tuple[Callable[[Path], Iterator[Figures]], ...] = (vtrain_tables, bridge_tables, simumax_table,
                                                            torchtitan_tables, cpu_table)


# ---------------------------------------------------------------- comparison with the record


def regressions(current: list[Figures], recorded: dict[str, dict], tolerance: float = TOLERANCE) -> list[str]:
    """Why this run fails against the record: a recorded table it did not measure, or one whose MAPE is more than
    `tolerance` points above its recorded figure."""
    now = {f.table: f for f in current}
    out = []
    for name, rec in recorded.items():
        if name not in now:
            out.append(f"{name}: recorded, not measured by this run")
        elif now[name].mape_pct > rec["mape_pct"] + tolerance:
            out.append(f"{name}: MAPE {now[name].mape_pct:.2f} % against {rec['mape_pct']:.2f} % recorded "
                       f"(+{now[name].mape_pct - rec['mape_pct']:.2f} points; {tolerance:g} allowed)")
    return out


def _plain(value: object) -> object:
    """JSON's value of a figure: rounded, and null for NaN (JSON has no NaN)."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 2)
    return value


def record_entry(f: Figures) -> dict[str, object]:
    return {k: (list(v) if k == "by_size" else _plain(v)) for k, v in asdict(f).items() if k != "table"}


def size_line(name: str, f: dict[str, object]) -> str:
    """One table's error by size of work, as the report prints it."""
    groups = "; ".join(f"{common.size_text(g['from'])}" + (f"-{common.size_text(g['to'])}" if g["to"] != g["from"] else "")
                       + f" {g['mape_pct']:.1f} % ({g['rows']})" for g in f.get("by_size") or ())
    return f"#   {name}, by {f.get('size_kind')}: {groups}"


# ---------------------------------------------------------------- rendering


COLUMNS = ("table", "rows", "MAPE %", "max %", "ranked", "Spearman", "min Spearman", "regret %", "fitted on it")


def _cell(value: object, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def cells(name: str, f: dict[str, object]) -> list[str]:
    """One table's row of cells, from its figures as recorded (`record_entry`)."""
    return [name, _cell(f["rows"]), _cell(f["mape_pct"]), _cell(f["max_pct"]), _cell(f["workloads"] or "-"),
            _cell(f["spearman"], 2), _cell(f["min_spearman"], 2), _cell(f["regret_pct"]), str(f["fitted"])]


def text_table(entries: dict[str, dict[str, object]], recorded: dict[str, dict]) -> list[str]:
    rows = [[*COLUMNS[:-1], "recorded", COLUMNS[-1]]]
    for name, f in entries.items():
        row = cells(name, f)
        rows.append([*row[:-1], _cell(recorded.get(name, {}).get("mape_pct")), row[-1]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))] + [r[-1]])
            for r in rows]


def markdown_table(entries: dict[str, dict[str, object]]) -> list[str]:
    return ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS),
            *("| " + " | ".join(cells(name, f)) + " |" for name, f in entries.items())]


def provenance(seconds: float) -> dict[str, object]:
    """Which code ran (the commit, and the files of predictor and bench code the working tree changes), where, and
    how long."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    changed = git("status", "--porcelain", "--", "predictor", "bench/*.py").splitlines()
    return {"commit": git("rev-parse", "--short", "HEAD").strip(), "uncommitted": [line[3:] for line in changed],
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{cpu_model_name()}, {os.cpu_count()} cores", "seconds": round(seconds)}


def doc(record: dict[str, object]) -> str:
    run = record["run"]
    code = f"commit {run['commit']}" + (" with uncommitted changes" if run["uncommitted"] else "")
    out = ["# Accuracy", "",
           "<!-- Generated by `python -m bench.accuracy` from bench/results/accuracy.json and bench/results/*.txt. "
           "Do not edit: rerun it. -->", "",
           "What the predictions are worth against measured runs. How the predictors work is in "
           "[modeling.md](modeling.md) and [learned-predictor.md](learned-predictor.md); every run behind a figure, "
           "with its notes and the decisions it informed, is in [bench/results/log.md](../bench/results/log.md).", "",
           "Metrics: MAPE (MRE) is the mean of |predicted − measured| / measured, in %; RMSE is in ms.", "",
           "## Every table, one command", "",
           "`bench.accuracy` predicts every table below in one run and fails when a table's MAPE is more than "
           f"{TOLERANCE:g} point above the figure recorded here. *ranked*: workloads with at least "
           f"{common.MIN_PLANS} measured plans; *Spearman*: mean rank correlation of predicted and measured time "
           "within them (and the lowest); *regret*: mean of the predicted-best plan's measured time over the measured best, less one.",
           "", *markdown_table(record["tables"]), "",
           "Error by size of work (model parameters; tokens per expert and micro-batch for MoE), MAPE % and rows per "
           "group, smallest first:", "", "```", *(size_line(name, f)[4:] for name, f in record["tables"].items()
                                                  if f.get("by_size")), "```", "",
           *([f"80 % interval coverage per (framework/generation) key, each workload's runs judged by the interval "
              "placed from the key's other workloads: " + "; ".join(
                  f"{key} {_cell(c['coverage_pct'])} % of {c['rows']} runs" for key, c in record["coverage"].items()),
              ""] if record.get("coverage") else []),
           f"Recorded {run['date']}, {code}, {run['machine']}, {run['seconds']} s "
           f"([accuracy.json](../bench/results/accuracy.json)).", ""]
    out += ["## Recorded long runs", "", *accuracy_tables.headline()]
    out += ["## How to reproduce", "",
            "Run from the repository root; every benchmark is a module of `bench` and holds the machine's lock.", "",
            "```sh",
            "flock /tmp/scaledl-heavy.lock .venv/bin/python -m bench.accuracy            # the first table; --record "
            "to store a change's figures",
            "flock /tmp/scaledl-heavy.lock .venv/bin/python -m bench.paper_table         # CPU dataset, paper protocols "
            "(retrains every method)",
            "flock /tmp/scaledl-heavy.lock .venv/bin/scaledl evaluate --data predictor/data/h200",
            "flock /tmp/scaledl-heavy.lock .venv/bin/python -m bench.a100_eval           # ScaleDL trained on vTrain "
            "single-node, scored on multi-node",
            "flock /tmp/scaledl-heavy.lock .venv/bin/python -m bench.vtrain_eval --record   # the analytical accuracy "
            "`scaledl plan` quotes",
            "flock /tmp/scaledl-heavy.lock .venv/bin/python -m bench.memory_eval         # memory against SimuMax "
            "B200 and the 25.11 recipes",
            "flock /tmp/scaledl-heavy.lock .venv/bin/python -m bench.validate_plans      # real runs on a local "
            "two-node Ray cluster",
            ".venv/bin/python -m bench.accuracy_tables                                   # bench/results/log.md from "
            "the results files",
            "```", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- run


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__, shared=True)
    parser.add_argument("--record", action="store_true", help="write this run's figures to the record, bench/results/accuracy.json")
    args = parser.parse_args(argv)
    stored = json.loads(RECORD.read_text()) if RECORD.is_file() else {"tables": {}}
    t0 = time.perf_counter()
    HELD_OUT.clear()
    current: list[Figures] = []
    for source in SOURCES:
        start = time.perf_counter()
        current += list(source(args.shared))
        print(f"{source.__name__}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    run = provenance(time.perf_counter() - t0)
    entries = {f.table: record_entry(f) for f in current}
    failures = [] if args.record else regressions(current, stored["tables"])
    new = [name for name in entries if name not in stored["tables"]]
    code = f"commit {run['commit']}" + (f", uncommitted: {' '.join(run['uncommitted'])}" if run["uncommitted"] else "")
    lines = [f"# python -m bench.accuracy{' --record' if args.record else ''}   ({run['date']}, {code}, "
             f"{run['machine']}, {run['seconds']} s)", *text_table(entries, stored["tables"])]
    covered = coverage(HELD_OUT)
    lines += [f"# 80 % interval coverage, leave-one-workload-out within the (framework/generation) key: "
              + "; ".join(f"{key} {_cell(c['coverage_pct'])} % of {c['rows']}" for key, c in covered.items())]
    lines += ["# error by size of work (MAPE % (rows) per group, smallest first):"]
    lines += [size_line(name, f) for name, f in entries.items() if f.get("by_size")]
    lines += [f"# not recorded yet: {name}" for name in new if not args.record]
    lines += [f"# WORSE: {failure}" for failure in failures]
    print("\n".join(lines))
    REPORT.write_text("\n".join(lines) + "\n")
    if args.record:
        stored = {"tables": entries, "coverage": covered, "run": run}
        RECORD.write_text(json.dumps(stored, indent=2) + "\n")
    if "run" in stored:
        DOC.write_text(doc(stored))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
