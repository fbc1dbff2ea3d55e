"""ScaleDL's own runner (`predictor.measure`): what `--validate`, `scaledl profile` and the shipped datasets measure.

DDP, ZeroRedundancyOptimizer, FSDP, DTensor TP, pipelining; eager attention; the runner waits for each collective
(nothing overlapped). It runs plans itself, so it has no launch file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from predictor.frameworks.base import Framework, recorded_constants
from predictor.memory.facts import MIB, MemoryFacts
from predictor.moe import runner_ep_error
from predictor.plan import Plan

if TYPE_CHECKING:  # pragma: no cover
    from predictor.workload import WorkloadSpec

NAME = "pytorch"


def _rules(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    error = runner_ep_error(plan, spec.model)
    return [f"cannot run {error}"] if error else []


def _nothing(plan: Plan) -> frozenset[str]:
    return frozenset()


# torch DDP (bucket_cap_mb=25, two in flight), ZeroRedundancyOptimizer, FSDP; eager modules.
MEMORY = MemoryFacts(NAME, grad_bytes=2.0, master_bytes=4.0, moment_bytes=4.0, grads_sharded_from=2,
                     saved="graph",
                     swiglu_saved=4.0, loss_saved_bytes=4.0, loss_peak_bytes=6.0,
                     grad_bucket_bytes=2 * 25 * MIB, prefetch_params=0.0, workspace_bytes=32 * MIB)

PYTORCH = Framework(NAME, "ScaleDL's runner", _rules, _nothing, frozenset(), fused_attention=False,
                    precisions=("fp32", "fp16", "bf16"), memory=MEMORY, constants=recorded_constants(NAME))
