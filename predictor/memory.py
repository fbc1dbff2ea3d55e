"""Peak memory per rank of each pipeline stage: model states, activations in flight, buffers.

Model states follow ZeRO (Rajbhandari et al. 2020): mixed-precision Adam keeps 2Ψ weights,
2Ψ gradients and 12Ψ optimizer state (fp32 master, momentum, variance) bytes; ZeRO-1 shards
the optimizer state over dp, ZeRO-2 also the gradients, ZeRO-3 also the weights. Activations
come from the layer graph's per-node saved elements (Korthikanti et al. 2023 accounting) under
the recomputation mode, times the micro-batches a stage holds at once under the schedule.
"""

from __future__ import annotations

import numpy as np

from predictor.parallel import Layout
from predictor.workload import WorkloadSpec

GIB = 1024**3
# PyTorch DDP's default gradient bucket (torch.nn.parallel.DistributedDataParallel bucket_cap_mb=25);
# two are in flight (one being reduced while the next fills).
DDP_BUCKET_BYTES = 2 * 25 * 1024**2
# DeepSpeed ZeRO default reduce_bucket_size / allgather_bucket_size: 5e8 elements each.
ZERO_BUCKET_ELEMS = 5e8


def optimizer_bytes_per_param(optimizer: str, precision: str) -> float:
    """Optimizer-state bytes per parameter: fp32 master copy under mixed precision + the optimizer's moments."""
    master = 4.0 if precision != "fp32" else 0.0
    moments = 8.0 if optimizer == "adam" else 4.0  # Adam: momentum + variance; SGD: momentum
    return master + moments


def in_flight(layout: Layout) -> np.ndarray:
    """Micro-batches' worth of a rank's full activations held at its peak, per pipeline rank.

    GPipe: all m. 1F1B: p - rank (capped by m). Interleaved (Megatron): rank r warms up
    (p-r-1)·2 + (v-1)·p chunk-micro-batches, each holding 1/v of the rank's layers; on rank 0
    that is p·(1 + (p-1)/(p·v)), Korthikanti's factor.
    """
    plan, m = layout.plan, layout.microbatches
    p, v = plan.pp, plan.v
    r = np.arange(p)
    if plan.schedule == "gpipe":
        return np.full(p, float(m))
    if plan.schedule == "interleaved":
        return np.minimum((p - r - 1) * 2 + (v - 1) * p + 1, m * v) / v
    return np.minimum(p - r, m).astype(float)


def activation_bytes(layout: Layout, recompute: str | None = None) -> np.ndarray:
    """Activation bytes per pipeline rank at its peak (micro-batch = plan.mbs)."""
    nodes, counts, plan = layout.nodes, layout.stage_counts, layout.plan
    recompute = recompute or plan.recompute
    b = plan.mbs
    # Bytes per saved element: the activation precision, except the logits the loss keeps in fp32
    # (Megatron casts them to float for the cross-entropy: 4·s·b·V/t bytes, Korthikanti §4.3).
    act = nodes.act_elems * np.where(nodes.kind == "loss", 4, layout.act_bytes)
    if recompute == "selective":
        # The attention core is recomputed: keep its Q, K, V inputs (3 × output size), drop the s² scores.
        sharded_out = nodes.out_full / plan.tp * layout.act_bytes
        act = np.where(nodes.attention, np.minimum(act, 3 * sharded_out), act)
    flight = in_flight(layout)
    rep = nodes.repeated
    if recompute == "full":
        kept = counts[:, ~rep] @ act[~rep] + layout.blocks_per_stage * nodes.block_input * layout.act_bytes
        one_block = act[rep] @ _one_block_counts(layout)[rep]  # recomputed block being back-propagated
        return kept * b * flight + one_block * b
    return (counts @ act) * b * flight


def _one_block_counts(layout: Layout) -> np.ndarray:
    """Occurrences of each node in one repeated block (counts / blocks), for the recompute working set."""
    counts = layout.stage_counts.max(axis=0)
    blocks = max(layout.blocks_per_stage.max(), 1.0)
    return counts / blocks


def memory_per_stage(spec: WorkloadSpec, layout: Layout) -> dict[str, np.ndarray]:
    """Bytes per MEMORY_PARTS entry for one rank of each pipeline stage."""
    plan = layout.plan
    t = spec.training
    psi = layout.stage_counts @ layout.nodes.params  # local parameters per pipeline rank
    dp = plan.dp
    weights = psi * layout.param_bytes / (dp if plan.zero >= 3 else 1)
    grads = psi * layout.grad_bytes / (dp if plan.zero >= 2 else 1)
    opt = psi * optimizer_bytes_per_param(t.optimizer, t.precision) / (dp if plan.zero >= 1 else 1)
    acts = activation_bytes(layout)
    buffers = _buffers(layout, psi)
    return {"weights": weights, "gradients": grads, "optimizer": opt, "activations": acts, "buffers": buffers,
            "runtime": np.zeros_like(psi, dtype=float)}  # not modelled: learned where peaks are measured


def _buffers(layout: Layout, psi: np.ndarray) -> np.ndarray:
    """Communication buffers: dp gradient buckets, tp collective output, pp send/recv tensors."""
    plan = layout.plan
    eb = layout.grad_bytes
    if plan.dp == 1:
        dp_buf = np.zeros_like(psi)
    elif plan.zero == 0:
        dp_buf = np.minimum(psi * eb, DDP_BUCKET_BYTES)
    else:
        dp_buf = np.minimum(psi * eb, ZERO_BUCKET_ELEMS * eb)
        if plan.zero >= 3:  # gathered weights of the layer in use and the prefetched next one
            largest = float(layout.nodes.params.max()) if layout.nodes.params.size else 0.0
            dp_buf = dp_buf + 2 * largest * layout.param_bytes
    full_act = layout.p2p_elems * (plan.tp if plan.sp else 1) * layout.act_bytes
    tp_buf = 2 * full_act if plan.tp > 1 else 0.0
    pp_buf = 2 * layout.p2p_elems * layout.act_bytes if plan.pp > 1 else 0.0
    return dp_buf + tp_buf + pp_buf


def peak(parts: dict[str, np.ndarray]) -> tuple[np.ndarray, int]:
    """Total bytes per stage and the index of the stage with the peak."""
    total = sum(parts.values())
    return total, int(np.argmax(total))
