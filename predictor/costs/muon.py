"""The Muon optimizer as Megatron-Core 0.16.1 runs it (megatron/core/optimizer/muon.py, layer_wise_optimizer.py).

`get_megatron_muon_optimizer` gives every 2-D weight that is not the embedding or the output layer to
`TensorParallelMuon` (one fp32 `momentum_buffer` per parameter beside the fp32 master) and the rest (embeddings,
output layer, norms, biases, convolutions) to Adam. Each step orthogonalises a matrix's momentum with
`muon_num_ns_steps` = 5 Newton-Schulz iterations (emerging_optimizers `newton_schulz`: for X of m x M, m <= M,
A = X X^T, B = bA + cA^2, X = aX + BX), in `muon_tp_mode` "blockwise": each tensor-parallel rank on its own shard,
in `muon_fp32_matmul_prec` "medium" (BF16 tensor cores). Megatron's distributed optimizer is refused beside it
("muon with dist optimizer is not supported"); `--optimizer dist_muon` instead wraps both in the
`LayerWiseDistributedOptimizer`: gradients all-reduced whole over data parallelism, each rank stepping the layers it
owns (states and Newton-Schulz work 1/dp each), the updated parameters all-gathered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from predictor.costs.parallel import Layout, ShardedNodes

NS_STEPS = 5  # OptimizerConfig.muon_num_ns_steps
_MUON_KINDS = ("linear", "router")


def muon_nodes(nodes: "ShardedNodes") -> np.ndarray:
    """Nodes whose weights Muon steps: the 2-D weights of linears, routers and experts outside the embedding and
    the output layer (the `pre` and `post` groups)."""
    body = (nodes.group != "pre") & (nodes.group != "post")
    return (np.isin(nodes.kind, _MUON_KINDS) & body) | nodes.experts


def muon_params(layout: "Layout") -> tuple[np.ndarray, np.ndarray]:
    """(all, routed experts') parameters per rank of each pipeline stage that Muon steps."""
    counts, nodes = layout.stage_counts, layout.nodes
    mask = muon_nodes(nodes)
    return counts @ (nodes.params * mask), counts @ (nodes.params * (mask & nodes.experts))


def newton_schulz_flops(nodes: "ShardedNodes") -> np.ndarray:
    """FLOPs of one step's Newton-Schulz iterations per occurrence of each node on one rank (its local shards:
    a linear's k x n weight, each routed expert's three d_in x d_ffn matrices)."""
    k, n = nodes.gemm_k, nodes.gemm_n
    experts = nodes.experts
    n = np.where(experts, n / 3, n)  # gate, up and down: three matrices of d_in x d_ffn per expert
    small, large = np.minimum(k, n), np.maximum(k, n)
    per_matrix = NS_STEPS * (4 * small**2 * large + 2 * small**3)  # X X^T, A A and B X
    matrices = np.where(experts, 3 * nodes.gemm_batch, 1.0)
    return np.where(muon_nodes(nodes), per_matrix * matrices, 0.0)


def newton_schulz_shapes(nodes: "ShardedNodes") -> tuple[np.ndarray, np.ndarray]:
    """(m, M) of each node's matrices (m <= M): the GEMMs' shapes, for their efficiency."""
    n = np.where(nodes.experts, nodes.gemm_n / 3, nodes.gemm_n)
    return np.minimum(nodes.gemm_k, n), np.maximum(nodes.gemm_k, n)
