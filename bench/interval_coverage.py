"""Coverage of the analytical model's 80 % prediction intervals on held-out runs: intervals placed from one part of
the public measurements, coverage counted on the other.

`scaledl plan` gives each plan [t (1 + low), t (1 + high)], with low and high the 10th and 90th percentiles of the
signed relative residuals (measured / predicted - 1) recorded per device by bench/vtrain_eval.py --record and
bench/modern_eval.py --record (`predictor.models.intervals.residual_quantiles`). This checks that such an
interval holds about 80 % of runs it was not placed from:

- vTrain's 109 multi-node A100 runs: random halves (intervals from one half, coverage on the other; mean and
  5-95 % range over --splits seeded splits), and leave-one-model-out (intervals from the other GPT sizes);
- Megatron-Core's dense recipes (leave-one-system-out residuals, as recorded): leave-one-system-out intervals;
- across data sets: the A100 intervals on the Megatron-Core rows, and the reverse.

    nice .venv/bin/python -m bench.interval_coverage [--shared PATH] [--splits 500]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from bench import common, modern_eval, vtrain_eval
from predictor.models.intervals import INTERVAL_COVERAGE, residual_quantiles


def covered(q: dict, measured: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Which runs lie inside their prediction's interval."""
    return (measured >= predicted * (1 + q["low"])) & (measured <= predicted * (1 + q["high"]))


def held_out(groups: np.ndarray, measured: np.ndarray, predicted: np.ndarray) -> tuple[float, dict[str, float]]:
    """Leave-one-group-out coverage, pooled over the rows and per group."""
    inside = np.zeros(len(measured), bool)
    per = {}
    for g in sorted(set(groups)):
        test = groups == g
        q = residual_quantiles(measured[~test], predicted[~test])
        inside[test] = covered(q, measured[test], predicted[test])
        per[str(g)] = float(inside[test].mean())
    return float(inside.mean()), per


def vtrain_rows(shared: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    df = vtrain_eval.predict_file(shared / "ground_truth" / "vtrain_ground_truth_multi.csv", "analytical")
    ok = df.dropna(subset=["predicted (ms)"])
    models = ok[vtrain_eval.MODEL_COLS].astype(int).astype(str).agg("/".join, axis=1).to_numpy()
    return ok["iteration time (ms)"].to_numpy(), ok["predicted (ms)"].to_numpy(), models


def bridge_rows(shared: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The dense recipes' measured seconds, their leave-one-system-out predictions and their systems."""
    df = modern_eval.load_rows(shared / "ground_truth" / modern_eval.FILE)
    dense = modern_eval.Rows.of(df, modern_eval.recipe_rows(df), moe=False)
    _, cv, _ = modern_eval.calibrate(dense, lambda held: modern_eval.configs())
    return dense.measured, cv, dense.systems


def main() -> int:
    parser = common.parser(__doc__, shared=True)
    parser.add_argument("--splits", type=int, default=500, help="random half splits of the vTrain rows")
    args = parser.parse_args()
    shared = Path(args.shared)
    print(f"stated coverage {INTERVAL_COVERAGE * 100:.0f} % (10th to 90th percentile of measured / predicted - 1)")
    vm, vp, models = vtrain_rows(shared)
    rng = np.random.default_rng(0)
    halves = []
    for _ in range(args.splits):
        order = rng.permutation(len(vm))
        a, b = order[: len(vm) // 2], order[len(vm) // 2:]
        halves.append(covered(residual_quantiles(vm[a], vp[a]), vm[b], vp[b]).mean())
    lo, hi = np.percentile(halves, [5, 95])
    print(f"vTrain A100 ({len(vm)} runs), random halves x{args.splits}: coverage {100 * np.mean(halves):.1f} % "
          f"(5-95 %: {100 * lo:.1f}-{100 * hi:.1f} %)")
    pooled, per = held_out(models, vm, vp)
    print(f"vTrain A100, leave-one-model-out: coverage {100 * pooled:.1f} % ("
          + ", ".join(f"{m} {100 * c:.0f} %" for m, c in per.items()) + ")")
    bm, bp, systems = bridge_rows(shared)
    pooled, per = held_out(systems, bm, bp)
    print(f"Megatron-Core dense ({len(bm)} runs), leave-one-system-out: coverage {100 * pooled:.1f} % ("
          + ", ".join(f"{s} {100 * c:.0f} %" for s, c in per.items()) + ")")
    print(f"A100 intervals on the Megatron-Core rows: {100 * covered(residual_quantiles(vm, vp), bm, bp).mean():.1f} %; "
          f"Megatron-Core intervals on the A100 rows: {100 * covered(residual_quantiles(bm, bp), vm, vp).mean():.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
