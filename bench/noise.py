"""Measurement noise of a profile dataset: re-measure configurations and print their coefficient of variation.

    .venv/bin/python -m bench.noise --data predictor/data/cpu --configs 20 --repeats 2

Picks `--configs` measured configurations at random (seeded, spread over families), measures
each again `--repeats` times with the dataset's own settings, appends the new measurements to
the dataset's `noise` table and prints, per configuration and overall, the coefficient of
variation (std / mean) of the iteration time over the original and the repeated measurements.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from bench import common
from predictor.data import dataset
from predictor.data.collect import ProfileSettings, measure_config
from predictor.data.noise import cv, floor_of, remeasured
from predictor.measure.design import ProfileConfig
from predictor.measure.iteration import WorkerPool
from predictor.plan import Plan
from predictor.spec.workload import ModelSpec


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--data", required=True, help="profile dataset directory")
    parser.add_argument("--configs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2, help="new measurements per configuration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report-only", action="store_true", help="only print the CVs of the stored noise table")
    args = parser.parse_args(argv)
    if args.report_only:
        return report(args.data)

    rows = dataset.load(args.data)
    rows = rows[(rows["status"] == "ok") & (rows["design"] != "noise")]
    if rows.empty:
        print(f"{args.data}: no measured configurations", file=sys.stderr)
        return 2
    shuffled = rows.sample(frac=1.0, random_state=args.seed)
    turn = shuffled.groupby("family").cumcount()  # round-robin over families: every model is represented
    picked = shuffled.assign(_turn=turn.values).sort_values("_turn", kind="stable").head(args.configs)
    stored = Path(args.data) / "settings.json"
    settings = ProfileSettings(**json.loads(stored.read_text())) if stored.exists() else ProfileSettings()
    settings.layers = False  # the whole iteration is what the CV is reported for

    cvs, mem_cvs = [], []
    print(f"{'family':7} {'plan':28} {'batch':>5} {'original':>9} {'again':>22} {'CV':>6}")
    with WorkerPool(world=settings.procs, threads=settings.threads, device=settings.device) as pool:
        for _, orig in picked.iterrows():
            cfg = ProfileConfig(ModelSpec.model_validate_json(orig["spec_json"]), int(orig["batch"]), Plan.parse(orig["plan"]))
            again = []
            for _ in range(args.repeats):
                row, _ = measure_config(pool, cfg, settings, "noise")
                dataset.append(args.data, "noise", [row])
                if row["status"] == "ok":
                    again.append(row)
            times = [float(orig["iter_time_s"])] + [r["iter_time_s"] for r in again]
            mems = [float(orig["peak_mem_bytes"])] + [float(r["peak_mem_bytes"]) for r in again]
            cvs.append(cv(times))
            mem_cvs.append(cv(mems))
            plan = ",".join(str(orig["plan"]).split(",")[:5])
            print(f"{orig['family']:7} {plan:28} {int(orig['batch']):5d} {times[0]:9.4f} "
                  f"{' '.join(f'{t:.4f}' for t in times[1:]):>22} {cvs[-1]:6.3f}", flush=True)
    ok = [c for c in cvs if c == c]
    print(f"\niteration time CV over {len(ok)} configurations: mean {statistics.fmean(ok):.3f}, "
          f"median {statistics.median(ok):.3f}, max {max(ok):.3f}")
    okm = [c for c in mem_cvs if c == c]
    print(f"peak memory CV: mean {statistics.fmean(okm):.3f}, max {max(okm):.3f}")
    return 0


def report(root: str) -> int:
    """CV and MRE floor per re-measured configuration, each session's drift, and the dataset's floor."""
    table, drift = remeasured(root)
    if table.empty:
        print(f"{root}: the noise table is empty; run without --report-only first", file=sys.stderr)
        return 2
    print("sessions (hour): re-measurements / originals, median: " + ", ".join(f"{s} {r:.3f}" for s, r in drift.items()))
    print(f"{'family':7} {'plan':22} {'batch':>5} {'CV median':>9} {'CV best':>8} {'runs':>4} {'floor %':>7}")
    for r in table.itertuples(index=False):
        print(f"{r.family:7} {r.plan:22} {r.batch:5d} {r.cv:9.3f} {r.cv_best:8.3f} {r.runs:4d} {100 * r.floor:7.2f}")
    for label, col in (("median step", "cv"), ("best step", "cv_best")):
        print(f"iteration time CV ({label}) over {len(table)} configurations: mean {table[col].mean():.3f}, "
              f"median {table[col].median():.3f}, max {table[col].max():.3f}")
    by_kind = table.groupby("kind")["floor_steady"].agg(["mean", "size"])
    print("MRE floor by plan kind, drift taken out: "
          + ", ".join(f"{kind} {100 * r['mean']:.2f} % ({int(r['size'])})" for kind, r in by_kind.iterrows()))
    print(f"MRE floor (a predictor that knew each configuration's mean time, scored against one measurement as the "
          f"paper protocol's test rows are): {floor_of(table)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
