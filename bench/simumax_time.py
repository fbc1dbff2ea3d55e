"""Megatron-Core's BF16 linear GEMM rate on B200, chosen leave-one-plan-out on SimuMax's B200 runs.

../shared/ground_truth/simumax_b200_llama70b.csv holds 12 real Megatron-LM + Transformer Engine runs on 8 B200 in
BF16 with nothing overlapped: four plans (tp1/pp2, tp2, tp4, tp8) at 4, 8 and 32 micro-batches. The recorded
Megatron-Core constants were chosen on the FP8 rows of megatron_bridge_2511.csv, which fix gemm_eff_max only through
its product with the FP8 GEMM's device-fact efficiency for the linears: they say nothing of a BF16 linear's rate. Here the one constant those
runs measure, `AnalyticalConfig.bf16_gemm_eff_max` on B200, is searched over GRID with every other constant as
recorded for Blackwell. The file's README allows a constant chosen by cross-validation inside it: each plan's
three runs are held out together and predicted with the value the other three plans choose (leave-one-plan-out);
the in-file figure, chosen on every plan, is printed beside it. Prior, the grid's reason: the B200 public BF16 GEMM
table's 0.679 (`roofline.device_config`) is the most a GEMM reaches; the grid runs down to 0.40.

    flock /tmp/scaledl-heavy.lock .venv/bin/python -m bench.simumax_time [--shared PATH] [--record]

`--record` stores the in-file value in predictor/checkpoints/framework-constants.json among Megatron-Core's
"by_device" constants, for B200 alone: every Megatron-Core BF16 prediction on a B200 then uses it. The other
Blackwell devices (GB200, GB300, B300) run other power limits and data-sheet peaks, and no run of them is here.
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from bench import common, memory_eval, modern_eval
from predictor.frameworks import FRAMEWORKS
from predictor.frameworks.base import CONSTANTS_FILE
from predictor.graph.cache import graph_for
from predictor.models.roofline import AnalyticalConfig, framework_config
from predictor.spec.hardware import GENERATIONS

FIELD = "bf16_gemm_eff_max"
DEVICE = "b200"
GENERATION = GENERATIONS[DEVICE]
GRID: tuple[float, ...] = tuple(np.round(np.arange(0.40, 0.6801, 0.01), 2))


@dataclass(frozen=True)
class Fit:
    """The runs predicted with the constant chosen on every plan (in-file) and without each run's plan (cv)."""

    frame: pd.DataFrame
    measured: np.ndarray  # seconds
    plans: np.ndarray  # each run's plan, tp/pp/dp
    in_file: np.ndarray
    cv: np.ndarray
    chosen: dict[str, float]  # the value chosen without each plan
    in_file_value: float
    params: np.ndarray  # each run's model parameters (its size of work)

    @property
    def workloads(self) -> np.ndarray:
        """Each run's workload (depth and global batch): the plans of one micro-batch count."""
        return self.frame[["layers", "global_batch"]].astype(str).agg("/".join, axis=1).to_numpy()


def base_config() -> AnalyticalConfig:
    """Megatron-Core's recorded constants on B200 without the value this module chooses."""
    return replace(framework_config(FRAMEWORKS["megatron"], GENERATION, DEVICE), **{FIELD: None})


def fit(path: Path) -> Fit:
    """Every run predicted at every grid value once; each held-out plan takes the value with the lowest MAPE on the
    other plans' runs."""
    df = pd.read_csv(path, comment="#")
    built = [memory_eval.simumax_workload(r) for r in df.to_dict("records")]
    rows = [(spec, graph_for(spec.model), plan) for spec, plan in built]
    measured = df["iteration_ms"].to_numpy() / 1e3
    plans = df[["tp", "pp", "dp"]].astype(str).agg("/".join, axis=1).to_numpy()
    base = base_config()
    table = np.array([modern_eval.predict_rows(rows, replace(base, **{FIELD: value})) for value in GRID])
    choice = common.leave_one_group_out(table, measured, plans)
    return Fit(df, measured, plans, table[choice.in_file], choice.cv,
               {plan: float(GRID[i]) for plan, i in choice.without.items()}, float(GRID[choice.in_file]),
               np.array([graph.params for _, graph, _ in rows], dtype=float))


def record(result: Fit) -> None:
    """Store the in-file value as Megatron-Core's own B200 constant, with its cross-validated MAPE."""
    common.record_constants(CONSTANTS_FILE, "megatron", {
        "constants": {FIELD: result.in_file_value},
        "source": f"{memory_eval.SIMUMAX}: {len(result.measured)} BF16 runs of {len(set(result.plans))} plans on 8 "
                  f"B200, chosen on all of them (MAPE {100 * modern_eval.mape(result.in_file, result.measured):.1f}%); "
                  f"leave-one-plan-out MAPE {100 * modern_eval.mape(result.cv, result.measured):.1f}%",
        "measured_by": "bench/simumax_time.py --record", "date": datetime.date.today().isoformat()}, device=DEVICE)


def main() -> int:
    parser = common.parser(__doc__, shared=True)
    parser.add_argument("--record", action="store_true", help="store the in-file value (see the module docstring)")
    args = parser.parse_args()
    (path,) = common.ground_truth(args.shared, memory_eval.SIMUMAX)
    result = fit(path)
    print(f"## {memory_eval.SIMUMAX}: iteration time, Megatron-Core's {FIELD} on {DEVICE} over {GRID[0]}-{GRID[-1]}")
    print(f"{'tp/pp/dp':<9} {'m':>3} {'measured s':>10} {'in-file':>8} {'cv':>8}")
    for j, r in enumerate(result.frame.to_dict("records")):
        print(f"{result.plans[j]:<9} {int(r['micro_batches']):>3} {result.measured[j]:>10.3f} "
              f"{100 * (result.in_file[j] / result.measured[j] - 1):>+7.1f}% {100 * (result.cv[j] / result.measured[j] - 1):>+7.1f}%")
    for name, predicted in (("in-file", result.in_file), ("leave-one-plan-out", result.cv)):
        print(f"MAPE {name}: {100 * modern_eval.mape(predicted, result.measured):.1f}%")
    print("chosen without each plan: " + ", ".join(f"{p}: {v}" for p, v in result.chosen.items())
          + f"; on every plan (in-file): {result.in_file_value}")
    if args.record:
        record(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
