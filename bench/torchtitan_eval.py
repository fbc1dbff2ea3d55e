"""Accuracy of the analytical model on torchtitan's published runs, time and memory, per source.

../shared/ground_truth/torchtitan_2025.csv holds 29 runs the torchtitan and torchao projects published (sources T1-T5
in its header). Each row is predicted with its plan as torchtitan ran it (`workload`): FSDP2 over the data-parallel
ranks with torchtitan's default resharding (after forward, no pipeline: zero=3), tensor parallelism with
sequence-parallel norms, async TP as hidden tp communication, torch.compile as the row says, the row's activation
checkpointing (a blank one is the
shipped toml's default, `selective` per op), and its precision as the recipe of the same scaling (float8
tensorwise: per-tensor current scaling; rowwise: torchao's row-wise recipe; MXFP8; NVFP4). Iteration time = global_batch * seq_len / (gpus * tps_per_gpu).

Mechanisms first (FSDP2's units, edges, FP32 gradient reduce, float8 all-gather and copies: `predictor.models.fsdp2`;
async TP's fused and unfused collectives; per-op checkpointing; float8 casts). What they leave is one torchtitan
constant, as the file's README allows: `compute_share` (`FIELD`), the share of the device facts' compute rates (the
measured GEMM grids, the fused-attention figures) its kernels reach, one value over both of the file's generations,
chosen from `GRID` leave-one-source-out (each source priced with the value chosen on the other three) and in-file (on
every row). It scales the facts and keeps them: every source runs slower than the full-power tables (T1's H100s are
500 W parts, T3's B200s power-limited). Memory is first principles (in-file = cross-validated). Rows no preset
describes (T4, a two-layer Llama 4 Scout) are counted as skipped.

    .venv/bin/python -m bench.torchtitan_eval [--shared PATH] [--record]
"""

from __future__ import annotations

import datetime
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from bench import common
from predictor.frameworks import FRAMEWORKS
from predictor.frameworks.base import CONSTANTS_FILE
from predictor.graph.cache import graph_for
from predictor.memory.facts import GIB
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.spec.workload import WorkloadSpec, parse_spec

FILE = "torchtitan_2025.csv"
FRAMEWORK = "torchtitan"
# The file's GPUs as catalogue devices (T1's 96 GB, 500 W H100 and T3's power-limited B200 are priced as the
# catalogue's parts; T5's GPU is inferred by the file).
DEVICES = {"h100-96gb-500w": "h100", "h200": "h200", "b200-power-limited": "b200", "b200": "b200",
           "gb200 (INFERRED)": "gb200"}
PRESETS = ("llama3.1-8b", "llama3.1-70b", "llama3-8b", "qwen3-8b")
GPUS_PER_NODE = {"T5": 4}  # T5 ran on 4 GPUs; the others on 8-GPU hosts
GIGA = 1e9
# The torchtitan constant chosen leave-one-source-out, its candidates (1.0: the device facts' rates, first
# principles; 0.4: under what Megatron-Core's B200 BF16 rate chosen on SimuMax's runs, 0.45 of peak, is of the B200
# grid's), and the generations it is recorded for (the file's).
FIELD = "compute_share"
GRID: tuple[float, ...] = (0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
FITTED_GENERATIONS: tuple[str, ...] = ("blackwell", "hopper")


def precision(value: str) -> tuple[str, str | None]:
    """(training.precision, training.recipe) of the file's precision column."""
    if "nvfp4" in value:
        return "fp4", "nvfp4"
    if "mxfp8" in value:
        return "fp8", "mxfp8"
    if "tensorwise" in value:
        return "fp8", "current"
    if "rowwise" in value:
        return "fp8", "rowwise"
    return "bf16", None


def recompute(value: str) -> str:
    """The plan's recompute of the file's ac column: full, none, else torchtitan's selective (per op, its toml
    default, which the blank and INFERRED entries are)."""
    if value.startswith("full"):
        return "full"
    return "none" if value == "none" else "selective"


def workload(row: dict) -> tuple[WorkloadSpec, Plan] | None:
    """One row as torchtitan ran it (the module docstring), None where no preset describes its model."""
    if row["model"] not in PRESETS or int(row["pp"]) > 1 or int(row["ep"]) > 1:
        return None
    prec, recipe = precision(str(row["precision"]))
    gpus = int(row["gpus"])
    per_node = min(gpus, GPUS_PER_NODE.get(row["source"], 8))
    training = {"global_batch": int(row["global_batch"]), "precision": prec, "framework": FRAMEWORK,
                "compile": str(row["compile"]).lower().startswith("true"), **({"recipe": recipe} if recipe else {})}
    spec = parse_spec({"model": {"preset": row["model"], "seq_len": int(row["seq_len"])}, "training": training,
                       "cluster": {"device": DEVICES[row["gpu"]], "nodes": gpus // per_node,
                                   "gpus_per_node": per_node}})
    tp = int(row["tp"])
    hidden = "dp+param" + ("+tp" if str(row["async_tp"]).lower() == "true" else "")
    plan = Plan(dp=int(row["fsdp"]), tp=tp, cp=int(row["cp"]), mbs=int(row["local_batch"]), zero=3, sp=tp > 1,
                recompute=recompute(str(row["ac"]) if isinstance(row["ac"], str) else ""), overlap=hidden,
                placement="tp-cp-dp-pp")
    return spec, plan


def measured_gib(row: dict) -> float:
    """The row's published memory in GiB (NaN where none)."""
    value = float(row["memory"])
    return value * GIGA / GIB if row["memory_unit"] == "GB" else value


@dataclass(frozen=True)
class Rows:
    """The file's rows a preset describes: (spec, graph, plan), measured seconds and GiB, sources, workloads."""

    frame: pd.DataFrame
    rows: list[tuple]
    measured: np.ndarray
    memory: np.ndarray
    sources: np.ndarray
    skipped: int

    @property
    def workloads(self) -> np.ndarray:
        """Each row's workload (source, model, GPUs, global batch, sequence): its plans are its precisions and TP."""
        return self.frame[["source", "model", "gpus", "global_batch", "seq_len"]].astype(str).agg("/".join,
                                                                                               axis=1).to_numpy()


def load(path: Path) -> Rows:
    df = pd.read_csv(path, comment="#")
    built = [(i, w) for i, r in enumerate(df.to_dict("records")) if (w := workload(r)) is not None]
    frame = df.iloc[[i for i, _ in built]].reset_index(drop=True)
    rows = [(spec, graph_for(spec.model), plan) for _, (spec, plan) in built]
    measured = (frame["global_batch"] * frame["seq_len"] / (frame["gpus"] * frame["tps_per_gpu"])).to_numpy()
    memory = np.array([measured_gib(r) for r in frame.to_dict("records")])
    return Rows(frame, rows, measured, memory, frame["source"].to_numpy(), len(df) - len(built))


@contextmanager
def constant(value: float | None) -> Iterator[None]:
    """torchtitan priced with `value` as its FIELD on FITTED_GENERATIONS, whatever CONSTANTS_FILE records (None:
    first principles): the registry's framework replaced while the block runs."""
    recorded = FRAMEWORKS[FRAMEWORK]
    FRAMEWORKS[FRAMEWORK] = replace(recorded, constants={} if value is None else {
        generation: {FIELD: value} for generation in FITTED_GENERATIONS})
    try:
        yield
    finally:
        FRAMEWORKS[FRAMEWORK] = recorded


def predict(rows: list[tuple], value: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(iteration seconds, peak GiB) of each row, as a torchtitan prediction prices it with FIELD at `value` (None:
    first principles)."""
    with constant(value):
        out = [AnalyticalPredictor().predict(spec, graph, [plan])[0] for spec, graph, plan in rows]
    return np.array([p.iter_time_s for p in out]), np.array([p.peak_memory_gib for p in out])


@dataclass(frozen=True)
class Evaluation:
    """The rows and their predicted iteration seconds: first principles, leave-one-source-out (each source with the
    value chosen on the others, `chosen`), in-file (the value chosen on every row); and peak GiB (nothing fitted)."""

    rows: Rows
    first_principles: np.ndarray
    cv: np.ndarray
    in_file: np.ndarray
    memory: np.ndarray
    chosen: dict[str, float]
    in_file_value: float


def best(times: np.ndarray, measured: np.ndarray, on: np.ndarray) -> int:
    """The GRID index whose predictions (`times`: values x rows) have the lowest MAPE on the rows `on`."""
    return int(np.argmin(np.mean(np.abs(times[:, on] - measured[on]) / measured[on], axis=1)))


def evaluate(path: Path) -> Evaluation:
    rows = load(path)
    first, memory = predict(rows.rows)
    times = np.array([predict(rows.rows, value)[0] for value in GRID])
    cv, chosen = np.empty(len(rows.rows)), {}
    for source in sorted(set(rows.sources)):
        held = rows.sources == source
        k = best(times, rows.measured, ~held)
        chosen[source], cv[held] = GRID[k], times[k, held]
    k = best(times, rows.measured, np.ones(len(rows.rows), dtype=bool))
    return Evaluation(rows, first, cv, times[k], memory, chosen, GRID[k])


def record(ev: Evaluation) -> None:
    """Store torchtitan's in-file FIELD for FITTED_GENERATIONS in CONSTANTS_FILE (atomically), with both figures."""
    measured, sources = ev.rows.measured, ev.rows.sources
    common.record_constants(CONSTANTS_FILE, FRAMEWORK, {
        "constants": {FIELD: ev.in_file_value}, "generations": list(FITTED_GENERATIONS),
        "source": f"{FILE}: {len(measured)} rows of sources {', '.join(sorted(set(sources)))}, chosen on all of them "
                  f"(MAPE {common.ape(ev.in_file, measured).mean():.1f}%); leave-one-source-out MAPE "
                  f"{common.ape(ev.cv, measured).mean():.1f}%",
        "measured_by": "bench/torchtitan_eval.py --record", "date": datetime.date.today().isoformat()})


def per_source(errors: np.ndarray, sources: np.ndarray) -> str:
    on = ~np.isnan(errors)
    return ", ".join(f"{s} {errors[on & (sources == s)].mean():.1f}%" for s in sorted(set(sources[on])))


def main() -> int:
    parser = common.parser(__doc__, shared=True)
    parser.add_argument("--record", action="store_true",
                        help=f"store the in-file {FIELD} as torchtitan's constant in {CONSTANTS_FILE.name}")
    args = parser.parse_args()
    (path,) = common.ground_truth(args.shared, FILE)
    ev = evaluate(path)
    r = ev.rows
    print(f"{'src':<4} {'model':<13} {'precision':<34} {'ac':<10} {'plan':<28} {'meas s':>7} {'first':>7} {'LOSO':>7} "
          f"{'in-file':>7}  {'meas GiB':>8} {'pred GiB':>8}")
    for j, (spec, _, plan) in enumerate(r.rows):
        f = r.frame.iloc[j]
        errors = " ".join(f"{100 * (t[j] / r.measured[j] - 1):>+6.1f}%" for t in (ev.first_principles, ev.cv, ev.in_file))
        print(f"{f['source']:<4} {f['model']:<13} {str(f['precision'])[:34]:<34} {plan.recompute:<10} "
              f"{f'dp={plan.dp},tp={plan.tp},mbs={plan.mbs},{plan.overlap}':<28} {r.measured[j]:>7.2f} {errors}  "
              f"{r.memory[j]:>8.1f} {ev.memory[j]:>8.1f}")
    for name, t in (("first principles", ev.first_principles), ("leave-one-source-out", ev.cv),
                    ("in-file", ev.in_file)):
        time = common.ape(t, r.measured)
        print(f"time MAPE, {name}: {time.mean():.1f}%  ({per_source(time, r.sources)})")
    print(f"{FIELD} chosen: leave-one-source-out {ev.chosen} (each without its source), in-file {ev.in_file_value}")
    mem = common.ape(ev.memory, r.memory)
    print(f"memory MAPE (nothing fitted): {np.nanmean(mem):.1f}% over {int((~np.isnan(mem)).sum())} rows  "
          f"({per_source(mem, r.sources)}); skipped rows: {r.skipped}")
    if args.record:
        record(ev)
    return 0


if __name__ == "__main__":
    sys.exit(main())
