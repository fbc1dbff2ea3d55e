"""Measurement noise of a profile dataset: re-measure configurations and print their coefficient of variation.

    .venv/bin/python bench/noise.py --data predictor/data/cpu --configs 20 --repeats 2

Picks `--configs` measured configurations at random (seeded, spread over families), measures
each again `--repeats` times with the dataset's own settings, appends the new measurements to
the dataset's `noise` table and prints, per configuration and overall, the coefficient of
variation (std / mean) of the iteration time over the original and the repeated measurements.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predictor import dataset  # noqa: E402
from predictor.design import ProfileConfig  # noqa: E402
from predictor.measure.iteration import WorkerPool  # noqa: E402
from predictor.plan import Plan  # noqa: E402
from predictor.profile import ProfileSettings, measure_config  # noqa: E402
from predictor.workload import ModelSpec  # noqa: E402


def _cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs) if len(xs) > 1 and statistics.fmean(xs) > 0 else float("nan")


def _floor(xs: list[float]) -> float:
    """Mean relative error against one of the measurements `xs` of a predictor that knew the configuration's
    true mean time: the floor of the MRE any predictor scores on single-measurement test targets. Deviations
    from the sample mean understate deviations from the true mean by sqrt((n-1)/n), undone here."""
    n, mean = len(xs), statistics.fmean(xs)
    return statistics.fmean(abs(x - mean) / x for x in xs) * math.sqrt(n / (n - 1))


def _interval(values: list[float], seed: int = 0, draws: int = 2000) -> tuple[float, float]:
    """90 % bootstrap interval of the mean of `values` over resampled configurations."""
    rng = np.random.default_rng(seed)
    means = rng.choice(np.asarray(values), size=(draws, len(values))).mean(1)
    return float(np.quantile(means, 0.05)), float(np.quantile(means, 0.95))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
            cvs.append(_cv(times))
            mem_cvs.append(_cv(mems))
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
    """CV per re-measured configuration (original + stored re-measurements), for the median and the best step,
    and the MRE floor, also with each session's drift (the machine's speed that hour against the collection's,
    the median ratio of its re-measurements to the originals) taken out of its re-measurements."""
    orig = dataset.load(root).set_index("config_id")
    noise = dataset.load(root, "noise")
    noise = noise[noise["status"] == "ok"]
    if noise.empty:
        print(f"{root}: the noise table is empty; run without --report-only first", file=sys.stderr)
        return 2
    noise = noise.assign(session=noise["measured_at"].astype(str).str[:13],
                         ratio=noise["iter_time_s"] / noise["config_id"].map(orig["iter_time_s"]))
    drift = noise.groupby("session")["ratio"].median()
    print("sessions (hour): re-measurements / originals, median: "
          + ", ".join(f"{session} {ratio:.3f} ({(noise['session'] == session).sum()} runs)" for session, ratio in drift.items()))
    lines = []
    for cid, again in noise.groupby("config_id"):
        first = orig.loc[cid]
        med = [float(first["iter_time_s"])] + again["iter_time_s"].tolist()
        best = [float(first["iter_time_min_s"])] + again["iter_time_min_s"].tolist()
        steady = [med[0]] + (again["iter_time_s"] / again["session"].map(drift)).tolist()
        kind = ",".join(str(first["plan"]).split(",")[:4])
        lines.append((first["family"], kind, int(first["batch"]), _cv(med), _cv(best), len(med), _floor(med),
                      _floor(steady)))
    print(f"{'family':7} {'plan':22} {'batch':>5} {'CV median':>9} {'CV best':>8} {'runs':>4} {'floor %':>7}")
    for fam, kind, batch, cv_med, cv_best, n, floor, _ in sorted(lines):
        print(f"{fam:7} {kind:22} {batch:5d} {cv_med:9.3f} {cv_best:8.3f} {n:4d} {100 * floor:7.2f}")
    for label, col in (("median step", 3), ("best step", 4)):
        cvs = [line[col] for line in lines]
        print(f"iteration time CV ({label}) over {len(cvs)} configurations: mean {statistics.fmean(cvs):.3f}, "
              f"median {statistics.median(cvs):.3f}, max {max(cvs):.3f}")
    print("MRE floor (a predictor that knew each configuration's mean time, scored against one measurement as the "
          "paper protocol's test rows are):")
    for label, col in (("as measured", 6), ("each session's drift taken out", 7)):
        floors = [100 * line[col] for line in lines]
        low, high = _interval(floors)
        print(f"  {label}: {statistics.fmean(floors):.2f} % (90 % bootstrap interval {low:.2f}-{high:.2f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
