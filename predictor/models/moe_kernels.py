"""The memory-bound kernels of a mixture-of-experts layer beside its GEMMs: the token dispatcher's permutations and
the router's score, top-k and auxiliary-loss kernels, fused (Transformer Engine) or as PyTorch operators.

Read from NVIDIA/Megatron-LM (Megatron-Core 0.16):
- megatron/core/transformer/moe/token_dispatcher.py, `MoEAlltoAllTokenDispatcher`: permute -> all-to-all ->
  sort_chunks_by_idxs (num_local_experts > 1: the received chunks regrouped by local expert) -> experts ->
  sort_chunks_by_idxs back -> all-to-all -> unpermute; `MoEAllGatherTokenDispatcher` and the flex dispatcher permute
  and unpermute once each, without the chunk sorts;
- megatron/core/transformer/moe/moe_utils.py: `permute` gathers one row per token-expert pair (fused: TE's
  `moe_permute_with_probs`, its row-id map and the gather; unfused: the routing map transposed, an argsort over
  tokens x experts, the indices and probabilities gathered, `index_select`); `unpermute` sums each token's pairs
  back (fused: TE's `moe_unpermute`; unfused: a zeroed output and `scatter_add_`, a read-modify-write per pair);
  `sort_chunks_by_idxs` (fused: TE's `moe_sort_chunks_by_index`; unfused: `torch.split` and `torch.cat`);
  `topk_routing_with_score_function` and `switch_load_balancing_loss_func` (fused: TE's
  `fused_topk_with_score_function`, `fused_compute_score_for_moe_aux_loss`, `fused_moe_aux_loss`; unfused: the score
  function, `topk`, the routing map and probabilities scattered back to tokens x experts, the auxiliary loss's own
  scores and reductions), switched by `moe_permute_fusion` and `moe_router_fusion`.

Each pass's backward moves the same bytes the other way (a gather's gradient is a scatter-add and the reverse), so a
backward costs what its forward does. Bytes go at the streaming bandwidth; each kernel adds a launch on the device
and each operator the host's per-operator cost (`AnalyticalConfig.host_op_s`). What is priced is what the unfused
operators add over the fused kernels (`moe_kernel_costs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictor.frameworks.kernels import Kernels

# Bytes per element of the router's logits and scores (--moe-router-dtype fp32, as the launch files write it) and of
# the int64 indices.
ROUTER_BYTES = 4.0
INDEX_BYTES = 8.0


@dataclass(frozen=True)
class PassCost:
    """One forward pass of some kernels: bytes through memory, kernels launched, host operators issued."""

    bytes: np.ndarray
    kernels: np.ndarray
    ops: np.ndarray

    def __add__(self, other: "PassCost") -> "PassCost":
        return PassCost(self.bytes + other.bytes, self.kernels + other.kernels, self.ops + other.ops)


def _permutations(pairs: np.ndarray, tokens: np.ndarray, hidden: np.ndarray, experts: float, local: np.ndarray,
                  act_bytes: float, fused: bool, sorts: bool) -> PassCost:
    """The dispatcher's permutations of one forward: `pairs` token-expert rows and `tokens` rows of `hidden`
    elements of `act_bytes` bytes, the router's `experts` columns per token, `local` experts per rank."""
    moved = pairs * hidden * act_bytes  # one pass over the permuted rows
    rows = tokens * hidden * act_bytes
    one = np.ones_like(pairs)
    if fused:  # TE: row-id map + gather; the summing unpermute; each chunk sort one kernel
        permute = PassCost(2 * moved, 3 * one, one)
        unpermute = PassCost(moved + rows, one, one)
        sort = PassCost(2 * moved, one, one)
    else:
        # the boolean map transposed, a radix argsort of its tokens x experts 1-byte keys with int64 values (four
        # 8-bit digit passes, each reading and writing keys and values), the index arithmetic, the fp32
        # probabilities transposed and gathered, index_select
        grid = tokens * experts
        argsort = 4 * 2 * grid * (1.0 + INDEX_BYTES)
        permute = PassCost(2 * grid + argsort + 2 * grid * ROUTER_BYTES + 2 * moved, 9 * one, 7 * one)
        # a zeroed output, then an atomic read-modify-write of it per pair
        unpermute = PassCost(rows + 3 * moved, 2 * one, 2 * one)
        sort = PassCost(2 * moved, one, 2 * one)
    total = permute + unpermute
    if sorts:  # alltoall only, with more than one local expert: the chunks regrouped after dispatch and before combine
        many = (local > 1).astype(float)
        total = total + PassCost(2 * sort.bytes * many, 2 * sort.kernels * many, 2 * sort.ops * many)
    return total


def _router(tokens: np.ndarray, experts: np.ndarray, fused: bool) -> PassCost:
    """The router's kernels beside its gating GEMM in one forward: `tokens` x `experts` fp32 scores."""
    grid = tokens * experts * ROUTER_BYTES
    if fused:  # top-k with its score function; the auxiliary loss's scores; the loss
        return PassCost(4 * grid, np.full_like(tokens, 3.0), np.full_like(tokens, 3.0))
    # score function (read, write), topk (read), the routing map and the probabilities scattered to tokens x experts
    # (zeros, scatter, casts), the auxiliary loss's scores (read, write) and its reductions (two reads)
    return PassCost(11 * grid, np.full_like(tokens, 12.0), np.full_like(tokens, 12.0))


def moe_kernel_costs(nodes, mbs: int, top_k: int, kernels: Kernels, dispatcher: str, act_bytes: float,
                     bandwidth: float, launch_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(forward seconds, host operators) per node of one micro-batch that the MoE kernels the run leaves unfused add
    over Transformer Engine's fused ones: on the routed experts' nodes the dispatcher's permutations (`dispatcher`: the
    plan's; `top_k` pairs per token) without `moe_permute_fusion`, on the routers the score and top-k kernels without
    `moe_router_fusion`; zero elsewhere. The backward's are the forward's.

    The fused kernels' own passes (each permuted row read and written) are part of the routed experts' time that
    `AnalyticalConfig.grouped_gemm_eff` carries: it was chosen on runs that fused them (Megatron-Bridge's recipes), and
    pricing them apart moved the cross-validated MoE figure from 16.9 % to 18.2 % (docs/modeling.md)."""
    n = len(nodes.kind)
    kind = np.asarray(nodes.kind)
    seconds, ops = np.zeros(n), np.zeros(n)
    experts = np.asarray(nodes.experts, dtype=bool)
    routers = kind == "router"
    if experts.any() and not kernels.moe_permute_fusion:
        hidden = np.where(experts, nodes.gemm_k, 1.0)
        pairs = nodes.dispatch * mbs / hidden  # token-expert pairs on the rank (dispatch: pairs x hidden elements)
        width = float(nodes.gemm_n[routers][0]) if routers.any() else 1.0
        args = (pairs, pairs / max(top_k, 1), hidden, width, nodes.gemm_batch, act_bytes)
        sorts = dispatcher == "alltoall"
        extra = _difference(_permutations(*args, False, sorts), _permutations(*args, True, sorts))
        seconds = np.where(experts, extra.bytes / bandwidth + extra.kernels * launch_s, seconds)
        ops = np.where(experts, extra.ops, ops)
    if routers.any() and not kernels.moe_router_fusion:
        tokens = nodes.gemm_m * mbs
        extra = _difference(_router(tokens, nodes.gemm_n, False), _router(tokens, nodes.gemm_n, True))
        seconds = np.where(routers, extra.bytes / bandwidth + extra.kernels * launch_s, seconds)
        ops = np.where(routers, extra.ops, ops)
    return seconds, ops


def _difference(unfused: PassCost, fused: PassCost) -> PassCost:
    return PassCost(unfused.bytes - fused.bytes, unfused.kernels - fused.kernels, unfused.ops - fused.ops)
