"""What a predictor answers for one (workload, plan): time and memory with their breakdowns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from predictor.plan.axes import TIME_PARTS

__all__ = ["MEMORY_PARTS", "TIME_PARTS", "Prediction"]
MEMORY_PARTS: tuple[str, ...] = ("weights", "gradients", "optimizer", "activations", "buffers", "runtime")
# "runtime": what a rank holds beyond the model's parts (the framework, the CUDA context, allocator slack);
# the analytical model counts none, a learned memory residual puts what it adds there.


@dataclass
class Prediction:
    """Predicted cost of one training iteration.

    iter_time_s: wall time of one iteration (global batch), seconds.
    breakdown: seconds per TIME_PARTS entry on the critical path (communication: what is exposed);
        sums to iter_time_s.
    hidden_comm: seconds of communication hidden behind computation, per kind (tp_comm, cp_comm, ep_comm,
        dp_grad, dp_param, pp_p2p); not in iter_time_s, except as the slowdown of what it ran beside.
    peak_memory_gib: the largest per-rank peak over all ranks (GiB).
    memory_per_stage_gib: per pipeline stage peak (GiB), first stage first.
    memory_breakdown: GiB per MEMORY_PARTS entry on the rank with the peak.
    tflops_per_gpu: model FLOPs (no recomputation) / iteration time / GPUs, in TFLOP/s.
    mfu: model FLOPs utilisation against the device's dense peak.
    """

    iter_time_s: float
    breakdown: dict[str, float]
    peak_memory_gib: float
    memory_per_stage_gib: list[float]
    memory_breakdown: dict[str, float]
    tflops_per_gpu: float
    mfu: float
    hidden_comm: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
