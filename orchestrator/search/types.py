"""The search's data, without Ray: its options, an evaluated plan, the result a report reads, and why a plan does
not fit in memory.

`orchestrator.search.run` runs a search and `orchestrator.search.tune` runs one under Ray Tune; both read these
types, as the reports and tests do, none of which needs Ray or Tune imported to read a result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from predictor.costs.prediction import Prediction
from predictor.costs.prediction_table import PredictionTable
from predictor.memory.facts import HEADROOM
from predictor.plan import Plan
from search_spaces.plan_list import PlanList

SEARCHERS = ("auto", "exhaustive", "optuna", "random")
EXHAUSTIVE_LIMIT = 2_000_000  # predicting every plan beats sampling while the driver holds their columns (~1.5 kB a plan)
DIRECT_LIMIT = EXHAUSTIVE_LIMIT  # an exhaustive search up to this many plans runs without Tune


@dataclass
class SearchOptions:
    searcher: str = "auto"
    budget_s: float | None = None  # wall-clock budget of the search
    max_trials: int | None = None  # Optuna / random: trials (groups) to try; default: all groups, at most 256
    exhaustive_limit: int = EXHAUSTIVE_LIMIT  # auto: exhaustive up to this many valid plans, else Optuna
    direct_limit: int = DIRECT_LIMIT  # exhaustive up to this many valid plans: without Tune
    headroom: float = HEADROOM  # memory kept free: feasible iff peak <= capacity * (1 - headroom)
    batch_size: int | None = None  # exhaustive: plans per trial (default: 2 rounds of trials, 256..MAX_BATCH plans)
    concurrency: int = 1  # trials in flight (without Tune: batches, plus the next one); the replicas work in parallel
    seed: int = 0
    resume: bool = False


@dataclass
class Evaluated:
    """One evaluated plan: its prediction, or the error of predicting it; `infeasible` says why it cannot run."""

    plan: Plan
    prediction: Prediction | None
    error: str | None = None
    infeasible: str | None = None

    @property
    def feasible(self) -> bool:
        return self.prediction is not None and self.error is None and self.infeasible is None


def memory_reason(peak_gib: float, limit_gib: float, capacity_gib: float) -> str | None:
    """Why a plan peaking at `peak_gib` cannot run on a device of `capacity_gib` keeping `limit_gib` usable, or None."""
    if peak_gib > limit_gib:
        return (f"predicted peak memory {peak_gib:.1f} GiB exceeds {limit_gib:.1f} GiB "
                f"({capacity_gib:.1f} GiB device less headroom)")
    return None


def infeasibility(pred: Prediction, limit_gib: float, capacity_gib: float) -> str | None:
    """Why `pred` cannot run on a device of `capacity_gib` keeping `limit_gib` usable, or None."""
    return memory_reason(pred.peak_memory_gib, limit_gib, capacity_gib)


@dataclass
class SearchResult:
    """Every evaluated plan, as columns (a search evaluates up to millions; a report shows a few hundred):
    `plans[i]` was predicted as row i of `table`, in the order evaluated; `failed` holds the plans whose prediction
    failed, with why. A plan is infeasible when its predicted peak memory exceeds `limit_gib`."""

    plans: PlanList
    table: PredictionTable
    limit_gib: float
    capacity_gib: float
    failed: list[tuple[Plan, str]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.plans = PlanList.of(self.plans)

    @classmethod
    def of(cls, evaluated: list[Evaluated], stats: dict[str, Any], limit_gib: float, capacity_gib: float) -> "SearchResult":
        """The result of already evaluated plans (their predictions are kept as the objects given)."""
        done = [e for e in evaluated if e.prediction is not None]
        return cls(PlanList.of([e.plan for e in done]), PredictionTable.from_predictions([e.prediction for e in done]),  # type: ignore[misc]
                   limit_gib, capacity_gib, [(e.plan, e.error or "") for e in evaluated if e.prediction is None], stats)

    @cached_property
    def infeasible(self) -> np.ndarray:
        return self.table.peak_memory_gib > self.limit_gib

    @cached_property
    def gpus(self) -> np.ndarray:
        return self.plans.gpus()

    def reason(self, row: int) -> str | None:
        """Why the plan of `row` cannot run, or None."""
        return memory_reason(float(self.table.peak_memory_gib[row]), self.limit_gib, self.capacity_gib)

    @property
    def evaluated(self) -> list[Evaluated]:
        """Every plan as an `Evaluated` (one Prediction object each: for small searches and tests)."""
        return ([Evaluated(p, pred, infeasible=self.reason(i)) for i, (p, pred) in enumerate(zip(self.plans, self.table.rows()))]
                + [Evaluated(p, None, error=e) for p, e in self.failed])
