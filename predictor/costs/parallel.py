"""Applying a parallel plan to a layer graph: what each pipeline stage holds, computes and sends.

Every predictor needs the same facts about (spec, graph, plan): the layers of each stage, each
layer's FLOPs and elements on one rank, the groups of its collectives and the links each group crosses. They are
computed here once, vectorised over nodes with numpy and cached per (graph, rank share) and (graph, stages, v),
because a search predicts thousands of plans of one graph.

A rank's share of the layers is read by dimension (`predictor.plan.share.RankShare`; which axis splits each is the
registry's word, `Axis.splits`). Splitting the width follows Megatron-LM's tensor parallelism (Shoeybi et al. 2019;
Korthikanti et al. 2023): column / row / heads / vocab nodes split their FLOPs and parameters; replicated nodes
(norms, dropout, residual adds) are computed whole on every rank unless sequence parallelism splits them along the
sequence (`RankShare.seq_shard`). A MoE router and the routed experts work on their rank's share of the tokens
(`tokens` and `sequence`); each rank holds 1/`experts` of the experts, and its experts' grouped GEMMs run on the
tokens the expert ranks dispatch to them (`predictor.costs.moe`), each expert's FFN split by `expert_width`. Splitting
the sequence divides every node's tokens (causal load balancing gives each rank its share of the attention work
too); parameters are whole. A column linear (and the vocab-parallel output layer) saves its full input for backward
(whole, or its sequence shard with sequence parallelism); nodes downstream of it (row linears, the attention core,
the activation between FC1 and FC2) save sharded tensors.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import numpy as np

from predictor.costs.comm import Group
from predictor.graph.layer_graph import LayerGraph
from predictor.plan import AXES, Plan, nvlink_domain
from predictor.plan.axes import PIPELINE_AXIS, PRICING_ORDER, STAGE_RANK_AXES, SYNC_GROUPS
from predictor.plan.share import SPLIT_GROUPS, RankShare
from predictor.spec.hardware import Device
from predictor.spec.workload import WorkloadSpec

# Bytes per element of activations, gradients and the weights the step reads, per training precision:
# FP8 and FP4 training keep these in bf16 (only GEMM inputs are cast; see predictor.memory for the
# low-precision weight copies).
BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 2, "fp4": 2}
REPEATED_GROUPS = ("block", "enc", "dec")
_SHARDED_ROLES = ("column", "row", "heads", "vocab")
_TOKEN_ROLES = ("tokens", "experts")  # split by their tokens (`RankShare.tokens`), their weights not
SEQUENCE_SPLIT_KINDS = ("layernorm", "rmsnorm", "dropout", "elementwise")
# The groups gradients sync over: the replicas' and the experts' (the complement of the axis that regroups a stage's
# ranks for them).
_SYNC, _EXPERT_SYNC = SYNC_GROUPS
# The axes that regroup a stage's ranks for the expert layers, innermost first (by their place in the rank order).
REGROUPING_AXES: tuple[str, ...] = tuple(a.name for a in PRICING_ORDER if not a.multiplies_gpus)


@dataclass
class ShardedNodes:
    """Per-node arrays for one rank (`RankShare`), per sample (multiply by the micro-batch size)."""

    kind: np.ndarray
    group: np.ndarray
    role: np.ndarray  # how a width split shards it (`LayerNode.role`)
    fwd_flops: np.ndarray
    bwd_flops: np.ndarray
    params: np.ndarray  # parameters of one occurrence held by one rank (its share of the experts)
    act_elems: np.ndarray  # elements saved for backward by one occurrence
    io_elems: np.ndarray  # elements read + written by the forward of one occurrence (for the memory roofline)
    in_full: np.ndarray  # input elements of the rank's sequence share, unsharded (a width split's collective payload)
    out_full: np.ndarray  # output elements of the rank's sequence share, unsharded
    gemm_m: np.ndarray  # GEMM dims on one rank at micro-batch 1 (0 where the node is not a GEMM)
    gemm_n: np.ndarray
    gemm_k: np.ndarray
    gemm_batch: np.ndarray  # independent GEMMs per sample (attention: heads on this rank)
    attention: np.ndarray  # bool: attention core (what selective recomputation recomputes)
    repeated: np.ndarray  # bool: node belongs to a repeated block (block / enc / dec)
    block_input: float  # elements of one block's input per sample on one rank (all that full recompute keeps)
    experts: np.ndarray  # bool: routed experts (weights split by `experts`, synchronised over the expert-dp group)
    dispatch: np.ndarray  # token-expert pair elements per sample the node sends to its experts (top_k·tokens·hidden)


@dataclass
class Layout:
    """One plan applied to one graph."""

    plan: Plan
    share: RankShare  # what one rank holds of each dimension of the layers
    nodes: ShardedNodes
    stage_counts: np.ndarray  # (stages, n_nodes): occurrences of each node on each pipeline rank
    blocks_per_stage: np.ndarray  # (stages,) repeated blocks held by each pipeline rank (all its chunks)
    microbatches: int
    tokens: int  # sequence positions per sample
    rank_tokens: float  # the sequence positions of a sample one rank holds (its `sequence` share)
    # Every communication group a rank joins, by `PLAN_GROUPS` name (a group of one rank communicates with nobody):
    # each axis's own and the complement of an axis that regroups a stage's ranks.
    groups: Mapping[str, Group]
    stage_link_inter: bool  # whether neighbouring pipeline stages sit in different NVLink domains
    p2p_elems: float  # elements sent per micro-batch boundary (one direction)
    act_bytes: int
    param_bytes: int
    grad_bytes: int

    @property
    def stages(self) -> int:
        """Pipeline stages (the ranks of one pipeline): how long every per-stage array is."""
        return len(self.blocks_per_stage)

    @property
    def sync_group(self) -> Group:
        """The group gradients sync over and ZeRO shards over: the replicas' (`REPLICA_AXIS`)."""
        return self.groups[_SYNC]

    @property
    def expert_sync_group(self) -> Group:
        """The group a regrouping axis's parameters (the routed experts) sync their gradients over."""
        return self.groups[_EXPERT_SYNC]

    def split_group(self, dimension: str) -> Group:
        """The group of the axis that splits `dimension` (`RankShare`; e.g. `experts`: the ranks that exchange the
        routed experts' tokens)."""
        if dimension not in SPLIT_GROUPS:
            raise ValueError(f"no one axis with a group splits {dimension!r} (predictor.plan.axes: Axis.splits); "
                             f"dimensions with one: {', '.join(SPLIT_GROUPS)}")
        return self.groups[SPLIT_GROUPS[dimension]]


_SHARD_CACHE: dict[tuple, tuple[weakref.ref, ShardedNodes]] = {}
_STAGE_CACHE: dict[tuple, tuple[weakref.ref, tuple[np.ndarray, np.ndarray]]] = {}


def _cached(cache: dict, graph: LayerGraph, key: tuple, build):
    full = (id(graph), *key)
    hit = cache.get(full)
    if hit is not None and hit[0]() is graph:
        return hit[1]
    value = build()
    cache[full] = (weakref.ref(graph, lambda _r, k=full: cache.pop(k, None)), value)
    return value


def _prod(shape: tuple[int, ...]) -> float:
    return float(np.prod(shape)) if shape else 1.0


def shard_nodes(graph: LayerGraph, share: RankShare, heads: int | None = None) -> ShardedNodes:
    """Per-rank node arrays under `share` (cached)."""
    return _cached(_SHARD_CACHE, graph, (share, heads), lambda: _shard(graph, share, heads))


def _shard(graph: LayerGraph, share: RankShare, heads: int | None) -> ShardedNodes:
    nodes = graph.nodes
    n = len(nodes)
    width, tokens, seq, seq_shard = share.width, share.tokens, share.sequence, share.seq_shard
    role = np.array([nd.role for nd in nodes])
    kind = np.array([nd.kind for nd in nodes])
    group = np.array([nd.group for nd in nodes])
    sharded = np.isin(role, _SHARDED_ROLES)
    by_tokens = np.isin(role, _TOKEN_ROLES)
    seq_split = (role == "replicated") & np.isin(kind, SEQUENCE_SPLIT_KINDS)
    flop_div = np.where(sharded, width, np.where(by_tokens, tokens, np.where(seq_split, seq_shard, 1)))
    experts = kind == "experts"
    # Saved input: full for column/vocab linears and replicated nodes (its sequence shard with sp), sharded otherwise.
    full_input = ((role == "column") & (kind == "linear")) | ((role == "vocab") & (kind != "loss")) | (role == "replicated")
    act_div = np.where(full_input, seq_shard, np.where(by_tokens, tokens, width))
    in_elems = np.array([_prod(nd.in_shape) for nd in nodes]) / seq
    out_elems = np.array([float(nd.out_elems) for nd in nodes]) / seq

    gm, gn, gk, gb = (np.zeros(n) for _ in range(4))
    attention = kind == "attention"
    for i, nd in enumerate(nodes):
        if nd.kind == "linear" and len(nd.in_shape) >= 1 and len(nd.out_shape) >= 1:
            m, k, nn = _prod(nd.in_shape[:-1]) / seq, nd.in_shape[-1], nd.out_shape[-1]
            if nd.role in ("column", "vocab"):
                nn = nn / width
            elif nd.role == "row":
                k = k / width
            gm[i], gn[i], gk[i], gb[i] = m, nn, k, 1
        elif nd.kind == "experts":  # the rank's experts as grouped GEMMs, each on its ranks' tokens·top_k/E rows
            e, d_in, d_ffn = nd.attrs["experts"], nd.attrs["d_in"], nd.attrs["d_ffn"]
            rows = nd.fwd_flops / (2 * 3 * d_in * d_ffn) / e  # per expert and sample (gate, up and down GEMMs)
            # a split expert width: its ranks' tokens gathered, its share of each expert's FFN
            gm[i], gn[i], gk[i], gb[i] = (rows * share.experts * share.expert_width / (tokens * seq),
                                          3 * d_ffn / share.expert_width, d_in, e / share.experts)
        elif nd.kind == "router":
            gm[i], gn[i], gk[i], gb[i] = (_prod(nd.in_shape[:-1]) / (tokens * seq), nd.params / nd.in_shape[-1],
                                          nd.in_shape[-1], 1)
        elif nd.kind == "ssm":  # the chunked scan as batched GEMMs per head: tokens x state, inner head_dim
            a = nd.attrs
            gm[i], gn[i], gk[i], gb[i] = a.get("seq", graph.tokens) / seq, a["state"] + a["chunk"], a["head_dim"], \
                max(a["heads"] / width, 1)
        elif nd.kind == "attention":
            h = nd.attrs.get("heads", heads or 1)
            seq_len = nd.attrs.get("seq", nd.in_shape[-2] if len(nd.in_shape) >= 2 else graph.tokens)
            hd = nd.attrs.get("head_dim", (nd.out_shape[-1] // h) if nd.out_shape else 64)
            gm[i], gn[i], gk[i], gb[i] = seq_len / seq, seq_len, hd, max(h / width, 1)

    repeated = np.isin(group, REPEATED_GROUPS)
    first_block = next((nd for nd in nodes if nd.group in REPEATED_GROUPS), None)
    block_in = (_prod(first_block.in_shape) / seq_shard / seq) if first_block else 0.0
    return ShardedNodes(
        kind=kind, group=group, role=role,
        fwd_flops=np.array([nd.fwd_flops for nd in nodes]) / flop_div / seq,
        bwd_flops=np.array([nd.bwd_flops for nd in nodes]) / flop_div / seq,
        params=np.array([float(nd.params) for nd in nodes])
        / np.where(sharded, width, np.where(experts, share.experts * share.expert_width, 1)),
        act_elems=np.array([float(nd.act_elems) for nd in nodes]) / act_div / seq,
        io_elems=(in_elems + out_elems) / flop_div,
        in_full=in_elems, out_full=out_elems, gemm_m=gm, gemm_n=gn, gemm_k=gk, gemm_batch=gb, attention=attention,
        repeated=repeated, block_input=block_in, experts=experts,
        # tokens·top_k pairs of `hidden` elements: the forward FLOPs are 2·pairs·hidden·3·d_ffn
        dispatch=np.array([nd.fwd_flops / (6 * nd.attrs["d_ffn"]) if nd.kind == "experts" else 0.0 for nd in nodes])
        / (tokens * seq),
    )


def stage_counts(graph: LayerGraph, depth: int, v: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(depth, n_nodes) occurrences per pipeline rank and (depth,) blocks per rank of a pipeline of `depth` stages
    (cached per graph, depth, v).

    Repeated blocks are split evenly over the depth·v chunks in model order (encoder before decoder);
    chunk c belongs to rank c mod depth (Megatron's interleaved assignment). `pre` nodes go to the
    first rank, `post` nodes to the last.
    """
    return _cached(_STAGE_CACHE, graph, (depth, v), lambda: _stages(graph, depth, v))


def _stages(graph: LayerGraph, depth: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    nodes = graph.nodes
    chunks = depth * v
    spans: dict[str, float] = {}
    for nd in nodes:
        if nd.group in REPEATED_GROUPS:
            spans[nd.group] = max(spans.get(nd.group, 0), nd.count)
    total = sum(spans.values()) or 1.0
    offsets, off = {}, 0.0
    for g, span in spans.items():
        offsets[g] = off
        off += span
    edges = np.linspace(0.0, total, chunks + 1)
    rank_of_chunk = np.arange(chunks) % depth
    counts = np.zeros((depth, len(nodes)))
    blocks = np.zeros(depth)
    for g, span in spans.items():
        lo, hi = offsets[g], offsets[g] + span
        overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0, None)
        per_rank = np.bincount(rank_of_chunk, weights=overlap, minlength=depth)
        blocks += per_rank
        for i, nd in enumerate(nodes):
            if nd.group == g:
                counts[:, i] = nd.count * per_rank / span
    for i, nd in enumerate(nodes):
        if nd.group == "pre":
            counts[0, i] = nd.count
        elif nd.group == "post":
            counts[depth - 1, i] = nd.count
    return counts, blocks


@lru_cache(maxsize=65536)
def _spread(degrees: tuple[tuple[str, int], ...], placement: str, axes: tuple[str, ...], domain: int) -> tuple[int, int]:
    """(ranks per NVLink domain, domains) of the group of `axes` holding rank 0, from its global ranks.

    Where the ranks do not fill domains evenly (an NVL72 domain of 72 GPUs with a dp stride of 8), the
    ranks per domain are the largest count that divides the group, as hierarchical collectives need."""
    return _fit(Plan(placement=placement, **dict(degrees)).group_ranks(axes), domain)


@lru_cache(maxsize=65536)
def _regrouped_spread(degrees: tuple[tuple[str, int], ...], placement: str, axis: str,
                      domain: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(ranks per domain, domains) of the group holding rank 0 of `axis`, an axis that regroups a stage's ranks, and
    of its complement group.

    Megatron-Core builds the expert layers' groups from a stage's dp·tp·cp ranks in rank order, the regrouping axes
    nested innermost first (`REGROUPING_AXES`: etp, then ep; parallel_state's expert RankGenerator tp=etp, ep,
    dp): an etp group is etp consecutive ranks of them, an ep group every etp-th of ep·etp consecutive ones, and the
    expert-dp group every (ep·etp)-th."""
    plan = Plan(placement=placement, **dict(degrees))
    ranks = plan.group_ranks(STAGE_RANK_AXES)
    inner = REGROUPING_AXES[:REGROUPING_AXES.index(axis)]
    stride = math.prod(getattr(plan, a) for a in inner)
    span = stride * getattr(plan, axis)
    return _fit(ranks[:span:stride], domain), _fit(ranks[::span], domain)


def _fit(ranks: list[int], domain: int) -> tuple[int, int]:
    """(ranks per domain, domains) of a group of global `ranks` on NVLink domains of `domain` GPUs."""
    per_domain = max(Counter(r // domain for r in ranks).values())
    while len(ranks) % per_domain:
        per_domain -= 1
    return per_domain, len(ranks) // per_domain


def regrouped(plan: Plan, axis: str, domain: int, device: Device) -> tuple[Group, Group]:
    """The group of `axis`, an axis that regroups a stage's ranks (ep: its token all-to-alls), and its complement
    group (ep's expert-data-parallel group: expert gradient sync) of `plan`."""
    ops = tuple(sorted(device.op_links.items()))
    (ei, ek), (di, dk) = _regrouped_spread(tuple(plan.degrees().items()), plan.placement, axis, domain)
    return (Group(ei, ek, device.intra_node, device.inter_node, ops),
            Group(di, dk, device.intra_node, device.inter_node, ops))


def group_of(plan: Plan, axes: str | tuple[str, ...], domain: int, device: Device) -> Group:
    """The communication group of `axes` (one axis, or several whose ranks form one group, e.g. the
    gradient sync over dp and cp): its ranks per NVLink domain (`domain` GPUs) and domains spanned,
    from the plan's rank order."""
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    ops = tuple(sorted(device.op_links.items()))
    degrees = tuple(plan.degrees().items())
    n_intra, n_inter = _spread(degrees, plan.placement, axes, domain)
    return Group(n_intra, n_inter, device.intra_node, device.inter_node, ops)


@dataclass(frozen=True)
class PlanGroups:
    """The communication groups of a plan's rank order on NVLink domains, by `PLAN_GROUPS` name, and whether
    pipeline neighbours sit in different domains: what depends on the degrees and the placement alone."""

    groups: Mapping[str, Group]
    stage_link_inter: bool


def plan_groups(plan: Plan, domain: int, device: Device) -> PlanGroups:
    """The groups of `plan` on NVLink domains of `domain` GPUs: each axis's (`Axis.group`, over the ranks of
    `Axis.group_axes`; an axis that regroups a stage's ranks, with its complement group)."""
    groups: dict[str, Group] = {}
    for axis in AXES:
        if not axis.group:
            continue
        if axis.multiplies_gpus:
            groups[axis.group] = group_of(plan, axis.group_axes, domain, device)
            continue
        groups[axis.group], complement = regrouped(plan, axis.name, domain, device)
        if axis.complement_group:
            groups[axis.complement_group] = complement
    pipeline = getattr(plan, PIPELINE_AXIS)
    return PlanGroups(groups, pipeline > 1 and plan.group_span(PIPELINE_AXIS) > domain)


def apply_plan(spec: WorkloadSpec, graph: LayerGraph, plan: Plan, device: Device) -> Layout:
    """Everything a predictor needs about `plan` on `graph` (assumes plan_errors(plan, spec) is empty)."""
    m = spec.model
    share = RankShare.of(plan)
    nodes = shard_nodes(graph, share, m.heads)
    counts, blocks = stage_counts(graph, share.layers, plan.v)
    prec = spec.training.precision
    hidden = m.hidden or 0
    p2p = graph.tokens * hidden * plan.mbs / share.seq_shard / share.sequence
    groups = plan_groups(plan, nvlink_domain(spec), device)
    return Layout(
        plan=plan, share=share, nodes=nodes, stage_counts=counts, blocks_per_stage=blocks,
        microbatches=plan.microbatches(spec.training.global_batch), tokens=graph.tokens,
        rank_tokens=graph.tokens / share.sequence, groups=groups.groups, stage_link_inter=groups.stage_link_inter,
        p2p_elems=p2p,
        act_bytes=BYTES[prec], param_bytes=BYTES[prec], grad_bytes=BYTES[prec],
    )
