"""Peak memory per rank of each pipeline stage: model states, activations in flight, buffers.

Model states follow ZeRO (Rajbhandari et al. 2020): mixed-precision Adam keeps 2Ψ weights,
2Ψ gradients and 12Ψ optimizer state (fp32 master, momentum, variance) bytes; ZeRO-1 shards
the optimizer state over dp, ZeRO-2 also the gradients, ZeRO-3 also the weights. Activations
come from the layer graph's per-node saved elements (Korthikanti et al. 2023 accounting) under
the recomputation mode, times the micro-batches a stage holds at once under the schedule. ZeRO
shards over the gradient-sync group (`Layout.sync_group`: Megatron-Core's data-parallel group with
context parallelism). A fused attention kernel saves Q, K, V, its output and the softmax
statistics instead of the s² scores (FlashAttention, Dao et al. 2022). FP8 and FP4 training keep
bf16 weights and fp32 master weights as bf16 training does, plus a low-precision copy of every
linear's weight for the GEMMs (Transformer Engine keeps the FP8 weight and its transpose,
2 bytes per parameter; NVFP4 the same at half a byte each plus 1/16 for block scales).
Routed experts' model states are those of the experts a rank holds (`predictor.costs.parallel` shards them) and sharded
by ZeRO over the expert-data-parallel group (Megatron-Core's distributed optimizer over expert parameters);
the token dispatch keeps a send and a receive buffer of the busiest MoE layer's tokens·top_k·hidden elements,
scaled by the routing imbalance (dropless routing sizes them to the tokens that arrive).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from predictor.spec.hardware import RECIPES

if TYPE_CHECKING:  # pragma: no cover (annotations only: predictor.frameworks imports memory.facts, below workload)
    from predictor.costs.parallel import Layout
    from predictor.spec.workload import WorkloadSpec

# The Transformer Engine recipe (`predictor.spec.hardware.RECIPES`) each low-precision copy format stores its elements
# and scales as: FP8 with one scale per tensor ('cs': current or delayed scaling), MXFP8 (an E8M0 scale per 32
# elements: 'mx') and NVFP4 (4-bit, an E4M3 scale per 16: 'fp4').
_FORMAT_RECIPES: dict[str, str] = {"cs": "current", "mx": "mxfp8", "fp4": "nvfp4"}
# Bytes per element of a low-precision copy of a tensor, its scales included, by format.
LOW_PRECISION_ELEMENT_BYTES: dict[str, float] = {
    fmt: RECIPES[recipe].data_bytes + RECIPES[recipe].scale_bytes for fmt, recipe in _FORMAT_RECIPES.items()}


def low_precision_element_bytes(precision: str, fp8_format: str = "cs") -> float | None:
    """Bytes per element of a `precision` copy ('fp8' in `fp8_format`, or 'fp4'); None for any other precision."""
    if precision == "fp4":
        return LOW_PRECISION_ELEMENT_BYTES["fp4"]
    return LOW_PRECISION_ELEMENT_BYTES[fp8_format] if precision == "fp8" else None


def weight_copy_bytes(precision: str, fp8_format: str = "cs") -> float:
    """Bytes per linear parameter of the low-precision weight copies Transformer Engine keeps beside a BF16 weight
    (the weight and its transpose; MXFP8 and NVFP4: row- and column-wise); 0 outside FP8 and FP4 training."""
    element = low_precision_element_bytes(precision, fp8_format)
    return 0.0 if element is None else 2 * element

GIB = 1024**3
# PyTorch DDP's default gradient bucket (torch.nn.parallel.DistributedDataParallel bucket_cap_mb=25);
# two are in flight (one being reduced while the next fills).
DDP_BUCKET_BYTES = 2 * 25 * 1024**2
# DeepSpeed ZeRO default reduce_bucket_size / allgather_bucket_size: 5e8 elements each.
ZERO_BUCKET_ELEMS = 5e8


def optimizer_bytes_per_param(optimizer: str, precision: str) -> float:
    """Optimizer-state bytes per parameter: fp32 master copy under mixed precision + the optimizer's moments."""
    master = 4.0 if precision != "fp32" else 0.0
    # Adam: momentum + variance; SGD: momentum; Muon: a momentum on the matrices it steps (Adam's two on the rest,
    # a few per cent of a transformer's parameters, which `predictor.memory.accounting` counts apart)
    moments = 8.0 if optimizer == "adam" else 4.0
    return master + moments


def in_flight(layout: Layout) -> np.ndarray:
    """Micro-batches' worth of a rank's full activations held at its peak, per pipeline rank.

    GPipe: all m. 1F1B: p - rank (capped by m). Interleaved (Megatron): rank r warms up
    (p-r-1)·2 + (v-1)·p chunk-micro-batches, each holding 1/v of the rank's layers; on rank 0
    that is p·(1 + (p-1)/(p·v)), Korthikanti's factor.
    """
    plan, m = layout.plan, layout.microbatches
    p, v = layout.stages, plan.v
    r = np.arange(p)
    if plan.schedule == "gpipe":
        return np.full(p, float(m))
    if plan.schedule == "interleaved":
        return np.minimum((p - r - 1) * 2 + (v - 1) * p + 1, m * v) / v
    return np.minimum(p - r, m).astype(float)


def activation_bytes(layout: Layout, recompute: str | None = None, fused_attention: bool = False,
                     kv_share: float = 1.0) -> np.ndarray:
    """Activation bytes per pipeline rank at its peak (micro-batch = plan.mbs)."""
    kept, one_block = saved_per_sample(layout, recompute, fused_attention, kv_share)
    b = layout.plan.mbs
    return kept * b * in_flight(layout) + one_block * b


def saved_per_sample(layout: Layout, recompute: str | None = None, fused_attention: bool = False,
                     kv_share: float = 1.0) -> tuple[np.ndarray, float]:
    """(bytes per sample each pipeline rank keeps per micro-batch in flight, bytes per sample of the one block
    being recomputed and back-propagated: 0 unless recompute is full). Neither depends on the micro-batch size
    or the schedule: `activation_bytes` multiplies them in."""
    nodes, counts, plan = layout.nodes, layout.stage_counts, layout.plan
    recompute = recompute or plan.recompute
    # Bytes per saved element: the activation precision, except the logits the loss keeps in fp32
    # (Megatron casts them to float for the cross-entropy: 4·s·b·V/t bytes, Korthikanti §4.3).
    act = nodes.act_elems * np.where(nodes.kind == "loss", 4, layout.act_bytes)
    sharded_out = nodes.out_full / layout.share.width * layout.act_bytes
    if recompute == "selective":
        # The attention core is recomputed: keep its Q, K, V inputs (3 × output size), drop the s² scores.
        act = np.where(nodes.attention, np.minimum(act, 3 * sharded_out), act)
    elif fused_attention:  # Q and the output, K and V (kv_share of Q's size under GQA); softmax statistics negligible
        act = np.where(nodes.attention, np.minimum(act, (2 + 2 * kv_share) * sharded_out), act)
    rep = nodes.repeated
    if recompute == "full":
        kept = counts[:, ~rep] @ act[~rep] + layout.blocks_per_stage * nodes.block_input * layout.act_bytes
        return kept, float(act[rep] @ _one_block_counts(layout)[rep])  # recomputed block being back-propagated
    return counts @ act, 0.0


def _one_block_counts(layout: Layout) -> np.ndarray:
    """Occurrences of each node in one repeated block (counts / blocks), for the recompute working set."""
    counts = layout.stage_counts.max(axis=0)
    blocks = max(layout.blocks_per_stage.max(), 1.0)
    return counts / blocks


def stage_params(layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """(all, routed experts') parameters held by one rank of each pipeline stage."""
    counts, nodes = layout.stage_counts, layout.nodes
    return counts @ nodes.params, counts @ (nodes.params * nodes.experts)


def kv_share(spec: WorkloadSpec) -> float:
    """K and V heads over query heads (grouped-query attention saves K and V at that share of Q's size)."""
    m = spec.model
    return (m.kv_heads or m.heads or 1) / (m.heads or 1)


def model_state_bytes(spec: WorkloadSpec, layout: Layout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, gradients, optimizer state) bytes per pipeline rank under the plan's ZeRO stage."""
    plan = layout.plan
    t = spec.training
    psi, psi_exp = stage_params(layout)  # local parameters per pipeline rank, and the experts' among them

    def sharded(stage: int) -> np.ndarray:
        """Parameters per rank once ZeRO `stage` shards them: dense ones over the gradient-sync group, experts'
        over expert-dp."""
        if plan.zero < stage:
            return psi
        return (psi - psi_exp) / layout.sync_group.size + psi_exp / layout.expert_sync_group.size

    copy = weight_copy_bytes(t.precision)
    return (sharded(3) * (layout.param_bytes + copy), sharded(2) * layout.grad_bytes,
            sharded(1) * optimizer_bytes_per_param(t.optimizer, t.precision))


def buffer_bytes(layout: Layout, psi: np.ndarray, imbalance: float = 1.0) -> np.ndarray:
    """Communication buffers per pipeline rank (`psi`: its parameters), with the MoE dispatch buffers."""
    plan = layout.plan
    dispatch = 2 * float(layout.nodes.dispatch.max(initial=0.0)) * plan.mbs * layout.act_bytes * imbalance
    return _buffers(layout, psi) + (dispatch if layout.split_group("experts").size > 1 else 0.0)


def _buffers(layout: Layout, psi: np.ndarray) -> np.ndarray:
    """Communication buffers: the gradient buckets, a width split's collective output, pipeline send/recv tensors."""
    plan = layout.plan
    eb = layout.grad_bytes
    if layout.sync_group.size == 1:
        bucket = np.zeros_like(psi)
    elif plan.zero == 0:
        bucket = np.minimum(psi * eb, DDP_BUCKET_BYTES)
    else:
        bucket = np.minimum(psi * eb, ZERO_BUCKET_ELEMS * eb)
        if plan.zero >= 3:  # gathered weights of the layer in use and the prefetched next one
            largest = float(layout.nodes.params.max()) if layout.nodes.params.size else 0.0
            bucket = bucket + 2 * largest * layout.param_bytes
    # a width split's all-reduces (or all-gathers of the sequence shards) write the whole activation, twice in flight
    full_act = layout.p2p_elems * layout.share.seq_shard * layout.act_bytes
    gathered = 2 * full_act if layout.share.width > 1 else 0.0
    p2p_buf = 2 * layout.p2p_elems * layout.act_bytes if layout.stages > 1 else 0.0
    return bucket + gathered + p2p_buf
