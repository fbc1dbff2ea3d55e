"""Accuracy of the analytical model on vTrain's published A100 measurements (no fitting to them).

Predicts every row of ../shared/ground_truth/vtrain_ground_truth_{single,multi}.csv (the multi
file is evaluation only) in the measurement setting their README documents: Megatron-DeepSpeed
GPT, A100, mixed precision (fp16), Adam, 1F1B, full recomputation, no sequence parallelism or
ZeRO, vocabulary 50,257 padded to a multiple of 128·tp, 8 GPUs per node on the catalogue's NVLink
(300 GB/s) and 800 Gb/s InfiniBand per node (12.5 GB/s per GPU): `predictor.evaluate.vtrain_workload`,
the one translation that training on these files and bench/a100_eval.py use too. Prints MAPE and, per model,
the Spearman rank correlation within each workload (same model, GPU count and global batch) of at least three
plans and the regret of its predicted-best plan (measured time of the predicted best / measured best - 1),
averaged over those workloads (`bench.common.ranking`).

    .venv/bin/python -m bench.vtrain_eval [--shared PATH] [--predictor analytical|auto|PATH] [--record]

`--record` (analytical only) writes the multi-node figures into
predictor/checkpoints/analytical-accuracy.json, which `scaledl plan` reports as the measured
accuracy of the analytical predictor on this device.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bench import common
from bench.common import ROOT
from predictor.evaluate import load_vtrain, predict_samples
from predictor.models.intervals import residual_quantiles
from predictor.models.registry import ANALYTICAL_ACCURACY, load_predictor

DEVICE = "a100-80gb"
MODEL_COLS = ["hidden size", "attention heads", "# layers", "sequence length"]
FILES = ("vtrain_ground_truth_single.csv", "vtrain_ground_truth_multi.csv")


def predict_file(path: Path, predictor_name: str) -> pd.DataFrame:
    """The file's rows with each one's prediction (ms), translated as every use of this data is
    (`predictor.evaluate.vtrain_workload`); a row that translation cannot run keeps NaN."""
    df = pd.read_csv(path, encoding="utf-8-sig")
    predictor, _ = load_predictor(predictor_name, DEVICE)
    samples = load_vtrain(path)  # warns of any row it cannot run
    seconds, _ = predict_samples(predictor, samples)
    df["predicted (ms)"] = np.nan
    df.loc[[int(s.config_id.rsplit(":", 1)[1]) for s in samples], "predicted (ms)"] = seconds * 1e3
    return df


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
                        help=f"write the multi-node figures to {ANALYTICAL_ACCURACY.relative_to(ROOT)} (analytical only)")
    args = parser.parse_args()
    if args.record and args.predictor != "analytical":
        parser.error("--record stores the analytical predictor's accuracy; run it with --predictor analytical")
    for name, path in zip(("single", "multi"), common.ground_truth(args.shared, *FILES)):
        t0 = time.perf_counter()
        df = predict_file(path, args.predictor)
        print("\n".join(summarise(f"{path.name} ({args.predictor})", df)))
        print(f"({time.perf_counter() - t0:.1f} s)\n")
        if args.record and name == "multi":
            record(df, path.name)
    return 0


def record(df: pd.DataFrame, source: str) -> None:
    """Merge this device's measured accuracy, with the residual quantiles of its prediction intervals, into the
    analytical accuracy file (atomically)."""
    ok = df.dropna(subset=["predicted (ms)"])
    table = json.loads(ANALYTICAL_ACCURACY.read_text()) if ANALYTICAL_ACCURACY.is_file() else {}
    table[DEVICE] = {**headline(df), "framework": "deepspeed",  # vTrain measured Megatron-DeepSpeed
                     "source": f"{source} (vTrain, 64-512 A100s; never fitted on)",
                     "measured_by": "bench/vtrain_eval.py --record", "date": datetime.date.today().isoformat(),
                     "residual_quantiles": residual_quantiles(ok["iteration time (ms)"], ok["predicted (ms)"])}
    tmp = ANALYTICAL_ACCURACY.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    tmp.replace(ANALYTICAL_ACCURACY)
    print(f"recorded in {ANALYTICAL_ACCURACY}")


if __name__ == "__main__":
    sys.exit(main())
