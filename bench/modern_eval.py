"""Accuracy of the analytical model on Megatron-Core performance recipes (H100, B200, GB200, GB300).

Predicts every row of ../shared/ground_truth/megatron_bridge_2511.csv with its exact plan as its recipe ran it
(`bench.memory_eval.recipe_workload`: the parallel plan of `predictor.data.evaluate.bridge_workload`, MoE rows with their
expert parallel size, with the recipe's recomputed modules, offloaded layers and BF16 gradients and moments, which
change both the time and the memory) and prints per-row errors
and the MAPE of the dense rows and of the MoE rows apart.

The file may calibrate constants that describe the framework or the hardware, never a row: the
grid of `AnalyticalConfig` constants below (large-GEMM efficiency; overlap is the schedule's, `predictor.models.overlap`) is searched on
the rows of three systems and scored on the fourth (leave-one-system-out); the cross-validated MAPE is printed
beside the first-principles one and the in-file one (constants chosen on every row). Each row is priced with the
grid's constants over its device generation's first principles (`device_config`, as `framework_config` applies
recorded constants): the FP8 and FP4 GEMM kernels' efficiency is a device fact, and the quantisation work around
them is priced by `predictor.models.lowprec`, so neither is fitted here. The MoE rows are predicted with the dense constants (for a
held-out system: those chosen without it) and calibrate only the MoE constants (grouped-GEMM and all-to-all
efficiency, MOE_GRID) the same way, leave-one-system-out over the MoE rows, so the dense figures do not move.

Memory: every row ran, so each plan's predicted per-GPU peak should fit the device; rows predicted
over its capacity are counted (the file gives no memory figures).

    .venv/bin/python -m bench.modern_eval [--shared PATH] [--no-calibrate] [--record]

`--record` writes the in-file constants (dense and MoE) to predictor/checkpoints/framework-constants.json (the
Megatron-Core profile's constants every prediction of that framework then uses) and each system's
leave-one-system-out MAPE to predictor/checkpoints/analytical-accuracy.json (what `scaledl plan`
reports as the analytical model's measured accuracy on that device).
"""

from __future__ import annotations

import datetime
import itertools
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from bench import common
from bench.memory_eval import recipe_workload
from predictor.data.evaluate import BRIDGE_DEVICES, bridge_measured_s
from predictor.frameworks.base import CONSTANTS_FILE
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.intervals import residual_quantiles
from predictor.models.registry import ANALYTICAL_ACCURACY
from predictor.models.roofline import CALIBRATED_FIELDS, MOE_CALIBRATED_FIELDS, AnalyticalConfig, device_config
from predictor.spec.hardware import GENERATIONS
from predictor.spec.resolver import get_device

FILE = "megatron_bridge_2511.csv"
# The constants calibrated, each over a range its docstring in AnalyticalConfig argues for.
GRID: dict[str, tuple[float, ...]] = {
    "gemm_eff_max": (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9),
}
assert tuple(GRID) == CALIBRATED_FIELDS
# MoE constants, each over a range its docstring argues for (1.0: first principles).
MOE_GRID: dict[str, tuple[float, ...]] = {
    "grouped_gemm_eff": (0.4, 0.5, 0.6, 0.7, 0.8, 1.0),
    "expert_host_s": (0.0, 50e-6, 100e-6, 150e-6, 200e-6, 300e-6),
}
assert tuple(MOE_GRID) == MOE_CALIBRATED_FIELDS


def load_rows(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path, comment="#")
    df["measured_s"] = [bridge_measured_s(r) for r in df.to_dict("records")]
    return df


# Every constant Megatron-Core records: this file's and bench/simumax_time.py's B200 BF16 linear rate.
RECORDED_FIELDS: tuple[str, ...] = (*CALIBRATED_FIELDS, *MOE_CALIBRATED_FIELDS, "bf16_gemm_eff_max")


def predict_rows(rows: list[tuple], cfg: AnalyticalConfig | None) -> np.ndarray:
    """Predicted iteration seconds of (spec, graph, plan) rows under `cfg`'s recorded-kind constants (RECORDED_FIELDS)
    over each row's device generation's first principles, as `framework_config` applies recorded ones (None: the
    recorded constants)."""
    return np.array([AnalyticalPredictor(None if cfg is None else replace(
        device_config(GENERATIONS[spec.cluster.device]), **{k: getattr(cfg, k) for k in RECORDED_FIELDS}))
        .predict(spec, graph, [plan])[0].iter_time_s for spec, graph, plan in rows])


def first_principles(rows: list[tuple]) -> np.ndarray:
    """Predicted iteration seconds of the rows under their device generation's first principles alone."""
    return np.array([AnalyticalPredictor(device_config(GENERATIONS[spec.cluster.device]))
                     .predict(spec, graph, [plan])[0].iter_time_s for spec, graph, plan in rows])


def peak_memory(rows: list[tuple]) -> np.ndarray:
    """Predicted per-GPU peak GiB of each row (memory does not depend on the calibrated time constants)."""
    model = AnalyticalPredictor(AnalyticalConfig())
    return np.array([model.predict(spec, graph, [plan])[0].peak_memory_gib for spec, graph, plan in rows])


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured))


def configs(base: AnalyticalConfig | None = None, grid: dict[str, tuple[float, ...]] = GRID) -> list[AnalyticalConfig]:
    """Every combination of `grid`'s values over `base` (default: first principles)."""
    keys = list(grid)
    return [replace(base or AnalyticalConfig(), **dict(zip(keys, values))) for values in itertools.product(*grid.values())]


def choose(rows: list[tuple], measured: np.ndarray, grid: list[AnalyticalConfig]) -> AnalyticalConfig:
    """The grid's config with the lowest MAPE on these rows."""
    scores = [mape(predict_rows(rows, cfg), measured) for cfg in grid]
    return grid[int(np.argmin(scores))]


class Rows:
    """Rows of the file as (spec, graph, plan), with their measured seconds and systems."""

    def __init__(self, df: pd.DataFrame, built: list[tuple]) -> None:
        self.index = [i for i, _, _ in built]
        self.rows = [(spec, graph_for(spec.model), plan) for _, spec, plan in built]
        self.measured = df.loc[self.index, "measured_s"].to_numpy()
        self.systems = df.loc[self.index, "system"].to_numpy()
        self.frame = df.loc[self.index]

    @classmethod
    def of(cls, df: pd.DataFrame, built: list[tuple], moe: bool) -> "Rows":
        """The rows of `built` (`recipe_rows`) whose models are MoE (`moe`) or dense."""
        return cls(df, [(i, spec, plan) for i, spec, plan in built if spec.model.is_moe == moe])


def recipe_rows(df: pd.DataFrame) -> list[tuple]:
    """The file's rows a preset describes, each as (index, workload, plan) as its recipe ran (`recipe_workload`)."""
    return [(i, *w) for i, r in enumerate(df.to_dict("records")) if (w := recipe_workload(r)) is not None]


def calibrate(rows: Rows, grid_for) -> tuple[dict[str, AnalyticalConfig], np.ndarray, AnalyticalConfig]:
    """Leave-one-system-out: per system, the grid's (`grid_for(system)`) best config on the other systems' rows
    and its predictions of the held-out rows; and the grid's (over no held-out system) best on every row."""
    cv = np.empty(len(rows.rows))
    chosen = {}
    for system in sorted(set(rows.systems)):
        train = rows.systems != system
        cfg = choose([r for r, t in zip(rows.rows, train) if t], rows.measured[train], grid_for(system))
        chosen[system] = cfg
        cv[~train] = predict_rows([r for r, t in zip(rows.rows, train) if not t], cfg)
    return chosen, cv, choose(rows.rows, rows.measured, grid_for(None))


def print_rows(kind: str, rows: Rows, table: dict[str, np.ndarray]) -> int:
    """Per-row errors and the MAPE of each column of `table`; returns the rows predicted over their GPU's memory."""
    memory = peak_memory(rows.rows)
    capacity = np.array([get_device(spec.cluster.device).mem_capacity / 2**30 for spec, _, _ in rows.rows])
    measured, systems = rows.measured, rows.systems
    print(f"\n### {kind} rows")
    print(f"{'system':<10} {'model':<20} {'prec':<7} {'plan':<64} {'measured s':>10} {'peak GiB':>12} "
          + " ".join(f"{name[:12]:>12}" for name in table))
    for j, (spec, _, plan) in enumerate(rows.rows):
        r = rows.frame.iloc[j]
        errs = " ".join(f"{100 * (p[j] - measured[j]) / measured[j]:>+11.1f}%" for p in table.values())
        short = f"dp={plan.dp},tp={plan.tp},pp={plan.pp},cp={plan.cp},v={plan.v},mbs={plan.mbs},zero={plan.zero}"
        short += f",ep={plan.ep}" if plan.ep > 1 else ""
        print(f"{r['system']:<10} {r['model']:<20} {r['precision']:<7} {short:<64} {measured[j]:>10.3f} "
              f"{memory[j]:>6.0f}/{capacity[j]:<5.0f} {errs}")
    for name, p in table.items():
        per_system = ", ".join(f"{s} {100 * mape(p[systems == s], measured[systems == s]):.1f}%" for s in sorted(set(systems)))
        print(f"MAPE {kind}, {name}: {100 * mape(p, measured):.1f}%  ({per_system})")
    return int((memory > capacity).sum())


@dataclass
class Evaluation:
    """The file's rows predicted: dense and MoE rows apart, each with its predictions under every set of constants
    (first principles; recorded; leave-one-system-out and in-file when calibrated) and the constants chosen."""

    dense: Rows
    moe: Rows
    skipped: int
    table: dict[str, np.ndarray]
    moe_table: dict[str, np.ndarray]
    chosen: dict[str, AnalyticalConfig] = field(default_factory=dict)
    moe_chosen: dict[str, AnalyticalConfig] = field(default_factory=dict)
    in_file: AnalyticalConfig | None = None
    moe_in_file: AnalyticalConfig | None = None


def evaluate(path: Path, calibrate_constants: bool = True, recorded: bool = True) -> Evaluation:
    """Every row of the file predicted; `calibrate_constants` adds the leave-one-system-out and in-file columns,
    `recorded` the column of the constants recorded in CONSTANTS_FILE (when that file exists)."""
    df = load_rows(path)
    built = recipe_rows(df)
    dense, moe = Rows.of(df, built, moe=False), Rows.of(df, built, moe=True)
    out = Evaluation(dense, moe, len(df) - len(built), {"first principles": first_principles(dense.rows)},
                     {"first principles": first_principles(moe.rows)})
    if CONSTANTS_FILE.is_file() and recorded:
        out.table["recorded"] = predict_rows(dense.rows, None)
        out.moe_table["recorded"] = predict_rows(moe.rows, None)
    if calibrate_constants:
        out.chosen, out.table["leave-one-system-out"], out.in_file = calibrate(dense, lambda held_out: configs())
        out.table["in-file"] = predict_rows(dense.rows, out.in_file)
        # MoE constants over the dense constants chosen without the held-out system (in-file: over all rows').
        out.moe_chosen, out.moe_table["leave-one-system-out"], out.moe_in_file = calibrate(
            moe, lambda held_out: configs(out.chosen.get(held_out, out.in_file), MOE_GRID))
        out.moe_table["in-file"] = predict_rows(moe.rows, out.moe_in_file)
    return out


def tokens_per_expert(rows: Rows) -> np.ndarray:
    """Each MoE row's tokens per expert and micro-batch, what sizes its grouped GEMMs: the micro-batch's tokens per
    context-parallel rank, routed top_k times and gathered from the expert-parallel group, over the experts."""
    return np.array([plan.mbs * spec.model.tokens / plan.cp * spec.model.top_k * plan.ep / spec.model.experts
                     for spec, _, plan in rows.rows], dtype=float)


def workloads(rows: Rows) -> np.ndarray:
    """Each row's workload (system, model, GPUs, global batch, sequence): the recipes run one plan each."""
    return rows.frame[["system", "model", "gpus", "gbs", "seq_len"]].astype(str).agg("/".join, axis=1).to_numpy()


def main() -> int:
    parser = common.parser(__doc__, shared=True)
    parser.add_argument("--no-calibrate", action="store_true", help="first-principles constants only")
    parser.add_argument("--record", action="store_true", help="store the in-file constants and the cross-validated "
                        "accuracy per device (see the module docstring)")
    args = parser.parse_args()
    if args.record and args.no_calibrate:
        parser.error("--record stores calibrated constants; drop --no-calibrate")
    (path,) = common.ground_truth(args.shared, FILE)
    t0 = time.perf_counter()
    ev = evaluate(path, not args.no_calibrate, recorded=not args.record)
    dense, moe = ev.dense, ev.moe
    print(f"## {FILE}: {len(dense.rows)} dense and {len(moe.rows)} MoE rows predicted"
          + (f", {ev.skipped} not modelled" if ev.skipped else ""))
    dense_over = print_rows("dense", dense, ev.table)
    moe_over = print_rows("MoE", moe, ev.moe_table)
    if not args.no_calibrate:
        keys = list(GRID)
        for system, cfg in ev.chosen.items():
            print(f"constants chosen without {system}: " + ", ".join(f"{k}={asdict(cfg)[k]}" for k in keys))
        print("constants chosen on every row (in-file): " + ", ".join(f"{k}={asdict(ev.in_file)[k]}" for k in keys))
        for system, cfg in ev.moe_chosen.items():
            print(f"MoE constants chosen without {system}: " + ", ".join(f"{k}={asdict(cfg)[k]}" for k in MOE_GRID))
        print("MoE constants chosen on every MoE row (in-file): "
              + ", ".join(f"{k}={asdict(ev.moe_in_file)[k]}" for k in MOE_GRID))
    print(f"memory: {dense_over}/{len(dense.rows)} dense and {moe_over}/{len(moe.rows)} MoE rows that ran are predicted "
          f"over their GPU's capacity")
    print(f"({time.perf_counter() - t0:.1f} s)")
    if args.record:
        cv = ev.table["leave-one-system-out"]
        systems = dense.systems
        record(replace(ev.in_file, **{k: asdict(ev.moe_in_file)[k] for k in MOE_GRID}),
               {s: (mape(cv[systems == s], dense.measured[systems == s]), int((systems == s).sum()))
                for s in sorted(set(systems))}, len(dense.rows), mape(cv, dense.measured),
               len(moe.rows), mape(ev.moe_table["leave-one-system-out"], moe.measured), dense.measured, cv)
    return 0


def record(cfg: AnalyticalConfig, cv_by_system: dict[str, tuple[float, int]], rows: int, cv_all: float,
           moe_rows: int, moe_cv: float, measured: np.ndarray, cv: np.ndarray) -> None:
    """Store the Megatron-Core constants and each device's cross-validated accuracy (atomically), with the residual
    quantiles of its prediction intervals: pooled over every dense row's leave-one-system-out residual (`measured`
    against `cv`), since two or three rows per system cannot place an 80 % interval's tails."""
    today = datetime.date.today().isoformat()
    common.record_constants(CONSTANTS_FILE, "megatron", {
        "constants": {k: asdict(cfg)[k] for k in (*CALIBRATED_FIELDS, *MOE_CALIBRATED_FIELDS)},
        "generations": sorted({GENERATIONS[d] for d in BRIDGE_DEVICES.values()}),
        "source": f"{FILE}: {rows} dense rows, chosen on all of them; leave-one-system-out MAPE {100 * cv_all:.1f}%; "
                  f"MoE constants on its {moe_rows} MoE rows with the dense ones fixed, leave-one-system-out MAPE "
                  f"{100 * moe_cv:.1f}%",
        "measured_by": "bench/modern_eval.py --record", "date": today})
    quantiles = {**residual_quantiles(measured, cv), "pooled": f"the {rows} dense rows of every system, each held out with its system"}
    common.merge_json(ANALYTICAL_ACCURACY, {BRIDGE_DEVICES[system]: {
        "mape_pct": round(100 * error, 2), "rows": n, "date": today, "framework": "megatron",
        "source": f"{FILE} (Megatron-Core recipes, dense rows; {system} held out while the framework constants were "
                  f"chosen)", "measured_by": "bench/modern_eval.py --record", "residual_quantiles": quantiles}
        for system, (error, n) in cv_by_system.items()})


if __name__ == "__main__":
    sys.exit(main())
