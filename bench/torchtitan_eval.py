"""Accuracy of the analytical model on torchtitan's published runs, time and memory, per source.

../shared/ground_truth/torchtitan_2025.csv holds 29 runs the torchtitan and torchao projects published (sources T1-T5
in its header). Each row is predicted with its plan as torchtitan ran it (`workload`): FSDP2 over the data-parallel
ranks with torchtitan's default resharding (after forward, no pipeline: zero=3), tensor parallelism with
sequence-parallel norms, async TP as hidden tp communication, torch.compile as the row says, the row's activation
checkpointing (a blank one is the
shipped toml's default, `selective` per op), and its precision as the recipe of the same scaling (float8
tensorwise: per-tensor current scaling; rowwise: torchao's row-wise recipe; MXFP8; NVFP4). Iteration time = global_batch * seq_len / (gpus * tps_per_gpu).

Nothing is fitted on it: time and memory are first principles and the devices' measured facts (in-file = cross-
validated). The file's README allows torchtitan constants chosen leave-one-source-out, and none acts as a mechanism
would: its GEMMs are priced by the devices' measured GEMM grids wherever no torchtitan constant is recorded on the
generation (`roofline.layer_times`), so `gemm_eff_max` moves nothing (recording a fit would switch the grids and the
attention device facts off for torchtitan); the host cost is the device profiles' measured one; the memory-bound
kernels' bandwidth share (`bw_eff`) chose the floor of its range (0.30) on every four sources, a stand-in for what
is missing, not a bandwidth. Rows no preset describes (T4, a two-layer Llama 4 Scout) are counted as skipped.

    .venv/bin/python -m bench.torchtitan_eval [--shared PATH]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench import common
from predictor.graph_cache import graph_for
from predictor.memory.facts import GIB
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.workload import WorkloadSpec, parse_spec

FILE = "torchtitan_2025.csv"
FRAMEWORK = "torchtitan"
# The file's GPUs as catalogue devices (T1's 96 GB, 500 W H100 and T3's power-limited B200 are priced as the
# catalogue's parts; T5's GPU is inferred by the file).
DEVICES = {"h100-96gb-500w": "h100", "h200": "h200", "b200-power-limited": "b200", "b200": "b200",
           "gb200 (INFERRED)": "gb200"}
PRESETS = ("llama3.1-8b", "llama3.1-70b", "llama3-8b", "qwen3-8b")
GPUS_PER_NODE = {"T5": 4}  # T5 ran on 4 GPUs; the others on 8-GPU hosts
GIGA = 1e9


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


def predict(rows: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """(iteration seconds, peak GiB) of each row, as a torchtitan prediction prices it."""
    out = [AnalyticalPredictor().predict(spec, graph, [plan])[0] for spec, graph, plan in rows]
    return np.array([p.iter_time_s for p in out]), np.array([p.peak_memory_gib for p in out])


@dataclass(frozen=True)
class Evaluation:
    """The rows and their predicted iteration seconds and peak GiB (nothing fitted)."""

    rows: Rows
    time: np.ndarray
    memory: np.ndarray


def evaluate(path: Path) -> Evaluation:
    rows = load(path)
    return Evaluation(rows, *predict(rows.rows))


def per_source(errors: np.ndarray, sources: np.ndarray) -> str:
    on = ~np.isnan(errors)
    return ", ".join(f"{s} {errors[on & (sources == s)].mean():.1f}%" for s in sorted(set(sources[on])))


def main() -> int:
    parser = common.parser(__doc__, shared=True)
    args = parser.parse_args()
    (path,) = common.ground_truth(args.shared, FILE)
    ev = evaluate(path)
    r = ev.rows
    print(f"{'src':<4} {'model':<13} {'precision':<34} {'ac':<10} {'plan':<28} {'meas s':>7} {'pred s':>7} {'err':>7}  "
          f"{'meas GiB':>8} {'pred GiB':>8}")
    for j, (spec, _, plan) in enumerate(r.rows):
        f = r.frame.iloc[j]
        print(f"{f['source']:<4} {f['model']:<13} {str(f['precision'])[:34]:<34} {plan.recompute:<10} "
              f"{f'dp={plan.dp},tp={plan.tp},mbs={plan.mbs},{plan.overlap}':<28} {r.measured[j]:>7.2f} "
              f"{ev.time[j]:>7.2f} {100 * (ev.time[j] / r.measured[j] - 1):>+6.1f}%  {r.memory[j]:>8.1f} "
              f"{ev.memory[j]:>8.1f}")
    time = common.ape(ev.time, r.measured)
    print(f"time MAPE (nothing fitted): {time.mean():.1f}%  ({per_source(time, r.sources)})")
    mem = common.ape(ev.memory, r.memory)
    print(f"memory MAPE (nothing fitted): {np.nanmean(mem):.1f}% over {int((~np.isnan(mem)).sum())} rows  "
          f"({per_source(mem, r.sources)}); skipped rows: {r.skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
