"""The report as types: what one search found, built once (`orchestrator.report.build`) and read by every renderer
(report.md, report.html, report.json, the terminal)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from predictor.costs.prediction import Prediction
from predictor.models.intervals import Interval
from predictor.plan import Plan
from predictor.spec.workload import WorkloadSpec

SCHEMA = "scaledl.report/1"


@dataclass(frozen=True)
class TrainingGoal:
    """The whole run a plan is for: its tokens (for days and cost to train) and the limits a plan must meet."""

    train_tokens: float | None = None
    deadline_days: float | None = None
    budget_usd: float | None = None


@dataclass(frozen=True)
class Ranking:
    """What the plans are ordered by, and the run's goal."""

    by: str
    price_per_gpu_hour: float | None
    goal: TrainingGoal


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    capacity_gib: float
    memory_limit_gib: float
    headroom: float
    peak_tflops: float
    intra_node_gbps: float
    inter_node_gbps: float


@dataclass(frozen=True)
class Size:
    """One cluster size searched, and how many valid plans it has."""

    nodes: int
    gpus: int
    valid: int


@dataclass(frozen=True)
class SpaceInfo:
    name: str
    config: dict[str, Any]
    candidates: int
    valid: int
    rejected: int
    top_rejections: list[tuple[str, int]]
    pruned: dict[str, int] = field(default_factory=dict)  # candidates left out as the same plan as one kept, by why


@dataclass(frozen=True)
class Costs:
    """A plan's size, throughput, time and cost (costs only with a price per GPU-hour, days and cost to train only
    with the run's tokens)."""

    nodes: int
    gpus: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    days_per_1t_tokens: float
    cost_usd_per_iteration: float | None
    days_to_train: float | None
    cost_usd_to_train: float | None


@dataclass(frozen=True)
class RankedPlan:
    """A plan that fits, within the goal, at its place in the ranking."""

    rank: int
    plan: Plan
    prediction: Prediction
    costs: Costs
    interval_s: tuple[float, float] | None  # the iteration time's interval; None when accuracy was never measured
    indistinguishable: bool  # its interval, scaled to the ranking's measure, overlaps the winner's

    @property
    def iter_time_s(self) -> float:
        return self.prediction.iter_time_s

    @property
    def peak_memory_gib(self) -> float:
        return self.prediction.peak_memory_gib


@dataclass(frozen=True)
class FrontPlan:
    """A plan no other beats on both days (iteration time) and cost (GPU-hours per iteration)."""

    plan: Plan
    iter_time_s: float
    gpu_hours_per_iteration: float
    costs: Costs


@dataclass(frozen=True)
class InfeasiblePlan:
    plan: Plan
    reason: str
    iter_time_s: float
    peak_memory_gib: float


@dataclass(frozen=True)
class Lever:
    """One change to a plan that does not fit (`name`, e.g. 'recompute=full' or '2x nodes'), re-predicted."""

    name: str
    plan: Plan
    iter_time_s: float
    peak_memory_gib: float
    gpus: int
    fits: bool

    @property
    def gpu_hours_per_iteration(self) -> float:
        return self.iter_time_s * self.gpus / 3600


@dataclass(frozen=True)
class ClosePlan:
    """A plan that does not fit, among those closest to fitting, with the levers tried on it (those that fit
    first, fastest first)."""

    plan: Plan
    iter_time_s: float
    peak_memory_gib: float
    overflow_gib: float
    levers: list[Lever]


@dataclass(frozen=True)
class WiderPlan:
    """The best plan that fits in a sample of a wider space's plans, where it beats the searched space's winner
    (`orchestrator.search.wider_space`)."""

    space: str
    plan: Plan
    iter_time_s: float
    peak_memory_gib: float
    sampled: int  # plans of the wider space predicted


@dataclass(frozen=True)
class Launch:
    """The winner's launch files for the spec's framework, or a note why there are none."""

    plan: Plan
    framework: str
    files: dict[str, str]
    notes: list[str]


@dataclass(frozen=True)
class Report:
    """Everything a search report says, a value once built: `validation` (the `--validate K` runs) and `wider` (the
    check of a wider space) come with the build (`orchestrator.planning` builds it with them: `dataclasses.replace`)."""

    created: str
    spec_path: str
    spec: WorkloadSpec
    device: DeviceInfo
    predictor: dict[str, Any]  # {name, accuracy: the measured accuracy record or None}
    ranking: Ranking
    sizes: list[Size]
    space: SpaceInfo
    search: dict[str, Any]  # the search's statistics
    ranked: list[RankedPlan]  # the best plans that fit (at most max(top_k, 100))
    ranked_total: int
    over_goal_total: int
    interval: Interval | None
    indistinguishable_total: int
    pareto: list[FrontPlan]
    infeasible: list[InfeasiblePlan]  # the fastest plans that do not fit (at most 100)
    infeasible_total: int
    closest: list[ClosePlan]  # when nothing fits: the plans closest to fitting and what would make them fit
    failed: list[tuple[Plan, str]]
    failed_total: int
    top_k: int
    explanation: str
    caution: str
    launch: Launch | None
    points: Any = None  # orchestrator.report.points.Points, for the plots only
    validation: dict[str, Any] | None = None
    wider: WiderPlan | None = None  # where a wider space holds a better plan

    @property
    def fits(self) -> bool:
        """Whether any plan fits in memory (within the goal): `scaledl plan` exits 1 when none does."""
        return bool(self.ranked)

    @property
    def shown(self) -> list[RankedPlan]:
        """The ranked plans a table shows (`--top-k`)."""
        return self.ranked[: self.top_k]
