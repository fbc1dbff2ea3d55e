"""What a validation runs (`ValidationJob`) and what it measured (`ValidationResult`), as plain data for Ray."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Sequence

from predictor.plan import Plan
from predictor.spec.workload import WorkloadSpec

GIB = 1024**3
STATUSES = ("ok", "oom", "error", "timeout")


@dataclass(frozen=True)
class ValidationJob:
    """One plan to run for real, with what was predicted for it (None: nothing to compare with)."""

    spec: dict[str, Any]  # WorkloadSpec.model_dump(): plain data, so it travels to Ray workers
    plan: str
    predicted_time_s: float | None = None
    predicted_memory_gib: float | None = None
    warmup: int = 2
    steps: int = 3
    timeout_s: float = 300.0
    memory_limit_gib: float | None = None  # per rank; exceeding it ends the run as `oom`
    cpus_per_rank: float = 1.0


@dataclass
class ValidationResult:
    """What a real run of a plan measured; `status` says whether the figures exist."""

    plan: str
    status: str  # ok | oom | error | timeout
    measured_time_s: float | None = None
    measured_time_min_s: float | None = None
    measured_time_max_s: float | None = None
    peak_memory_gib: list[float] = field(default_factory=list)  # per rank: RSS high-water (CPU) or allocated (CUDA)
    memory_delta_gib: list[float] = field(default_factory=list)  # per rank: peak minus memory before the model
    memory_kind: str = ""  # rss | cuda
    predicted_time_s: float | None = None
    predicted_memory_gib: float | None = None
    strategy: str = ""
    nodes: list[str] = field(default_factory=list)  # node id of each rank
    started_at: float = 0.0  # epoch seconds when its placement group was granted and the run began
    wall_s: float = 0.0
    detail: str = ""  # failure reason / log tail, or a note on the placement
    core_sharing: float = 1.0  # CPU ranks per core on the busiest machine (> 1: ranks time-share cores)
    dataset_row: dict[str, Any] = field(default_factory=dict)  # whole-iteration columns for the profile dataset

    @property
    def compared_time_s(self) -> float | None:
        """The prediction for the run as it ran. The CPU prediction prices every rank on a core of its own (the
        device profile measures one single-threaded process per core); R ranks time-sharing C < R cores each get
        C/R of a core for their compute and for gloo's communication, which is CPU work too, so the iteration
        stretches by R/C (`core_sharing`), and that is what the measurement is compared with."""
        return None if self.predicted_time_s is None else self.predicted_time_s * max(1.0, self.core_sharing)

    @property
    def time_error(self) -> float | None:
        """Signed relative error of the predicted time for the run as it ran: (compared - measured) / measured."""
        compared = self.compared_time_s
        if self.measured_time_s and compared is not None:
            return (compared - self.measured_time_s) / self.measured_time_s
        return None

    @property
    def measured_memory_gib(self) -> float | None:
        """What a memory prediction is compared with: the largest rank's memory of the training itself.

        On CPU the RSS high-water includes the interpreter and libraries, so the part the model
        added (peak minus the memory before it was built) is compared; CUDA counts allocations only.
        """
        per_rank = self.memory_delta_gib if self.memory_kind == "rss" else self.peak_memory_gib
        return max(per_rank) if per_rank and self.status == "ok" else None

    @property
    def memory_error(self) -> float | None:
        measured = self.measured_memory_gib
        if measured and self.predicted_memory_gib is not None:
            return (self.predicted_memory_gib - measured) / measured
        return None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(time_error=self.time_error, memory_error=self.memory_error, compared_time_s=self.compared_time_s,
                   measured_memory_gib=self.measured_memory_gib)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ValidationResult":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def jobs_for(spec: WorkloadSpec, plans: Sequence[Plan], predictions: Sequence[Any] | None = None,
             **options: Any) -> list[ValidationJob]:
    """ValidationJobs of `plans` of `spec`, carrying their predictions (Prediction objects) when given."""
    data = spec.model_dump(mode="json", exclude_none=True)
    preds = list(predictions) if predictions is not None else [None] * len(plans)
    return [ValidationJob(data, str(p), getattr(pr, "iter_time_s", None), getattr(pr, "peak_memory_gib", None), **options)
            for p, pr in zip(plans, preds)]
