"""What a training framework keeps on a GPU, as numbers its code sets: `MemoryFacts` (each framework module of
`predictor.frameworks` holds its own, `Framework.memory`).

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
SelectiveAC = Literal["modules", "op"]


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
    # Model states kept as torch.distributed FSDP2 keeps them (torchtitan): the sharded parameter is the fp32 master,
    # zero=2 keeps the gathered parameters after forward, and a pipeline accumulates unsharded fp32 gradients.
    fsdp2_states: bool = False
    # ZeRO-1/2 keeps an fp32 partition of the gradients for the optimizer step beside the bf16 ones (DeepSpeed).
    fp32_grad_partition: bool = False
    # Transformer Engine's fused cross-entropy (--cross-entropy-loss-fusion --cross-entropy-fusion-impl te, which
    # Megatron-Bridge's recipes set and ScaleDL's Megatron launch files write): no fp32 logits copy.
    te_cross_entropy: bool = False
    # Outside the allocator (runtime memory): the CUDA context and NCCL's buffers per communicator.
    cuda_context_bytes: float = 600 * MIB
    nccl_bytes_per_group: float = 160 * MIB
    # What `recompute=selective` recomputes: Megatron-Core's modules (the attention core), or torchtitan's per-op
    # policy ("op": `predictor.memory.saved.op_sac_tensors` are kept, the rest of each block recomputed).
    selective: SelectiveAC = "modules"
    # Reserved over allocated at the peak: the caching allocator's slack (leave-one-plan-out on the simumax file).
    fragmentation: float = 0.04

