"""What the bench scripts share: where the repository, its results and the public measurements are, how a script
reads its command line, and the error and ranking measures every accuracy table reports.

The scripts are modules of the `bench` package, run from the repository root (`.venv/bin/python -m bench.vtrain_eval`),
so one imports another's functions (bench/accuracy.py runs the eval scripts' tables) and none edits `sys.path`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SHARED = ROOT.parent / "shared"


def merge_json(path: Path, entries: dict) -> None:
    """Replace the top-level `entries` of the JSON file at `path` (created when missing), keeping its other keys, and
    write it atomically, so a script that records one framework's or one device's figures leaves the others'."""
    table = json.loads(path.read_text()) if path.is_file() else {}
    table.update(entries)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    print(f"recorded in {path}")


def record_constants(path: Path, framework: str, entry: dict, device: str | None = None) -> None:
    """Store `framework`'s constants in the framework-constants file at `path`: `entry` as its generations' fit,
    keeping the per-device fits other files chose, or, given `device`, as that device's own fit."""
    current = (json.loads(path.read_text()) if path.is_file() else {}).get(framework, {})
    by_device = {**current.get("by_device", {}), **({device: entry} if device else {})}
    merged = {**(current if device else entry), **({"by_device": by_device} if by_device else {})}
    merge_json(path, {framework: merged})


def parser(doc: str, shared: bool = False) -> argparse.ArgumentParser:
    """A script's parser, described by the first line of its docstring; `shared` adds --shared, the folder holding
    ground_truth/ (the public measurements, kept outside the repository)."""
    out = argparse.ArgumentParser(description=doc.splitlines()[0])
    if shared:
        out.add_argument("--shared", type=Path, default=SHARED, help=f"the shared/ folder (default: {SHARED})")
    return out


def ground_truth(shared: Path, *names: str) -> list[Path]:
    """The named files of `shared`/ground_truth; when any is missing, says which and exits with status 2."""
    paths = [Path(shared) / "ground_truth" / name for name in names]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"missing {', '.join(missing)}: pass --shared", file=sys.stderr)
        raise SystemExit(2)
    return paths


def ape(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Absolute percentage error of each prediction."""
    return 100 * np.abs(np.asarray(predicted) - np.asarray(measured)) / np.asarray(measured)


@dataclass(frozen=True)
class GroupChoice:
    """Candidates chosen by MAPE on measured runs: the one chosen on every run (`in_file`), the one chosen without
    each group's runs (`without`, by group), and each run's prediction by the candidate chosen without its group
    (`cv`, the cross-validated prediction)."""

    in_file: int
    without: dict[str, int]
    cv: np.ndarray


def leave_one_group_out(predicted: np.ndarray, measured: np.ndarray, groups: np.ndarray) -> GroupChoice:
    """Choose among candidates, `predicted` holding one row of the runs' predictions per candidate, by MAPE against
    `measured`: on every run, and per group (a plan, a model) on the other groups' runs to predict its own."""
    errors = np.abs(predicted - measured) / measured

    def best(rows: np.ndarray) -> int:
        return int(np.argmin(errors[:, rows].mean(axis=1)))

    cv = np.empty(len(measured))
    without = {}
    for group in sorted(set(groups)):
        held = groups == group
        without[group] = best(~held)
        cv[held] = predicted[without[group], held]
    return GroupChoice(best(np.ones(len(measured), dtype=bool)), without, cv)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (ties ranked by their mean); NaN under 3 values or when either side is constant."""
    if len(a) < 3:
        return float("nan")
    ra, rb = pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def regret(measured: np.ndarray, predicted: np.ndarray) -> float:
    """How much slower the predicted-best plan ran than the measured best: measured[argmin predicted] / min - 1."""
    return float(measured[np.argmin(predicted)] / measured.min() - 1)


MIN_PLANS = 3  # a workload's plans are ranked from three: two give a Spearman of +-1, which says little


@dataclass(frozen=True)
class Ranking:
    """How well predictions order the plans of each workload with at least MIN_PLANS measured plans: the mean
    Spearman over those workloads and the lowest (NaN where none has), the mean regret, and how many there were."""

    workloads: int
    spearman: float
    min_spearman: float
    regret: float


def ranking(measured: np.ndarray, predicted: np.ndarray, workloads: np.ndarray) -> Ranking:
    """The ranking quality of `predicted` over the rows' `workloads` (a key per row: rows of one key are plans of one
    workload, ordered against each other)."""
    rhos, regrets = [], []
    for key in pd.unique(workloads):
        mine = workloads == key
        if mine.sum() >= MIN_PLANS:
            rho = spearman(measured[mine], predicted[mine])
            if not np.isnan(rho):
                rhos.append(rho)
            regrets.append(regret(measured[mine], predicted[mine]))
    nan = float("nan")
    return Ranking(len(regrets), float(np.mean(rhos)) if rhos else nan, float(np.min(rhos)) if rhos else nan,
                   float(np.mean(regrets)) if regrets else nan)


SIZE_GROUPS = 4  # at most this many size groups per table, each of whole models (or MoE tokens-per-expert values)


def by_size(errors: np.ndarray, sizes: np.ndarray, groups: int = SIZE_GROUPS) -> list[dict[str, object]]:
    """A table's error by size of work: its distinct sizes, smallest first, cut into at most `groups` groups of about
    equal count of sizes; per group its size range, rows and MAPE (a size trend shows as groups drifting apart)."""
    errors, sizes = np.asarray(errors, dtype=float), np.asarray(sizes, dtype=float)
    distinct = np.unique(sizes)
    out = []
    for part in np.array_split(distinct, min(groups, len(distinct))):
        on = (sizes >= part[0]) & (sizes <= part[-1])
        out.append({"from": float(part[0]), "to": float(part[-1]), "rows": int(on.sum()),
                    "mape_pct": round(float(errors[on].mean()), 2)})
    return out


def size_text(value: float) -> str:
    """A size as people write it (1.3B, 350M, 4k)."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"
