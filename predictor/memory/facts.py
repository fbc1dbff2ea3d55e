"""What each training framework keeps on a GPU, as numbers its code sets: one `MemoryFacts` per framework.

Every figure comes from the framework's source (file references in docs/modeling.md, "Memory as each framework
allocates it"); `fragmentation` is the one constant chosen by leave-one-plan-out cross-validation on
../shared/ground_truth/simumax_b200_llama70b.csv (bench/memory_eval.py prints both figures). The caching
allocator's behaviour does not depend on the GPU generation, so the same fraction serves every device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MIB = 1024**2
GIB = 1024**3

# Device memory a search keeps free beyond the predicted reserved + runtime memory: the reserved prediction's largest
# leave-one-plan-out error on the measured B200 file is 4.3 % (bench/memory_eval.py).
HEADROOM = 0.05

SavedTensors = Literal["megatron-te", "torchtitan", "graph"]


@dataclass(frozen=True)
class MemoryFacts:
    """One framework's memory behaviour (per rank)."""

    framework: str
    # Model states: bytes per parameter of the gradient it accumulates, the optimizer's fp32 master copy and each
    # Adam moment (a precision-aware optimizer's BF16 moments are a lever, `Levers.bf16_moments`).
    grad_bytes: float
    master_bytes: float
    moment_bytes: float
    # ZeRO stage at which the framework shards gradients over the data-parallel group (Megatron's distributed
    # optimizer keeps the whole fp32 grad buffer: only Megatron-FSDP, zero>=2, shards it).
    grads_sharded_from: int
    # A ZeRO-2 plan that keeps unsharded parameters after forward (torchtitan's FSDP2 reshard_after_forward=False,
    # its default under a pipeline) and whether, under a pipeline, unsharded gradients accumulate over the
    # micro-batches (torch.distributed.pipelining defers FSDP2's reduce-scatter to the last backward).
    unsharded_params_under_pp: bool
    unsharded_grads_under_pp: bool
    # Activations: whose saved-tensor list prices them.
    saved: SavedTensors
    # Gated-MLP elements saved per ffn element: Megatron's fused bias_swiglu keeps its 2·ffn input and FC2 keeps the
    # ffn product (3); eager silu(w1 x)·(w3 x) also keeps silu's output (4).
    swiglu_saved: float
    # Bytes per logit the loss keeps from forward to backward, and at the start of its backward (saved + gradients).
    loss_saved_bytes: float
    loss_peak_bytes: float
    # Communication buffers beyond the states (bytes): the gradient bucket being reduced, and a ZeRO-3 / FSDP
    # parameter working set in parameters besides the layers being gathered (DeepSpeed stage3_prefetch_bucket_size).
    grad_bucket_bytes: float
    prefetch_params: float
    # Inside the caching allocator: cuBLAS and Transformer Engine GEMM workspaces.
    workspace_bytes: float
    # FP8 training keeps FP8 parameters in the param buffer, no BF16 copy (Megatron-Core's --fp8-param-gather, which
    # Megatron-Bridge's FP8 recipes set and ScaleDL's Megatron launch files write).
    fp8_param_gather: bool = False
    # Outside the allocator (runtime memory): the CUDA context and NCCL's buffers per communicator.
    cuda_context_bytes: float = 600 * MIB
    nccl_bytes_per_group: float = 160 * MIB
    # Reserved over allocated at the peak: the caching allocator's slack (leave-one-plan-out on the simumax file).
    fragmentation: float = 0.04


FACTS: dict[str, MemoryFacts] = {
    # Megatron-Core DDP with --use-distributed-optimizer and --accumulate-allreduce-grads-in-fp32 (the recipes'
    # default): a contiguous bf16 param buffer, a contiguous fp32 grad buffer (reduce-scattered in place), fp32 master
    # and Adam moments sharded over dp·cp; fused cross-entropy keeps the fp32 exp-logits (4 B) and casts the gradient
    # back to bf16 (2 B) at the start of backward.
    "megatron": MemoryFacts("megatron", grad_bytes=4.0, master_bytes=4.0, moment_bytes=4.0, grads_sharded_from=2,
                            unsharded_params_under_pp=False, unsharded_grads_under_pp=False, saved="megatron-te",
                            swiglu_saved=3.0, loss_saved_bytes=4.0, loss_peak_bytes=6.0, grad_bucket_bytes=0.0,
                            prefetch_params=0.0, workspace_bytes=64 * MIB, fp8_param_gather=True),
    # torchtitan FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): the sharded parameter is the
    # fp32 master (no separate copy), gradients reduce-scatter to fp32 shards; F.cross_entropy on .float() logits keeps
    # the fp32 log-softmax (4 B) and its backward adds an fp32 gradient and its bf16 cast (6 B).
    "torchtitan": MemoryFacts("torchtitan", grad_bytes=4.0, master_bytes=0.0, moment_bytes=4.0, grads_sharded_from=2,
                              unsharded_params_under_pp=True, unsharded_grads_under_pp=True, saved="torchtitan",
                              swiglu_saved=4.0, loss_saved_bytes=4.0, loss_peak_bytes=10.0,
                              grad_bucket_bytes=0.0, prefetch_params=0.0, workspace_bytes=32 * MIB),
    # DeepSpeed ZeRO (bf16): bf16 gradients (2 B), fp32 master + moments partitioned; contiguous_gradients with
    # reduce_bucket_size 5e8 elements; ZeRO-3 prefetches stage3_prefetch_bucket_size 5e7 parameters.
    "deepspeed": MemoryFacts("deepspeed", grad_bytes=2.0, master_bytes=4.0, moment_bytes=4.0, grads_sharded_from=2,
                             unsharded_params_under_pp=False, unsharded_grads_under_pp=False, saved="graph",
                             swiglu_saved=4.0, loss_saved_bytes=4.0, loss_peak_bytes=6.0,
                             grad_bucket_bytes=5e8 * 2, prefetch_params=5e7, workspace_bytes=32 * MIB),
    # ScaleDL's runner: torch DDP (bucket_cap_mb=25, two in flight), ZeroRedundancyOptimizer, FSDP; eager modules.
    "pytorch": MemoryFacts("pytorch", grad_bytes=2.0, master_bytes=4.0, moment_bytes=4.0, grads_sharded_from=2,
                           unsharded_params_under_pp=False, unsharded_grads_under_pp=False, saved="graph",
                           swiglu_saved=4.0, loss_saved_bytes=4.0, loss_peak_bytes=6.0,
                           grad_bucket_bytes=2 * 25 * MIB, prefetch_params=0.0, workspace_bytes=32 * MIB),
}
