"""How noisy a profile dataset's measurements are, and so how low any predictor's error on it can go.

A dataset's `noise` table holds re-measurements of some of its configurations (`bench/noise.py`).
Per configuration, the original and its re-measurements give a coefficient of variation and the
MRE *floor*: the mean relative error, against one of the measurements, of a predictor that knew
the configuration's true mean time. Test rows are single measurements, so no predictor's MRE on
the dataset can be expected below the floor. Re-measurements made in another session (another
hour, another day) also carry the machine's drift in speed since the collection; the floor is
also given with each session's drift (the median ratio of its re-measurements to the originals)
taken out, the lower estimate.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from predictor.data import dataset
from predictor.plan import Plan


def cv(xs: list[float]) -> float:
    """Coefficient of variation (population std / mean); nan for fewer than two values."""
    return statistics.pstdev(xs) / statistics.fmean(xs) if len(xs) > 1 and statistics.fmean(xs) > 0 else float("nan")


def mre_floor(xs: list[float]) -> float:
    """Mean relative error against one of the measurements `xs` of a predictor that knew their true mean.
    Deviations from the sample mean understate deviations from the true mean by sqrt((n-1)/n), undone here."""
    n, mean = len(xs), statistics.fmean(xs)
    return statistics.fmean(abs(x - mean) / x for x in xs) * math.sqrt(n / (n - 1))


def bootstrap_interval(values: list[float], seed: int = 0, draws: int = 2000) -> tuple[float, float]:
    """90 % bootstrap interval of the mean of `values` (one per configuration) over resampled configurations."""
    rng = np.random.default_rng(seed)
    means = rng.choice(np.asarray(values), size=(draws, len(values))).mean(1)
    return float(np.quantile(means, 0.05)), float(np.quantile(means, 0.95))


def remeasured(root: str | Path) -> tuple[pd.DataFrame, pd.Series]:
    """One row per re-measured configuration (family, kind, plan, batch, runs, cv, cv_best, floor, floor_steady) and
    each session's drift (median re-measurement / original, by hour); empty when nothing was re-measured."""
    noise = dataset.load(root, "noise")
    noise = noise[noise["status"] == "ok"]
    if noise.empty:
        return pd.DataFrame(), pd.Series(dtype=float)
    orig = dataset.load(root).set_index("config_id")
    noise = noise[noise["config_id"].isin(orig.index)]
    noise = noise.assign(session=noise["measured_at"].astype(str).str[:13],
                         ratio=noise["iter_time_s"] / noise["config_id"].map(orig["iter_time_s"]))
    drift = noise.groupby("session")["ratio"].median()
    rows = []
    for cid, again in noise.groupby("config_id"):
        first = orig.loc[cid]
        times = [float(first["iter_time_s"])] + again["iter_time_s"].tolist()
        best = [float(first["iter_time_min_s"])] + again["iter_time_min_s"].tolist()
        steady = [times[0]] + (again["iter_time_s"] / again["session"].map(drift)).tolist()
        rows.append({"family": first["family"], "kind": Plan.parse(first["plan"]).kind,
                     "plan": ",".join(str(first["plan"]).split(",")[:4]),
                     "batch": int(first["batch"]), "runs": len(times), "cv": cv(times), "cv_best": cv(best),
                     "floor": mre_floor(times), "floor_steady": mre_floor(steady)})
    return pd.DataFrame(rows).sort_values(["family", "plan", "batch"]).reset_index(drop=True), drift


@dataclass(frozen=True)
class NoiseFloor:
    """The MRE floor of a dataset in %, as measured and with each session's drift taken out, with 90 % intervals."""

    configs: int
    floor_pct: float
    floor_interval: tuple[float, float]
    steady_pct: float
    steady_interval: tuple[float, float]

    def __str__(self) -> str:
        return (f"{self.steady_pct:.1f} % MRE (90 % interval {self.steady_interval[0]:.1f}-{self.steady_interval[1]:.1f} %; "
                f"{self.floor_pct:.1f} % counting the machine's drift between sessions), from {self.configs} "
                f"re-measured configurations")


def noise_floor(root: str | Path) -> NoiseFloor | None:
    """The dataset's MRE floor, or None when its noise table is empty."""
    return floor_of(remeasured(root)[0])


def floor_of(table: pd.DataFrame) -> NoiseFloor | None:
    """The MRE floor over the configurations of a `remeasured` table, or None when it is empty."""
    if table.empty:
        return None
    floor, steady = (100 * table["floor"]).tolist(), (100 * table["floor_steady"]).tolist()
    return NoiseFloor(len(table), statistics.fmean(floor), bootstrap_interval(floor),
                      statistics.fmean(steady), bootstrap_interval(steady))
