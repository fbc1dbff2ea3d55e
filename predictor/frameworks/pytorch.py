"""ScaleDL's own runner (`predictor.measure`): what `--validate`, `scaledl profile` and the shipped datasets measure.

DDP, ZeroRedundancyOptimizer, FSDP, DTensor TP, pipelining; eager attention; the runner waits for each collective
(nothing overlapped). It runs plans itself, so it has no launch file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from predictor.frameworks.base import Framework, recorded_constants
from predictor.frameworks.kernels import FIELDS as KERNEL_FIELDS, KernelChoices, Kernels
from predictor.memory.facts import MIB, MemoryFacts
from predictor.plan import Plan
from predictor.plan.rules import stage_degrees

if TYPE_CHECKING:  # pragma: no cover
    from predictor.spec.workload import ModelSpec, WorkloadSpec

NAME = "pytorch"
# The parallel axes its runner composes (predictor.measure.compose); it writes no launch file, so none has a flag.
# Context parallelism is not among them: `predictor.measure.compose.CP_REFUSAL` says why.
AXIS_FLAGS: dict[str, str] = {"dp": "", "tp": "", "pp": "", "ep": ""}


def runner_ep_error(plan: Plan, model: ModelSpec) -> str:
    """Why ScaleDL's runner cannot run `plan`'s expert parallelism ('' when it can): it runs ep = dp, the stage's
    other axes at 1, with plain DDP (`predictor.measure.experts`: one expert-data-parallel rank, no ZeRO sharding of
    the experts each rank holds alone; interleaved pipelines sync with FSDP2's replicate, which would average the
    experts each rank holds alone, so v = 1)."""
    if plan.ep == 1 or (model.is_moe and plan.ep == plan.dp == plan.gpus // plan.pp and plan.zero == 0
                        and plan.v == 1):
        return ""
    return (f"ep={plan.ep} with {stage_degrees(plan)}, zero={plan.zero}, v={plan.v}: the runner's expert parallelism "
            f"needs a MoE model, ep = dp, the stage's other axes at 1, zero=0 and no interleaving")


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

# Its own search space (what `--validate` and `scaledl profile` run), the default of `scaledl plan` on a measured
# device: DDP, ZeroRedundancyOptimizer and FSDP (ZeRO 0-3), DTensor tensor parallelism, torch.distributed.pipelining's
# GPipe, 1F1B and interleaved schedules, and expert parallelism where the runner's MoE layers allow it (ep: auto is 1
# for a dense model). Context parallelism has no CPU kernel.
SPACE: dict[str, Any] = {
    "description": "ScaleDL's runner (DDP/ZeRO/FSDP, tp, GPipe/1F1B/interleaved pp, ep for MoE)",
    "dp": "auto", "tp": "auto", "pp": "auto", "ep": "auto", "mbs": [1, 2, 4, 8], "v": "auto", "max_v": 6,
    "zero": [0, 1, 2, 3], "recompute": ["none", "selective", "full"], "sp": [False, True],
    "schedule": ["gpipe", "1f1b", "interleaved"], "placement": ["tp-dp-pp"], "allow_cross_node_tp": False,
}

# Eager PyTorch modules: nothing of the kernel settings to choose.
KERNELS = KernelChoices(Kernels(attention="unfused"), allowed={
    name: ((getattr(Kernels(attention="unfused"), name),), "runs eager PyTorch modules") for name in KERNEL_FIELDS})

PYTORCH = Framework(NAME, "ScaleDL's runner", _rules, _nothing, frozenset(),
                    attention_kernel="unfused: eager PyTorch matmul, softmax and matmul",
                    precisions=("fp32", "fp16", "bf16"), memory=MEMORY, space=SPACE, axes=AXIS_FLAGS,
                    constants=recorded_constants(NAME), kernels=KERNELS)
