"""Per-rank memory of each pipeline stage as a framework allocates it: allocated peak, reserved, runtime, fit.

`rank_memory` composes, per pipeline stage, from `MemoryFacts` (the framework), `Levers` (what the run recomputes,
offloads or shrinks) and the plan's layout:
- weights, gradients, optimizer state: the framework's buffers under the plan's ZeRO stage (dense parameters over
  the gradient-sync group, routed experts over the expert-data-parallel group);
- activations: the saved tensors of `predictor.memory.saved` for each layer the stage holds, times the micro-batches
  in flight under the schedule, with the last stage's loss tensors;
- working set: what exists only while one layer (or the loss, or a recomputed layer) runs backward;
- buffers: pipeline send/recv, MoE dispatch, GEMM workspaces, a gradient bucket;
- allocated = the sum at the peak; reserved = allocated · (1 + fragmentation); runtime = CUDA context + NCCL
  communicators, outside the allocator. A plan fits when reserved + runtime <= capacity - headroom.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from predictor.costs.bf16_layers import bf16_blocks_per_rank, per_layer_occurrences
from predictor.costs.lora import trainable_params
from predictor.costs.muon import muon_params
from predictor.graph.layer_graph import LayerGraph
from predictor.memory import in_flight, saved_per_sample, kv_share, stage_params, weight_copy_bytes
from predictor.memory.facts import GIB, MemoryFacts
from predictor.memory.lever_settings import Levers
from predictor.memory.saved import (Dims, Saved, activation_element_bytes, backward_working, kept, layer_tensors,
                                    loss_tensors, loss_working, op_sac_tensors)
from predictor.costs.moe_dispatch import buffer_bytes
from predictor.costs.parallel import Layout
from predictor.costs.prediction import MEMORY_PARTS
from predictor.spec.workload import WorkloadSpec

# One vocabulary of memory parts (`predictor.costs.prediction.MEMORY_PARTS`): the caching allocator holds every part but the
# runtime's; a rank's activations are its saved tensors plus the backward working set, which `RankMemory` keeps apart.
ALLOCATED_PARTS: tuple[str, ...] = MEMORY_PARTS[:MEMORY_PARTS.index("runtime")]
# What `RankMemory.gib` gives per part, the working set beside the saved activations.
GIB_COLUMNS: tuple[str, ...] = (*ALLOCATED_PARTS[:ALLOCATED_PARTS.index("activations") + 1], "working",
                                *ALLOCATED_PARTS[ALLOCATED_PARTS.index("activations") + 1:])


@dataclass
class RankMemory:
    """Bytes per pipeline stage (arrays of `Layout.stages`) of each allocated part (`ALLOCATED_PARTS`; `activations` the
    saved tensors only), of the backward working set (`working`), and the run's fit on its device."""

    parts: dict[str, np.ndarray]
    working: np.ndarray
    activations_by_module: list[dict[str, float]]  # per stage: bytes of the saved tensors each lever could act on
    runtime: float
    fragmentation: float
    capacity: float
    headroom: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def allocated(self) -> np.ndarray:
        p = self.parts
        return p["weights"] + p["gradients"] + p["optimizer"] + p["activations"] + self.working + p["buffers"]

    @property
    def reserved(self) -> np.ndarray:
        return self.allocated * (1 + self.fragmentation)

    @property
    def peak_stage(self) -> int:
        return int(np.argmax(self.reserved))

    @property
    def peak_allocated(self) -> float:
        return float(self.allocated.max())

    @property
    def peak_reserved(self) -> float:
        return float(self.reserved.max())

    @property
    def used(self) -> float:
        """What the device holds at the peak: reserved memory plus the runtime's."""
        return self.peak_reserved + self.runtime

    @property
    def fits(self) -> bool:
        return self.used <= self.capacity - self.headroom

    def gib(self, stage: int | None = None) -> dict[str, float]:
        """The parts of one stage (default: the peak's) in GiB, with allocated, reserved and runtime."""
        s = self.peak_stage if stage is None else stage
        out = {p: float(self.parts[p][s] if p in self.parts else self.working[s]) / GIB for p in GIB_COLUMNS}
        out.update(allocated=float(self.allocated[s]) / GIB, reserved=float(self.reserved[s]) / GIB,
                   runtime=self.runtime / GIB)
        return out


# Per graph (by id, with a weak reference telling a reused id apart): which nodes are a layer's attention, and which
# are named dense, read for every memory row of a search.
_NODE_MASKS: dict[int, tuple[weakref.ref, np.ndarray, np.ndarray]] = {}


def _node_masks(graph: LayerGraph) -> tuple[np.ndarray, np.ndarray]:
    hit = _NODE_MASKS.get(id(graph))
    if hit is None or hit[0]() is not graph:
        if len(_NODE_MASKS) >= 8:
            _NODE_MASKS.clear()
        hit = _NODE_MASKS[id(graph)] = (weakref.ref(graph),
                                        np.array([n.kind == "attention" and n.group != "post" for n in graph.nodes]),
                                        np.array([n.name.startswith("dense:") for n in graph.nodes]))
    return hit[1], hit[2]


def _layers_per_stage(graph: LayerGraph, layout: Layout, moe_model: bool) -> tuple[np.ndarray, np.ndarray]:
    """(dense layers, MoE layers) each pipeline rank holds: its attention nodes, a MoE model's 'dense:' ones dense."""
    att, dense_named = _node_masks(graph)
    counts = layout.stage_counts
    if not moe_model:
        return counts[:, att].sum(axis=1), np.zeros(len(counts))
    return counts[:, att & dense_named].sum(axis=1), counts[:, att & ~dense_named].sum(axis=1)


def _bytes(tensors: list[Saved]) -> float:
    return float(sum(s.per_token for s in tensors))


@dataclass(frozen=True)
class _LayerKind:
    """One kind of layer (dense or MoE) under the plan's levers: each (lever module, bytes per token) of the tensors
    it keeps, and bytes per token of its input (all a recomputed layer keeps), of every tensor, of what the levers
    leave, of what stays on the device (offloading aside), and of its backward pass's working memory."""

    module_bytes: list[tuple[str, float]]
    layer_in: float
    full_bytes: float
    left_bytes: float
    on_device_bytes: float
    working: float

    @classmethod
    @cache
    def of(cls, d: Dims, facts: MemoryFacts, is_moe: bool, levers: Levers) -> "_LayerKind":
        """Found once per (dims, facts, kind, levers): a search meets the same few again in every memory row."""
        full = layer_tensors(d, facts, is_moe)
        working = backward_working(d, is_moe)
        if levers.op_sac:  # torchtitan's per-op policy: its saved outputs stay; backward recomputes the rest
            left = op_sac_tensors(d, is_moe, levers.compiled)
            return cls([], full[0].per_token, _bytes(full), _bytes(left), _bytes(left),
                       working + max(0.0, _bytes(full) - _bytes(left)))
        left = kept(full, levers.recompute, levers.offload)
        modules = [(m, t.per_token) for t in left for m in filter(None, t.recompute.split("+") + [t.offload])]
        return cls(modules, full[0].per_token, _bytes(full), _bytes(left),
                   _bytes(kept(full, levers.recompute, frozenset())), working)


def _activations(spec: WorkloadSpec, graph: LayerGraph, layout: Layout, facts: MemoryFacts, levers: Levers,
                 by_module: bool = True, imbalance: float = 1.0
                 ) -> tuple[np.ndarray, np.ndarray, list[dict[str, float]], np.ndarray]:
    """(saved activation bytes, backward working bytes, bytes per lever module (empty unless `by_module`), bytes one
    micro-batch offloads to the host) per pipeline stage. Numpy over the stages, each stage's arithmetic in the order
    one stage's would be done alone: its dense layers, then its MoE layers, then the loss on the last."""
    plan = layout.plan
    tokens = layout.rank_tokens * plan.mbs  # tokens of one micro-batch on one rank (before sp's sequence split)
    flight = in_flight(layout)
    # eager modules, and a `module:` model, which has no dims to build a framework's tensors from: the layer graph's
    # per-node saved elements
    if facts.saved == "graph" or spec.model.module is not None:
        unfused = levers.unfused_attention if levers.unfused_attention is not None else facts.saved == "graph"
        keep, one_block = saved_per_sample(layout, "full" if levers.full else ("selective" if levers.recompute
                                           else "none"), not unfused, kv_share(spec))
        acts = keep * plan.mbs * flight
        return acts, np.full_like(acts, one_block * plan.mbs), [{} for _ in acts], np.zeros_like(acts)
    d = Dims.of(spec.model, layout.share, spec.training.precision, levers.fp8_format,
                scores_keys=layout.tokens if levers.unfused_attention else 0, imbalance=imbalance)
    dense, moe = _layers_per_stage(graph, layout, spec.model.is_moe)
    acts, working, to_host = np.zeros(layout.stages), np.zeros(layout.stages), np.zeros(layout.stages)
    chunks = plan.v  # Megatron counts recompute_layers per model chunk
    # Each stage's budget of fully recomputed and of offloaded layers, spent on its dense layers first.
    full_left = np.full(layout.stages, float(int(levers.recompute_layers if levers.recompute_layers is not None else 10**9)
                                       * chunks))
    offload_left = np.full(layout.stages, float(levers.offload_layers))
    per_module: list[tuple[np.ndarray, list[tuple[str, np.ndarray]]]] = []  # each kind's stages, its tensors' bytes
    for is_moe, n_layers in ((False, dense), (True, moe)):
        n = np.asarray(n_layers, dtype=float)
        live = n > 0
        if not live.any():
            continue
        # A layer's tensors, what the levers leave of them, and their bytes are the same on every stage: found once.
        k = _LayerKind.of(d, facts, is_moe, levers)
        recomputed = np.where(live, np.minimum(n, full_left), 0.0) if levers.full else np.zeros(layout.stages)
        full_left = full_left - recomputed
        offloaded = np.where(live, np.minimum(n - recomputed, offload_left), 0.0)
        offload_left = offload_left - offloaded
        normal = n - recomputed - offloaded
        per_layer = normal * k.left_bytes + recomputed * k.layer_in
        to_host += np.where(live, (normal * (k.on_device_bytes - k.left_bytes) + offloaded * k.left_bytes) * tokens, 0.0)
        acts += np.where(live, per_layer * tokens * flight, 0.0)
        if by_module:
            scale = normal * tokens * flight
            per_module.append((live, [(m, per_token * scale) for m, per_token in k.module_bytes]))
        one = np.where(recomputed != 0, k.working + k.full_bytes, k.working + 0.0)
        one = np.where(offloaded != 0, one + k.left_bytes, one)  # double-buffered host copies: one layer in flight
        working = np.where(live, np.maximum(working, one * tokens), working)
    loss = loss_tensors(d, facts, levers.te_cross_entropy, levers.compiled) * max(1, spec.model.mtp_layers + 1)
    acts[-1] += _bytes(loss) * tokens * flight[-1]
    working[-1] = max(working[-1], loss_working(d, facts, levers.te_cross_entropy, levers.compiled) * tokens)
    return acts, working, _by_module(per_module, layout.stages), to_host


def _by_module(kinds: list[tuple[np.ndarray, list[tuple[str, np.ndarray]]]], stages: int) -> list[dict[str, float]]:
    """Per stage, the bytes of each lever module summed over the tensors of the layer kinds the stage holds, in
    their order."""
    out: list[dict[str, float]] = []
    for s in range(stages):
        stage: dict[str, float] = {}
        for live, tensors in kinds:
            if live[s]:
                for module, values in tensors:
                    stage[module] = stage.get(module, 0.0) + float(values[s])
        out.append(stage)
    return out


def _largest_layer_params(layout: Layout) -> float:
    counts = layout.stage_counts
    blocks = np.maximum(layout.blocks_per_stage, 1.0)
    per_block = (counts * layout.nodes.params)[:, layout.nodes.repeated].sum(axis=1) / blocks
    return float(per_block.max(initial=0.0))


def _states(spec: WorkloadSpec, layout: Layout, facts: MemoryFacts, levers: Levers
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, gradients, optimizer) bytes per pipeline stage."""
    plan, t = layout.plan, spec.training
    psi, psi_exp = stage_params(layout)
    dense_dp, exp_dp = layout.sync_group.size, layout.expert_sync_group.size

    def shard(stage: int) -> np.ndarray:
        """Parameters per rank once ZeRO `stage` shards them (dense over the gradient-sync group, experts over
        expert-dp)."""
        return psi if plan.zero < stage else (psi - psi_exp) / dense_dp + psi_exp / exp_dp

    gemm = (layout.nodes.kind == "linear") & (layout.nodes.group != "post") & (layout.nodes.group != "pre")
    gemm_params = layout.stage_counts @ (layout.nodes.params * (gemm | layout.nodes.experts))
    low = t.precision in ("fp8", "fp4")
    copy = weight_copy_bytes(t.precision, levers.fp8_format)
    largest = _largest_layer_params(layout)
    param_bytes = 4.0 if t.precision == "fp32" else 2.0
    grad_bytes = 2.0 if levers.bf16_grads else facts.grad_bytes
    if facts.fsdp2_states:
        # FSDP2: the sharded parameter is the fp32 master; zero=2 keeps the gathered bf16 parameters after forward,
        # and a pipeline defers the reduce-scatter, accumulating unsharded fp32 gradients over the micro-batches.
        # torchao's float8 and MX linears cast the weight in each forward and keep no low-precision copy; with
        # tensorwise float8 FSDP2 gathers the linears' weights in float8 (`enable_fsdp_float8_all_gather`, which
        # torchtitan's launch files set), 1 byte per gathered weight element.
        if plan.zero == 0:
            return psi * 4.0, psi * grad_bytes, psi * 2 * facts.moment_bytes
        sharded = shard(2)
        if t.precision == "fp8" and levers.fp8_format == "cs":
            param_bytes = param_bytes - (param_bytes - 1.0) * gemm_params / np.maximum(psi, 1.0)
        unsharded_p = psi * param_bytes if plan.zero == 2 else 2 * largest * param_bytes
        unsharded_g = psi * grad_bytes if layout.stages > 1 else largest * grad_bytes
        moments = (2.0 if levers.bf16_moments else facts.moment_bytes) * 2
        return (sharded * 4.0 + unsharded_p, sharded * grad_bytes + unsharded_g,
                sharded * moments * (1 - levers.optimizer_offload))
    if low:  # the layers kept in BF16 keep BF16 weights and no low-precision copy (predictor.costs.bf16_layers)
        kept = bf16_blocks_per_rank(layout, t.bf16_first_layers, t.bf16_last_layers)
        gemm_params = gemm_params - kept * ((per_layer_occurrences(layout) * (gemm | layout.nodes.experts))
                                            @ layout.nodes.params)
    if low and levers.fp8_param_gather:  # the param buffer holds FP8 weights (and their transposes), no BF16 copy
        weights = (psi - gemm_params) * param_bytes + gemm_params * copy
    else:
        weights = psi * param_bytes + gemm_params * copy
    if plan.zero >= 3:
        weights = weights * shard(3) / np.maximum(psi, 1.0) + (2 * largest + facts.prefetch_params) * param_bytes
    grads = shard(facts.grads_sharded_from) * grad_bytes
    if plan.zero >= facts.grads_sharded_from and dense_dp > 1:  # the unsharded gradients being reduced
        grads = grads + largest * grad_bytes
    if facts.fp32_grad_partition and plan.zero in (1, 2):  # the fp32 gradient partition the step reads
        grads = grads + shard(1) * 4.0
    moments = 2.0 if levers.bf16_moments else facts.moment_bytes
    if t.lora_rank:  # the frozen base keeps its BF16 weights alone; the adapters train (predictor.costs.lora)
        adapters, _ = trainable_params(layout, t.lora_rank)
        trained = adapters if plan.zero < 1 else adapters / dense_dp
        return (weights + adapters * param_bytes, (adapters if plan.zero < 2 else adapters / dense_dp) * grad_bytes,
                trained * (facts.master_bytes + 2 * moments))
    optimizer = shard(1) * (facts.master_bytes + 2 * moments) * (1 - levers.optimizer_offload)
    if t.optimizer == "muon":  # one momentum, not Adam's two, on the matrices Muon steps (predictor.costs.muon)
        mu, mu_exp = muon_params(layout)
        mu_shard = mu if plan.zero < 1 else (mu - mu_exp) / dense_dp + mu_exp / exp_dp
        optimizer = optimizer - mu_shard * moments * (1 - levers.optimizer_offload)
    return weights, grads, optimizer


def _buffers(spec: WorkloadSpec, layout: Layout, facts: MemoryFacts, imbalance: float = 1.0) -> np.ndarray:
    """Pipeline send/recv, the MoE dispatcher's buffers (its send and receive buffers sized, dropless, to the tokens
    the busiest rank receives: `imbalance` times the balanced share, and its kernels' own: `predictor.costs.moe_dispatch`),
    a gradient bucket and the GEMM workspaces."""
    plan, share = layout.plan, layout.share
    tokens = layout.rank_tokens * plan.mbs
    h, act = spec.model.hidden or 0, activation_element_bytes(spec.training.precision)
    p2p = 2 * tokens * h / share.seq_shard * act if layout.stages > 1 else 0.0
    dispatch = buffer_bytes(plan.dispatcher, tokens, spec.model, share.tokens, act, layout.split_group("experts"),
                            imbalance)
    bucket = facts.grad_bucket_bytes if layout.sync_group.size > 1 else 0.0
    return np.full(layout.stages, p2p + dispatch + bucket + facts.workspace_bytes)


def runtime_bytes(layout: Layout, facts: MemoryFacts) -> float:
    """Memory outside the caching allocator: the CUDA context and the buffers of each NCCL communicator a rank
    joins (its groups of more than one rank, and the pipeline's)."""
    groups = sum(g.size > 1 for g in layout.groups.values()) + (layout.stages > 1)
    return facts.cuda_context_bytes + groups * facts.nccl_bytes_per_group


def rank_memory(spec: WorkloadSpec, graph: LayerGraph, layout: Layout, facts: MemoryFacts, levers: Levers,
                capacity: float, headroom: float = 0.0, fragmentation: float | None = None,
                imbalance: float = 1.0, by_module: bool = True) -> RankMemory:
    """Each pipeline stage's memory parts for `layout` under `facts` and `levers` on a device of `capacity` bytes;
    `activations_by_module` empty unless `by_module`."""
    weights, grads, optimizer = _states(spec, layout, facts, levers)
    acts, working, modules, _ = _activations(spec, graph, layout, facts, levers, by_module, imbalance)
    parts = {"weights": weights, "gradients": grads, "optimizer": optimizer, "activations": acts,
             "buffers": _buffers(spec, layout, facts, imbalance)}
    return RankMemory(parts, working, modules, runtime_bytes(layout, facts),
                      facts.fragmentation if fragmentation is None else fragmentation, capacity, headroom)


def offloaded_bytes(spec: WorkloadSpec, graph: LayerGraph, layout: Layout, facts: MemoryFacts,
                    levers: Levers) -> np.ndarray:
    """Per pipeline stage, the activation bytes one micro-batch moves to host memory in forward (and back in
    backward) under the levers' offloading: its offloaded modules' tensors and its offloaded layers' kept ones."""
    return _activations(spec, graph, layout, facts, levers, by_module=False)[3]


def state_bytes(spec: WorkloadSpec, layout: Layout, facts: MemoryFacts, levers: Levers) -> np.ndarray:
    """(weights, gradients, optimizer) bytes per pipeline stage, (3, pp): what the ZeRO stage and the optimizer's
    levers set, whatever the micro-batch, schedule or recomputation (a search prices them once for all of those)."""
    return np.stack(_states(spec, layout, facts, levers))


def activity_bytes(spec: WorkloadSpec, graph: LayerGraph, layout: Layout, facts: MemoryFacts, levers: Levers,
                   imbalance: float = 1.0) -> np.ndarray:
    """(saved activations, backward working set, buffers, runtime) bytes per pipeline stage, (4, pp): what the
    micro-batch, schedule and recomputation set, whatever the ZeRO stage and the optimizer's levers."""
    acts, working, _, _ = _activations(spec, graph, layout, facts, levers, by_module=False, imbalance=imbalance)
    return np.stack([acts, working, _buffers(spec, layout, facts, imbalance),
                     np.full(layout.stages, runtime_bytes(layout, facts))])


def stage_memory_parts(states: np.ndarray, activity: np.ndarray, fragmentation: float) -> np.ndarray:
    """MEMORY_PARTS rows of `state_bytes` and `activity_bytes` rows (of one plan's stages, or of plans x stages): the
    allocated parts, the activations with the backward working set, and as `runtime` what the allocator reserves
    beyond its allocations (`fragmentation`) plus the CUDA context and NCCL's buffers. They sum to the reserved +
    runtime memory that decides whether a plan fits (`RankMemory.used` at the peak stage)."""
    weights, grads, optimizer = states
    acts, working, buffers, runtime = activity
    allocated = weights + grads + optimizer + acts + working + buffers  # as RankMemory adds them
    return np.stack([weights, grads, optimizer, acts + working, buffers,
                     allocated * (1 + fragmentation) - allocated + runtime])
