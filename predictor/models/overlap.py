"""How much of a plan's communication hides behind its computation: overlap as the frameworks schedule it.

Each kind of communication a framework overlaps runs beside a window of computation that its schedule gives it,
and hides at most that window:
- the gradient reduction (Megatron-Core DDP's buckets, `overlap_grad_reduce`; Megatron-FSDP's and FSDP2's per-unit
  reduce-scatters) starts as each bucket's last gradient is ready in the backward of the last micro-batch
  (NVIDIA/Megatron-LM megatron/core/distributed/param_and_grad_buffer.py, `register_grad_ready`: only on the last
  micro-batch) and runs beside the rest of that backward; the last bucket has nothing left beside it;
- the parameter all-gather of the distributed optimizer (`overlap_param_gather`) runs bucket by bucket beside the
  first micro-batch's forward, the first bucket before any of it; under ZeRO-3 every forward and backward prefetches
  the next unit's all-gather beside the current unit's computation, the first of each pass exposed
  (NVIDIA/Megatron-LM megatron/core/distributed/fsdp/src/docs/runtime_schedule.md, "Prefetching"); there the
  all-gather and the reduce-scatter share one communicator, which runs them in launch order even on separate streams
  (same page), so the last backward's gathers and the gradient reduction share its window;
- tensor-parallel collectives (Transformer Engine's userbuffers under `--tp-comm-overlap`, torchtitan's async TP)
  run beside the GEMMs they feed or drain: the all-gathers' ring exchange starts the GEMM on the local chunk, and the
  reduce-scatters are pipelined in `RS_SPLITS` chunks whose last one follows the last GEMM chunk
  (NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py, `initialize_ub`: num_splits 4 for "pipeline");
- the context-parallel ring passes K and V beside the attention of the chunk before;
- the expert all-to-all runs beside another micro-batch's computation, phase by phase: a layer's combine backward
  beside the other micro-batch's attention forward, its dispatches beside the MLPs' backward and forward, its combine
  forward beside the attention backward (NVIDIA/Megatron-LM
  megatron/core/models/common/model_chunk_schedule_plan.py, `TransformerLayerSchedulePlan.run`;
  `combined_1f1b_exposed`, with delay_wgrad_compute's moved weight gradients); the first forward and the last
  backward run alone (`EDGE_MICROBATCHES`);
- the interleaved pipeline's send/recv runs beside another chunk's computation, the first receive and last send
  exposed.

The collectives a rank hides all run beside its one compute stream, so together they hide at most its computation;
where the kinds' own windows would hide more, each hides its share of it. A hidden second holds `COMM_SMS` of the
device's SMs, which the GEMMs beside it lose (`slowdown`). What is not hidden is exposed, so an iteration is never
shorter than any one kind's communication.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from predictor.spec.hardware import Device

# SMs a communication kernel holds while it runs beside the GEMMs: Transformer Engine's userbuffers default for its
# "pipeline" and "bulk" overlaps (NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py, `initialize_ub`:
# num_sm 16). NCCL sizes its own kernels by channels (one CTA, one SM each) from its topology search; 16 is of the
# order it picks for the rings of an 8-GPU node.
COMM_SMS = 16
# Chunks of a pipelined tensor-parallel reduce-scatter (`initialize_ub`'s num_splits for "pipeline").
RS_SPLITS = 4
# Per window a stage axis's communication hides beside (`predictor.plan.axes.Axis.window`), the share of it with no
# computation beside it: beside the GEMMs they feed or drain, half of the collectives reduce-scatter (an all-reduce is
# a reduce-scatter and an all-gather), and the last of each one's RS_SPLITS chunks follows the last GEMM chunk.
EDGE_SHARE: dict[str, float] = {"gemms": 1 / (2 * RS_SPLITS)}
# Per window that hides one micro-batch's communication behind another micro-batch's computation, how many
# micro-batches' worth has none beside it: Megatron-Core's combined 1F1B (`--overlap-moe-expert-parallel-comm`), whose
# "phases" run the first micro-batch's forward and the last one's backward alone (NVIDIA/Megatron-LM
# megatron/core/pipeline_parallel/combined_1f1b.py, `combined_1f1b_schedule_for_no_pipelining`).
EDGE_MICROBATCHES: dict[str, float] = {"phases": 1.0}


def combined_1f1b_exposed(comm: np.ndarray, fwd: np.ndarray, bwd: np.ndarray, experts_fwd: np.ndarray,
                          experts_bwd: np.ndarray, layers: np.ndarray, delayed: np.ndarray) -> np.ndarray:
    """Seconds of a stage's expert all-to-alls (`comm` per micro-batch) left exposed by Megatron-Core's combined 1F1B,
    per micro-batch: one layer of a micro-batch's forward runs beside one of another's backward, in four phases
    (NVIDIA/Megatron-LM megatron/core/models/common/model_chunk_schedule_plan.py, `TransformerLayerSchedulePlan.run`):

        communication stream: combine backward | dispatch forward -> dispatch backward | combine forward
        computation stream:   attention fwd    | MLP backward -> (MLP weight gradients) -> MLP fwd | attention bwd

    each all-to-all a quarter of the layer's exchange (c). A dispatch backward waits for the MLP's backward; under
    delay_wgrad_compute (`delayed`) that is its data gradients D alone, the weight gradients W running after them
    beside it, so the middle takes max(max(c, D) + c, max(D + W, c) + F) instead of max(D + W, c) + max(F, c).
    Per layer of the stage's `layers` MoE layers: F and D + W are the routed experts' forward and backward
    (`experts_fwd`, `experts_bwd`, D = W: a GEMM's data and weight gradients are a forward each), the attention
    phases the rest of the stage's forward and backward (`fwd`, `bwd`)."""
    n = np.maximum(layers, 1.0)
    c = comm / (4 * n)
    f, half = experts_fwd / n, experts_bwd / (2 * n)
    att_f, att_b = np.maximum(fwd - experts_fwd, 0.0) / n, np.maximum(bwd - experts_bwd, 0.0) / n
    inline = np.maximum(2 * half, c) + np.maximum(f, c)
    delay = np.maximum(np.maximum(c, half) + c, np.maximum(2 * half, c) + f)
    middle = np.where(delayed, delay, inline)
    step = np.maximum(att_f, c) + middle + np.maximum(att_b, c)
    return np.where(layers > 0, n * (step - (att_f + att_b + 2 * half + f)), comm)


def slowdown(device: Device) -> float:
    """Seconds of computation lost per second of communication hidden beside it: the share of the device's SMs the
    communication kernel holds (0 where the device's SMs are unknown, as on a measured CPU)."""
    sms = float(device.extra.get("sms", 0))
    return COMM_SMS / sms if sms else 0.0


def pipelined(total: np.ndarray, calls: np.ndarray, window: np.ndarray, edge: np.ndarray | None = None) -> np.ndarray:
    """Seconds of `calls` collectives (`total` seconds in all) hidden beside `window` seconds of computation cut
    into as many steps, each collective beside the step before the one that needs it (a prefetch) or after the one
    that produced it (a reduction): one collective, `edge` seconds (a mean one where not given), has no step beside
    it, the others hide up to the other steps."""
    steps = np.maximum(calls, 1.0)
    alone = total / steps if edge is None else np.minimum(edge, total)
    return np.maximum(0.0, np.minimum(total - alone, window * (steps - 1) / steps))


def share_window(hidden: Mapping[str, np.ndarray], compute: np.ndarray) -> dict[str, np.ndarray]:
    """Each kind's hidden seconds, scaled where together they exceed the computation they run beside."""
    total = sum(hidden.values(), np.zeros_like(compute))
    scale = np.where(total > compute, compute / np.maximum(total, 1e-300), 1.0)
    return {kind: h * scale for kind, h in hidden.items()}
