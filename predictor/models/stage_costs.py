"""What one pipeline rank of a plan costs the analytical model: per micro-batch computation and tensor-,
context- and expert-parallel communication (each a vector over the pipeline ranks), and per step the
data-parallel gradient sync.

These are the pieces `predictor.models.plan_batch` computes once per distinct value of the plan fields
each depends on, then combines over all plans of a batch.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from predictor.costs import comm
from predictor.costs.bf16_layers import bf16_blocks_per_rank, per_layer_occurrences
from predictor.frameworks import Framework
from predictor.frameworks.kernels import Kernels
from predictor.graph.layer_graph import LayerGraph
from predictor.memory import optimizer_bytes_per_param
from predictor.models.cuda_graphs import host_ops as graphed_host_ops
from predictor.models.lowprec import weight_quantisation_s
from predictor.models.moe_kernels import moe_kernel_costs
from predictor.spec.hardware import Device
from predictor.models.roofline import (HOST_OPS, AnalyticalConfig, call_costs, gemm_efficiency, layer_times,
                                      softmax_fallbacks)
from predictor.costs.lora import adapted, frozen_backward
from predictor.costs.moe_dispatch import exchange_seconds
from predictor.costs.muon import NS_STEPS, newton_schulz_flops, newton_schulz_shapes
from predictor.costs.parallel import Layout, ShardedNodes
from predictor.memory.lever_settings import op_sac_recomputed, recomputed_nodes
from predictor.plan import AXES, Plan, recompute_modules
from predictor.plan.axes import REPLICA_AXIS, axis_function
from predictor.spec.resolver import Resolved
from predictor.spec.workload import WorkloadSpec

# PyTorch DDP's gradient bucket (bucket_cap_mb=25): one all-reduce per bucket. Megatron's buckets are of the
# same order (tens of MB); on fast links the count hardly matters, on a CPU's gloo each call costs ~1 ms.
DDP_BUCKET_BYTES = 25 * 2**20


def compute_parts(resolved: Resolved, graph: LayerGraph, lay: Layout, config: AnalyticalConfig) -> np.ndarray:
    """Per pipeline rank, one micro-batch, as rows: the layers' forward and backward (with recomputation), the
    host's forward and backward operator time (a MoE layer's permutation and router kernels included,
    `predictor.models.moe_kernels`), the MoE dispatchers' host waits in forward and backward, the
    attention cores' forward + backward (what a cp ring hides behind), the same with their recomputed forward (the
    attention kernel's whole share of the layers' time), the per-call seconds of the collectives each axis counts
    (its "calls" function: tp's, part of the tp communication): those two name what a framework's attention kernel
    and its per-call cost add; then the
    routed experts' forward and backward and the MoE layers (what the combined 1F1B's phases run beside).

    A measured device is synchronous: host and kernels add. On a GPU the host runs ahead and a host-bound
    micro-batch stretches its compute to the host's pace; each MoE layer's dispatcher waits for the host once
    per pass (forward, backward, a recomputed forward), which then launches its local experts' kernels:
    expert_host_s per local expert (gemm_batch = E/ep)."""
    plan, nodes, counts, device = lay.plan, lay.nodes, lay.stage_counts, resolved.device
    fwd, bwd = layer_times(resolved, graph, lay.share, plan.mbs, config)
    cfg = config.for_device(device)
    kernels = resolved.kernels
    unfused_f, unfused_b = unfused_passes(nodes, plan.mbs, kernels, lay.act_bytes, device.mem_bandwidth * cfg.bw_eff)
    again = recomputed_forward(graph, lay, op_sac(plan, resolved.framework))  # forwards backward repeats
    kept_f, kept_b = _bf16_layers_extra(resolved, graph, lay, config, fwd, bwd, again)
    rank = resolved.spec.training.lora_rank
    if rank:  # the base frozen, the adapters' GEMMs beside each block linear (predictor.costs.lora)
        lora_f, lora_b = adapter_times(nodes, plan.mbs, rank, device, cfg)
        fwd, bwd = fwd + lora_f, frozen_backward(nodes, fwd, bwd) + lora_b
    moe_s, moe_ops = moe_kernel_costs(nodes, plan.mbs, resolved.spec.model.top_k or 1, kernels, plan.dispatcher,
                                      lay.act_bytes, device.mem_bandwidth * cfg.bw_eff, cfg.launch_s)
    fwd, bwd = fwd + unfused_f + moe_s, bwd + unfused_b + moe_s
    t_f = counts @ fwd + kept_f
    t_b = counts @ bwd + again @ fwd + kept_b
    attention = counts[:, nodes.attention] @ (fwd + bwd)[nodes.attention]
    attention_all = attention + again[:, nodes.attention] @ fwd[nodes.attention]
    fallback = resolved.softmax_fallback
    eager = softmax_fallbacks(nodes, plan.mbs, resolved.fused_attention, fallback)
    ops = np.array([HOST_OPS.get(k, 1) for k in nodes.kind], dtype=float) + moe_ops
    if eager.any():
        ops = ops + eager * fallback.ops
    ops = graphed_host_ops(ops, nodes, kernels) * cfg.host_op_s
    host_f = counts @ ops
    host_b = 2 * host_f + again @ ops
    sync_f = counts @ (nodes.experts * nodes.gemm_batch) * cfg.expert_host_s
    sync_b = sync_f * 2 + again @ (nodes.experts * nodes.gemm_batch) * cfg.expert_host_s
    calls = np.zeros_like(t_f)
    for axis in AXES:
        counted = axis.function("calls")
        if counted is not None and axis.degree(plan) > 1:
            calls = calls + counted(lay) * call_costs(cfg, device)[0]
    experts = nodes.experts.astype(float)
    return np.stack([t_f, t_b, host_f, host_b, sync_f, sync_b, attention, attention_all, calls,
                     counts @ (fwd * experts), counts @ (bwd * experts), counts @ experts])


def adapter_times(nodes: ShardedNodes, mbs: int, rank: int, device: Device, cfg: AnalyticalConfig
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per node of LoRA's adapters (`predictor.costs.lora`): x·A (m x k · k x r) and (x·A)·B
    (m x r · r x n), at BF16 peak and the roofline's efficiency for those skinny shapes, plus a launch each;
    backward runs each GEMM twice (dgrad and wgrad)."""
    m, k, n = nodes.gemm_m * mbs, nodes.gemm_k, nodes.gemm_n
    peak = device.flops("bf16")
    down = 2 * m * k * rank / (peak * np.maximum(gemm_efficiency(m, rank, k, 1, cfg), 1e-6))
    up = 2 * m * rank * n / (peak * np.maximum(gemm_efficiency(m, n, rank, 1, cfg), 1e-6))
    fwd = np.where(adapted(nodes), down + up + 2 * cfg.launch_s, 0.0)
    return fwd, 2 * fwd


def bf16_twin(resolved: Resolved) -> Resolved:
    """The resolved spec with its linears in BF16: what a kept layer's nodes cost."""
    spec = resolved.spec
    training = spec.training.model_copy(update={"precision": "bf16", "recipe": None, "bf16_first_layers": 0,
                                                "bf16_last_layers": 0})
    return replace(resolved, spec=spec.model_copy(update={"training": training}), recipe=None, recipe_name=None)


def kept_layers(resolved: Resolved) -> tuple[int, int]:
    """(first, last) layers the spec keeps in BF16; (0, 0) outside FP8/FP4."""
    t = resolved.spec.training
    return (t.bf16_first_layers, t.bf16_last_layers) if resolved.recipe is not None else (0, 0)


def _bf16_layers_extra(resolved: Resolved, graph: LayerGraph, lay: Layout, config: AnalyticalConfig, fwd: np.ndarray,
                       bwd: np.ndarray, again: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per pipeline rank that the layers kept in BF16 add to an FP8/FP4 run
    (`predictor.costs.bf16_layers`): their nodes at BF16's cost instead of the recipe's, recomputed forwards too."""
    first, last = kept_layers(resolved)
    if not (first or last):
        return np.zeros(lay.stages), np.zeros(lay.stages)
    plan = lay.plan
    hp_f, hp_b = layer_times(bf16_twin(resolved), graph, lay.share, plan.mbs, config)
    per_layer = per_layer_occurrences(lay)
    kept = bf16_blocks_per_rank(lay, first, last)
    d_f, d_b = per_layer @ (hp_f - fwd), per_layer @ (hp_b - bwd)
    rep = lay.nodes.repeated
    redo = again[:, rep].sum(axis=1) / np.maximum(lay.stage_counts[:, rep].sum(axis=1), 1.0)
    return kept * d_f, kept * (d_b + redo * d_f)


# Bytes per weight element an unfused gradient accumulation adds per micro-batch: the weight-gradient GEMM's BF16
# output read back, and the FP32 main gradient read and written by the add (Megatron-LM's
# `gradient_accumulation_fusion` accumulates in the GEMM instead: `fused_weight_gradient_mlp_cuda`).
GRAD_ACCUM_BYTES = 2.0 + 4.0 + 4.0


def unfused_passes(nodes, mbs: int, kernels: Kernels, act_bytes: float, bandwidth: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per node that switched-off fusions add: without the bias-GeLU fusion the bias add
    and the GeLU are two memory-bound kernels where one ran (a write and a read more of the activation each way);
    without the gradient-accumulation fusion every linear's weight gradient is accumulated by a separate pass
    (GRAD_ACCUM_BYTES per weight element)."""
    zero = np.zeros(len(nodes.kind))
    extra_f, extra_b = zero.copy(), zero.copy()
    if not kernels.fused_bias_gelu:
        activation = np.asarray(nodes.kind) == "activation"
        extra_f = np.where(activation, nodes.io_elems * mbs * act_bytes / bandwidth, 0.0)
        extra_b = 2 * extra_f
    if not kernels.fused_grad_accum:
        extra_b = extra_b + np.where(np.asarray(nodes.kind) == "linear", nodes.params * GRAD_ACCUM_BYTES / bandwidth, 0.0)
    return extra_f, extra_b


def offload_waits(t_f: np.ndarray, t_b: np.ndarray, to_host: np.ndarray, device: Device) -> np.ndarray:
    """(forward, backward) seconds per pipeline rank and micro-batch that activation offloading stalls the GPU: the
    copies of `to_host` bytes each way run on copy engines beside the layers' kernels (Megatron-Core offloads on
    its own streams), so only what outlasts the pass's computation is exposed."""
    link = device.host_link
    if link is None or not to_host.any():
        return np.zeros((2, len(to_host)))
    copy = to_host / link.bandwidth + np.where(to_host > 0, link.latency, 0.0)
    return np.stack([np.maximum(0.0, copy - t_f), np.maximum(0.0, copy - t_b)])


def op_sac(plan: Plan, framework: Framework) -> bool:
    """Whether the plan's selective recomputation is torchtitan's per-op policy (`MemoryFacts.selective`)."""
    return plan.recompute == "selective" and framework.memory.selective == "op"


def recomputed_forward(graph: LayerGraph, lay: Layout, per_op: bool = False) -> np.ndarray:
    """(pp, nodes): occurrences of each node whose forward each pipeline rank runs again in backward: every
    repeated block's nodes under full recomputation (the first `recompute_layers` blocks of each model chunk when
    set), under torchtitan's per-op selective checkpointing (`per_op`) what its policy does not save
    (`predictor.memory.lever_settings.op_sac_recomputed`), the nodes of the named modules otherwise
    (`predictor.memory.lever_settings.recomputed_nodes`)."""
    plan, counts = lay.plan, lay.stage_counts
    if plan.recompute == "full":
        return np.where(lay.nodes.repeated, counts, 0.0) * full_share(lay)[:, None]
    if per_op:
        return np.where(op_sac_recomputed(graph), counts, 0.0)
    return np.where(recomputed_nodes(graph, recompute_modules(plan.recompute)), counts, 0.0)


def full_share(lay: Layout) -> np.ndarray:
    """Per pipeline rank, the share of its blocks a full recomputation recomputes (recompute_layers per chunk)."""
    plan = lay.plan
    if not plan.recompute_layers:
        return np.ones(len(lay.stage_counts))
    blocks = np.maximum(lay.blocks_per_stage, 1.0)
    return np.minimum(plan.recompute_layers * plan.v, blocks) / blocks


@axis_function("cp", "stage_cost")
def cp_stage_time(resolved: Resolved, lay: Layout, cfg: AnalyticalConfig) -> np.ndarray:
    """Context-parallel seconds per pipeline rank for one micro-batch: each attention layer exchanges
    the K and V of its sequence chunk with the other cp-1 ranks in forward, and K, V and their
    gradients in backward (Megatron-Core's p2p ring, torchtitan's ring; `cp_comm=allgather`: one
    all-gather of K, V in forward and a reduce-scatter of their gradients in backward)."""
    plan, nodes, counts, spec = lay.plan, lay.nodes, lay.stage_counts, resolved.spec
    kv_heads = spec.model.kv_heads or spec.model.heads or 1
    head_dim = (spec.model.hidden or 0) / (spec.model.heads or 1)
    chunk = 2 * lay.tokens / plan.cp * plan.mbs * kv_heads / lay.share.width * head_dim * lay.act_bytes  # K and V
    layers = counts @ nodes.attention.astype(float)
    g = lay.groups["cp"]
    if plan.cp_comm == "allgather":
        one = comm.allgather(chunk * plan.cp, g) + comm.reduce_scatter(2 * chunk * plan.cp, g)
    else:
        link = g.inter if g.n_inter > 1 else g.intra_for("send_recv")
        one = 3 * (plan.cp - 1) * comm.p2p(chunk, link)  # forward K, V; backward K, V, dK, dV
    return layers * one


@axis_function("ep", "stage_cost")
def ep_stage_time(resolved: Resolved, lay: Layout, cfg: AnalyticalConfig) -> np.ndarray:
    """Expert-parallel seconds per pipeline rank for one micro-batch: each MoE layer dispatches its
    tokens·top_k·hidden elements to the experts' ranks and combines the results back, in forward and again
    (their gradients) in backward: 2 dispatch-combine exchanges over the ep group, 3 when backward recomputes them
    (full recomputation, the moe module; torchtitan's per-op policy saves their outputs: `all_to_all_single` is on
    the save list of its MoE models, pytorch/torchtitan torchtitan/models/deepseek_v3/infra/parallelize.py), each
    priced by the plan's dispatcher's own kernels and links (`predictor.costs.moe_dispatch`)."""
    plan, nodes, counts = lay.plan, lay.nodes, lay.stage_counts
    exchanges = 3 if plan.recompute == "full" or "moe" in recompute_modules(plan.recompute) else 2
    size = nodes.dispatch * plan.mbs * lay.act_bytes * cfg.moe_imbalance
    one = np.array([exchange_seconds(plan.dispatcher, x, resolved.spec.model, lay.groups["ep"], resolved.device.name,
                                     resolved.generation) for x in size])
    return exchanges * (counts @ one)


@axis_function("etp", "stage_cost")
def etp_stage_time(resolved: Resolved, lay: Layout, cfg: AnalyticalConfig) -> np.ndarray:
    """Expert tensor-parallel seconds per pipeline rank for one micro-batch: Megatron-Core's alltoall dispatcher
    all-gathers the tokens each rank of the etp group received before the experts and reduce-scatters the experts'
    outputs after (megatron/core/transformer/moe/token_dispatcher.py, `MoEAlltoAllTokenDispatcher`:
    `gather_along_first_dim` and `reduce_scatter_to_sequence_parallel_region` over its expert tensor-parallel
    group), and the reverse in backward; again when backward recomputes the MoE layer (as `ep_stage_time`)."""
    plan, nodes, counts = lay.plan, lay.nodes, lay.stage_counts
    passes = 3 if plan.recompute == "full" or "moe" in recompute_modules(plan.recompute) else 2
    gathered = nodes.dispatch * plan.mbs * lay.act_bytes * cfg.moe_imbalance * plan.etp
    g = lay.groups["etp"]
    one = np.array([comm.allgather(x, g) + comm.reduce_scatter(x, g) if x > 0 else 0.0 for x in gathered])
    return passes * (counts @ one)


def _tp_time(layout: Layout, calls: np.ndarray, elems: np.ndarray, call_s: float) -> np.ndarray:
    """Seconds for `calls` tp all-reduces (reduce-scatter + all-gather pairs with sp) moving `elems`
    elements in total, per stage; each collective also costs `call_s` (a measured device's in-step cost)."""
    size = np.where(calls > 0, elems / np.maximum(calls, 1), 0.0) * layout.act_bytes
    g = layout.groups["tp"]
    if layout.plan.sp:
        return calls * (comm.reduce_scatter(size, g) + comm.allgather(size, g) + 2 * call_s)
    return calls * (comm.allreduce(size, g) + call_s)


def tp_node_collectives(nodes: ShardedNodes, tp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node: the tp all-reduces (RS+AG pairs with sp) after it in forward and in backward, and the elements per
    sample of each (the full, unsharded tensor of the rank's sequence share); none at tp 1.

    Megatron-LM's tensor parallelism (Shoeybi et al. 2019): row linears all-reduce their output in forward; the
    matching column-parallel "f" before them all-reduces the input gradient in backward. The vocab-parallel
    embedding all-reduces its output in forward; the vocab-parallel output layer all-reduces its input gradient."""
    role, kind = nodes.role, nodes.kind
    fwd, bwd = np.zeros(len(kind)), np.zeros(len(kind))
    if tp > 1:
        fwd[role == "row"] = 1
        bwd[role == "row"] = 1
        fwd[(role == "vocab") & (kind == "embedding")] = 1
        bwd[(role == "vocab") & (kind == "linear")] = 1
    return fwd, bwd, np.where((role == "vocab") & (kind == "linear"), nodes.in_full, nodes.out_full)


def _tp_collectives(lay: Layout) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per pipeline rank and micro-batch: the forward and backward tp all-reduces (RS+AG pairs with sp) and the
    elements they move; the recomputed forward repeats the blocks' forward all-reduces."""
    plan, nodes, counts = lay.plan, lay.nodes, lay.stage_counts
    fwd_ar, bwd_ar, payload = tp_node_collectives(nodes, plan.tp)
    rep = nodes.repeated
    fwd_calls = counts @ fwd_ar
    bwd_calls = counts @ bwd_ar
    fwd_elems = counts @ (fwd_ar * payload) * plan.mbs
    bwd_elems = counts @ (bwd_ar * payload) * plan.mbs
    if plan.recompute == "full":
        share = full_share(lay)
        fwd_calls = fwd_calls + share * (counts[:, rep] @ fwd_ar[rep])
        fwd_elems = fwd_elems + share * (counts[:, rep] @ (fwd_ar * payload)[rep]) * plan.mbs
    return fwd_calls, bwd_calls, fwd_elems, bwd_elems


@axis_function("tp", "calls")
def tp_calls(lay: Layout) -> np.ndarray:
    """Tensor-parallel collective calls per pipeline rank and micro-batch (a reduce-scatter and an all-gather each
    with sp): what a per-call cost is charged for."""
    fwd_calls, bwd_calls, _, _ = _tp_collectives(lay)
    return (fwd_calls + bwd_calls) * (2 if lay.plan.sp else 1)


@axis_function("tp", "stage_cost")
def tp_stage_time(resolved: Resolved, lay: Layout, cfg: AnalyticalConfig) -> np.ndarray:
    """Tensor-parallel seconds per pipeline rank for one micro-batch: the collectives, and on a
    measured device the runtime's own cost per sharded linear (`tp_linear_s`, DTensor on CPU)."""
    device = resolved.device
    nodes = lay.nodes
    # the linears the runtime shards by column or row (a DTensor module each on CPU)
    tp_linear = (nodes.kind == "linear") & np.isin(nodes.role, ("column", "row")) if lay.plan.tp > 1 else \
        np.zeros(len(nodes.kind), dtype=bool)
    framework = lay.stage_counts @ tp_linear * device.extra.get("tp_linear_s", 0.0)
    call_s = call_costs(cfg, device)[0]
    fwd_calls, bwd_calls, fwd_elems, bwd_elems = _tp_collectives(lay)
    collectives = _tp_time(lay, fwd_calls, fwd_elems, call_s) + _tp_time(lay, bwd_calls, bwd_elems, call_s)
    if lay.plan.sp and op_sac(lay.plan, resolved.framework):
        # the per-op policy saves the reduce-scatters' outputs but recomputes the blocks' forward all-gathers
        size = np.where(fwd_calls > 0, fwd_elems / np.maximum(fwd_calls, 1), 0.0) * lay.act_bytes
        collectives = collectives + fwd_calls * (comm.allgather(size, lay.groups["tp"]) + call_s)
    return collectives + framework


def grad_sync_time(lay: Layout, psi: np.ndarray, microbatches: int, call_s: float, g: comm.Group,
            whole_grads: bool = False) -> tuple[float, float, float, float, float]:
    """(gradient sync, parameter all-gather, the per-call seconds among them, the gradient calls, the all-gather calls)
    of the stage whose sync is slowest,
    call by call over the group `g` (dp·cp ranks; the expert-data-parallel ranks for the experts): each call pays
    the link latency and `call_s` (a measured device's in-step cost, or the framework's per-call cost).

    ZeRO-0/1: DDP buckets (DDP_BUCKET_BYTES) all-reduced, or reduce-scattered and the updated
    weights all-gathered; `whole_grads` (Muon's layer-wise distributed optimizer, `predictor.costs.muon`) all-reduces them
    and all-gathers the updated weights. ZeRO-2/3: one FSDP unit per block plus one for the rest of the stage, each
    reduce-scattering its gradients; ZeRO-2 gathers its weights once per step, ZeRO-3 again in every
    micro-batch's forward and backward (the only use of `microbatches`).
    """
    plan = lay.plan
    if g.size == 1 or not psi.any():
        return 0.0, 0.0, 0.0, 0.0, 0.0
    grads, weights = psi * lay.grad_bytes, psi * lay.param_bytes
    if plan.zero <= 1:
        grad_calls = np.maximum(1.0, np.ceil(grads / DDP_BUCKET_BYTES))
        if plan.zero == 0:
            param_calls = np.zeros_like(psi)
            grad, param = grad_calls * (comm.allreduce(grads / grad_calls, g) + call_s), np.zeros_like(psi)
        else:
            param_calls = grad_calls
            sync = comm.allreduce if whole_grads else comm.reduce_scatter
            grad = grad_calls * (sync(grads / grad_calls, g) + call_s)
            param = param_calls * (comm.allgather(weights / param_calls, g) + call_s)
    else:
        units = np.ceil(lay.blocks_per_stage) + 1
        grad_calls, param_calls = units, units * (2 * microbatches if plan.zero >= 3 else 1)
        grad = grad_calls * (comm.reduce_scatter(grads / units, g) + call_s)
        param = param_calls * (comm.allgather(weights / units, g) + call_s)
    worst = int(np.argmax(grad + param))
    return (float(grad[worst]), float(param[worst]), float((grad_calls + param_calls)[worst] * call_s),
            float(grad_calls[worst]), float(param_calls[worst]))


def optimizer_time(resolved: Resolved, lay: Layout, psi: np.ndarray, psi_exp: np.ndarray,
                   cfg: AnalyticalConfig) -> float:
    """Seconds of the optimizer step: memory-bound over the fullest rank's local optimizer state (`psi`: its
    parameters per pipeline rank, `psi_exp` the routed experts' among them), read and written with the
    gradients and weights. BF16 moments read and write half their bytes. The `optimizer_offload` fraction steps
    on the host (Megatron-Core's HybridDeviceOptimizer, DeepSpeed's CPU Adam), memory-bound over host DRAM,
    after its gradients cross the host link and before its updated weights cross back. In FP8 or FP4 the updated
    weights are quantised once per step (`lowprec.weight_quantisation_s`), with them."""
    plan, spec, device = lay.plan, resolved.spec, resolved.device
    state = optimizer_bytes_per_param(spec.training.optimizer, spec.training.precision)
    if plan.moments == "bf16":
        state -= 4.0 if spec.training.optimizer == "adam" else 2.0
    opt_bytes = 2 * state + lay.grad_bytes + lay.param_bytes
    shard, expert_shard = (plan.group_size(REPLICA_AXIS), lay.expert_sync_group.size) if plan.zero >= 1 else (1, 1)
    local = float(((psi - psi_exp) / shard + psi_exp / expert_shard).max())
    host = plan.optimizer_offload
    bw = device.mem_bandwidth * cfg.bw_eff
    on_device = (1 - host) * local * opt_bytes / bw
    recipe = resolved.recipe
    if recipe is not None:
        on_device += weight_quantisation_s(lay.nodes, lay.stage_counts, recipe, device, bw, cfg.launch_s)
    if spec.training.optimizer == "muon":
        on_device += newton_schulz_s(lay, device, cfg)
    if not host or device.host_link is None:
        return on_device
    on_host = host * local * opt_bytes / device.host_memory_bandwidth
    crossing = host * local * (lay.grad_bytes + lay.param_bytes) / device.host_link.bandwidth
    return on_device + on_host + crossing


def newton_schulz_s(lay: Layout, device: Device, cfg: AnalyticalConfig) -> float:
    """Seconds of Muon's Newton-Schulz iterations on the fullest rank (`predictor.costs.muon`): BF16 GEMMs of each local
    matrix's shapes through the roofline's GEMM efficiency, and a launch per GEMM. Under dist_muon (zero=1) each
    data-parallel rank orthogonalises the layers it owns: 1/dp of the dense matrices, 1/expert-dp of the experts'."""
    nodes, plan = lay.nodes, lay.plan
    flops = newton_schulz_flops(nodes)
    small, large = (np.maximum(x, 1.0) for x in newton_schulz_shapes(nodes))
    # the iteration's three GEMMs: m x M . M x m, m x m . m x m, m x m . m x M, weighted by their FLOPs
    eff = (gemm_efficiency(small, small, large, 1, cfg) * 4 * large + gemm_efficiency(small, small, small, 1, cfg)
           * 2 * small) / (4 * large + 2 * small)
    seconds = np.where(flops > 0, flops / (device.peak_flops["bf16"] * np.maximum(eff, 1e-6))
                       + NS_STEPS * 3 * cfg.launch_s * np.where(nodes.experts, 3 * nodes.gemm_batch, 1.0), 0.0)
    share = np.where(nodes.experts, 1 / lay.expert_sync_group.size, 1 / lay.sync_group.size) if plan.zero >= 1 else 1.0
    return float((lay.stage_counts @ (seconds * share)).max(initial=0.0))


def p2p_time(lay: Layout, device: Device, call_s: float) -> float:
    """Seconds of one pipeline send/recv of a micro-batch boundary's activations (`call_s`: the per-call cost)."""
    link = device.inter_node if lay.stage_link_inter else device.op_links.get("send_recv", device.intra_node)
    return float(comm.p2p(lay.p2p_elems * lay.act_bytes, link) + call_s)
