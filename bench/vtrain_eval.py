"""Accuracy of the analytical model on vTrain's published A100 measurements, and DeepSpeed's own costs on A100 chosen
on the single-node file.

Predicts every row of ../shared/ground_truth/vtrain_ground_truth_{single,multi}.csv in the measurement setting their
README documents: Megatron-DeepSpeed GPT, A100, mixed precision (fp16), Adam, 1F1B, full recomputation, no sequence
parallelism or ZeRO, vocabulary 50,257 padded to a multiple of 128·tp, 8 GPUs per node on the catalogue's NVLink
(300 GB/s) and 800 Gb/s InfiniBand per node (12.5 GB/s per GPU): `predictor.data.evaluate.vtrain_workload`, the one
translation that training on these files and bench/a100_eval.py use too. Prints MAPE and, per model, the Spearman
rank correlation within each workload (same model, GPU count and global batch) of at least three plans and the
regret of its predicted-best plan (measured time of the predicted best / measured best - 1), averaged over those
workloads (`bench.common.ranking`).

The single-node file is what the A100 predictor may be calibrated on; the multi-node file is evaluation only. The
single-node rows choose Megatron-DeepSpeed's host cost per operator and per collective call (`GRID`, the analytical
model's `host_op_s` and `call_s`: what the framework spends on the host, not the device) by MAPE, leave-one-model-out
(`calibrate`): the cross-validated figure is printed beside the in-file one (constants chosen on every row).

    .venv/bin/python -m bench.vtrain_eval [--shared PATH] [--predictor analytical|auto|PATH] [--record]

`--record` (analytical only) writes the constants chosen on every single-node row to
predictor/checkpoints/framework-constants.json (DeepSpeed on Ampere), then the multi-node figures, predicted with
them, into predictor/checkpoints/analytical-accuracy.json, which `scaledl plan` reports as the measured accuracy of
the analytical predictor on this device.
"""

from __future__ import annotations

import datetime
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench import common, modern_eval
from bench.common import ROOT
from predictor.data.evaluate import load_vtrain, predict_samples
from predictor.frameworks.base import CONSTANTS_FILE
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.base import Predictor
from predictor.models.calibration import FITTED
from predictor.models.intervals import residual_quantiles
from predictor.models.registry import ANALYTICAL_ACCURACY, load_predictor
from predictor.models.roofline import AnalyticalConfig, device_config
from predictor.spec.hardware import GENERATIONS

DEVICE = "a100-80gb"
FRAMEWORK = "deepspeed"  # vTrain measured Megatron-DeepSpeed
MODEL_COLS = ["hidden size", "attention heads", "# layers", "sequence length"]
FILES = ("vtrain_ground_truth_single.csv", "vtrain_ground_truth_multi.csv")
# Megatron-DeepSpeed's host costs, each over the range its AnalyticalConfig docstring argues for: an eager operator's
# Python, dispatcher, autograd and launch (prior 10 µs), and a collective or send/recv call's own cost beyond its
# α-β time (prior 0: the Python wrapper, c10d and NCCL's enqueue of each call).
GRID: dict[str, tuple[float, ...]] = {"host_op_s": tuple(us / 1e6 for us in range(10, 65, 5)),
                                      "call_s": tuple(us / 1e6 for us in (0, 50, 100, 150, 200, 300))}
assert tuple(GRID) == FITTED


def predict_file(path: Path, predictor: str | Predictor) -> pd.DataFrame:
    """The file's rows with each one's prediction (ms) by `predictor` (a name `load_predictor` takes, or a
    predictor), translated as every use of this data is (`predictor.data.evaluate.vtrain_workload`); a row that
    translation cannot run keeps NaN."""
    df = pd.read_csv(path, encoding="utf-8-sig")
    model = load_predictor(predictor, DEVICE)[0] if isinstance(predictor, str) else predictor
    samples = load_vtrain(path)  # warns of any row it cannot run
    seconds, _ = predict_samples(model, samples)
    df["predicted (ms)"] = np.nan
    df.loc[[int(s.config_id.rsplit(":", 1)[1]) for s in samples], "predicted (ms)"] = seconds * 1e3
    return df


def models(df: pd.DataFrame) -> np.ndarray:
    """Each row's model (hidden size, heads, layers, sequence): the folds of leave-one-model-out."""
    return df[MODEL_COLS].astype(int).astype(str).agg("/".join, axis=1).to_numpy()


def block_params(df: pd.DataFrame) -> np.ndarray:
    """Each row's transformer blocks' parameters, 12 · layers · hidden² (attention 4h², MLP 8h²): its size of work."""
    return 12.0 * df["# layers"].to_numpy(float) * df["hidden size"].to_numpy(float) ** 2


@dataclass
class Calibration:
    """The single-node file's rows (`frame`, with the in-file and the leave-one-model-out prediction in ms), the
    constants chosen on every row (`in_file`) and those chosen without each model (`chosen`)."""

    frame: pd.DataFrame
    in_file: AnalyticalConfig
    chosen: dict[str, AnalyticalConfig]


def calibrate(path: Path) -> Calibration:
    """GRID's constants over the first principles of the device's generation, chosen by MAPE on the file's rows:
    on every row (in-file) and, per model, on the other models' rows to predict its own (leave-one-model-out)."""
    grid = modern_eval.configs(device_config(GENERATIONS[DEVICE]), GRID)
    frames = [predict_file(path, AnalyticalPredictor(cfg)).dropna(subset=["predicted (ms)"]) for cfg in grid]
    df = frames[0].drop(columns="predicted (ms)")
    measured = df["iteration time (ms)"].to_numpy()
    predicted = np.array([f["predicted (ms)"].to_numpy() for f in frames])
    choice = common.leave_one_group_out(predicted, measured, models(df))
    df["predicted (ms)"], df["cross-validated (ms)"] = predicted[choice.in_file], choice.cv
    return Calibration(df, grid[choice.in_file], {model: grid[k] for model, k in choice.without.items()})


def constants_text(cfg: AnalyticalConfig) -> str:
    return ", ".join(f"{k}={1e6 * asdict(cfg)[k]:g} µs" for k in GRID)


def workloads(df: pd.DataFrame) -> np.ndarray:
    """Each row's workload: its model, GPU count and global batch (the rows of one are plans compared)."""
    return df[[*MODEL_COLS, "# GPUs", "global batch"]].astype(int).astype(str).agg("/".join, axis=1).to_numpy()


def headline(df: pd.DataFrame) -> dict[str, float]:
    """MAPE, median APE and mean signed error (%) over the rows that could be predicted."""
    ok = df.dropna(subset=["predicted (ms)"])
    measured, predicted = ok["iteration time (ms)"].to_numpy(), ok["predicted (ms)"].to_numpy()
    rel = (predicted - measured) / measured
    return {"rows": len(ok), "mape_pct": round(100 * float(np.abs(rel).mean()), 2),
            "median_ape_pct": round(100 * float(np.median(np.abs(rel))), 2), "mean_signed_pct": round(100 * float(rel.mean()), 2)}


def summarise(name: str, df: pd.DataFrame) -> list[str]:
    ok = df.dropna(subset=["predicted (ms)"])
    h = headline(df)
    lines = [f"## {name}: {h['rows']}/{len(df)} rows predicted, MAPE {h['mape_pct']:.1f}% "
             f"(median APE {h['median_ape_pct']:.1f}%, mean signed error {h['mean_signed_pct']:+.1f}%)"]
    lines.append(f"{'model (h, heads, layers, seq)':<30} {'rows':>5} {'groups':>6} {'MAPE':>7} {'Spearman':>9} {'regret':>8}")
    for model, mdf in ok.groupby(MODEL_COLS):
        measured, predicted = mdf["iteration time (ms)"].to_numpy(), mdf["predicted (ms)"].to_numpy()
        r = common.ranking(measured, predicted, workloads(mdf))
        lines.append(f"{str(tuple(int(x) for x in model)):<30} {len(mdf):>5} {r.workloads:>6} "
                     f"{common.ape(predicted, measured).mean():>6.1f}% {r.spearman:>9.3f} {100 * r.regret:>7.1f}%")
    return lines


def main() -> int:
    parser = common.parser(__doc__, shared=True)
    parser.add_argument("--predictor", default="analytical")
    parser.add_argument("--record", action="store_true",
                        help=f"write the constants chosen on the single-node file to "
                             f"{CONSTANTS_FILE.relative_to(ROOT)} and the multi-node figures, predicted with them, to "
                             f"{ANALYTICAL_ACCURACY.relative_to(ROOT)} (analytical only)")
    args = parser.parse_args()
    if args.record and args.predictor != "analytical":
        parser.error("--record stores the analytical predictor's accuracy; run it with --predictor analytical")
    single, multi = common.ground_truth(args.shared, *FILES)
    predictor: str | Predictor = args.predictor
    if args.predictor == "analytical":
        t0 = time.perf_counter()
        cal = calibrate(single)
        for column, chosen in (("predicted (ms)", "chosen on every row (in-file)"),
                               ("cross-validated (ms)", "chosen without the row's model")):
            print("\n".join(summarise(f"{single.name}, {FRAMEWORK} constants {chosen}",
                                       cal.frame.assign(**{"predicted (ms)": cal.frame[column]}))))
        for model, cfg in cal.chosen.items():
            print(f"constants chosen without {model}: {constants_text(cfg)}")
        print(f"constants chosen on every row (in-file): {constants_text(cal.in_file)}")
        print(f"({time.perf_counter() - t0:.1f} s)\n")
        if args.record:
            record_constants(cal, single.name)
            predictor = AnalyticalPredictor(cal.in_file)
    else:
        t0 = time.perf_counter()
        print("\n".join(summarise(f"{single.name} ({args.predictor})", predict_file(single, predictor))))
        print(f"({time.perf_counter() - t0:.1f} s)\n")
    t0 = time.perf_counter()
    df = predict_file(multi, predictor)
    print("\n".join(summarise(f"{multi.name} ({args.predictor})", df)))
    print(f"({time.perf_counter() - t0:.1f} s)\n")
    if args.record:
        record(df, multi.name)
    return 0


def record_constants(cal: Calibration, source: str) -> None:
    """Store the constants chosen on every single-node row as DeepSpeed's on the device's generation (atomically),
    with the file's leave-one-model-out MAPE."""
    df = cal.frame
    cv = modern_eval.mape(df["cross-validated (ms)"].to_numpy(), df["iteration time (ms)"].to_numpy())
    common.record_constants(CONSTANTS_FILE, FRAMEWORK, {"constants": {k: asdict(cal.in_file)[k] for k in GRID},
                            "generations": [GENERATIONS[DEVICE]],
                            "source": f"{source}: {len(df)} rows of Megatron-DeepSpeed on 2-8 A100, chosen on all of "
                                      f"them; leave-one-model-out MAPE {100 * cv:.1f}%",
                            "measured_by": "bench/vtrain_eval.py --record", "date": datetime.date.today().isoformat()})


def record(df: pd.DataFrame, source: str) -> None:
    """Merge this device's measured accuracy, with the residual quantiles of its prediction intervals, into the
    analytical accuracy file (atomically)."""
    ok = df.dropna(subset=["predicted (ms)"])
    common.merge_json(ANALYTICAL_ACCURACY, {DEVICE: {**headline(df), "framework": FRAMEWORK,
                     "source": f"{source} (vTrain, 64-512 A100s; never fitted on)",
                     "measured_by": "bench/vtrain_eval.py --record", "date": datetime.date.today().isoformat(),
                     "residual_quantiles": residual_quantiles(ok["iteration time (ms)"], ok["predicted (ms)"])}})


if __name__ == "__main__":
    sys.exit(main())
