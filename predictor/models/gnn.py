"""The cross-layer correction network of ScaleDL (paper Eqs. 11-14).

A `TransformerConv` over the layer graph, with edge features (elements passed, direction)
entering the attention score, heads averaged (`concat=False`, Eq. 13), mean+max pooled,
concatenated with an MLP of the global settings Z (Eq. 14), and a head giving one
multiplicative correction factor per time term (α compute, β dp comm, and the terms this
project's plans add). Factors are exp(head) with the head initialised to zero, so an
untrained network leaves the composed time unchanged and training only learns deviations.

`CorrectionEnsemble` averages several such networks (geometric mean of their factors): each is
trained on a few hundred noisy iterations, and networks started from other seeds disagree most
exactly where one of them extrapolates badly.

Note: PyG's TransformerConv adds the projected edge feature to the key (score =
q_i·(k_j + W_e e_ij)/√d) rather than the paper's separate ReLU(W_e e_ij + b) bias; both put
the edge features into the attention score.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch_geometric.data import Data
from torch_geometric.nn import TransformerConv, global_max_pool, global_mean_pool

from predictor.graph.layer_graph import LayerGraph
from predictor.models.features import edge_tensors, node_matrix


def graph_data(graph: LayerGraph, layer_s: np.ndarray) -> Data:
    """The network's view of a layer graph whose layers take `layer_s` (fwd+bwd seconds per node)."""
    index, attr = edge_tensors(graph)
    return Data(x=torch.from_numpy(node_matrix(graph, layer_s)), edge_index=torch.from_numpy(index),
                edge_attr=torch.from_numpy(attr))


class CorrectionGNN(nn.Module):
    """Ω(G, Z) -> correction factors, one per time term."""

    def __init__(self, node_dim: int, edge_dim: int, global_dim: int, n_factors: int,
                 hidden: int = 32, heads: int = 4, use_graph: bool = True, use_global: bool = True,
                 max_log_factor: float = 4.0) -> None:
        super().__init__()
        if not (use_graph or use_global):
            raise ValueError("CorrectionGNN needs the graph branch, the global branch, or both")
        self.use_graph, self.use_global = use_graph, use_global
        self.max_log_factor = max_log_factor
        width = 0
        if use_graph:
            self.embed = nn.Sequential(nn.Linear(node_dim, hidden), nn.ReLU())
            self.conv = TransformerConv(hidden, hidden, heads=heads, concat=False, edge_dim=edge_dim)
            width += 2 * hidden
        if use_global:
            self.global_mlp = nn.Sequential(nn.Linear(global_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
            width += hidden
        self.head = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, n_factors))
        nn.init.zeros_(self.head[-1].weight)
        nn.init.zeros_(self.head[-1].bias)

    def graph_embedding(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor,
                        batch: torch.Tensor) -> torch.Tensor:
        """Pooled node embeddings per graph (Eqs. 11-13 + pooling); cacheable per graph."""
        h = self.embed(x)
        h = torch.relu(self.conv(h, edge_index, edge_attr)) + h
        return torch.cat([global_mean_pool(h, batch), global_max_pool(h, batch)], dim=1)

    def factors(self, graph_emb: torch.Tensor | None, z: torch.Tensor) -> torch.Tensor:
        """Eq. 14: factors from [pooled graph ‖ MLP(Z)]; graph_emb rows align with z rows."""
        return torch.exp(self.log_factors(graph_emb, z))

    def log_factors(self, graph_emb: torch.Tensor | None, z: torch.Tensor) -> torch.Tensor:
        """The factors' logarithms, bounded to ±max_log_factor."""
        parts = []
        if self.use_graph:
            assert graph_emb is not None
            parts.append(graph_emb)
        if self.use_global:
            parts.append(self.global_mlp(z))
        out = self.head(torch.cat(parts, dim=1))
        return self.max_log_factor * torch.tanh(out / self.max_log_factor)


class CorrectionEnsemble(nn.Module):
    """K CorrectionGNNs trained apart (other seeds, other validation splits); factors are their geometric mean."""

    def __init__(self, size: int, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - CorrectionGNN's arguments
        super().__init__()
        if size < 1:
            raise ValueError(f"an ensemble needs at least one network, got {size}")
        self.members = nn.ModuleList(CorrectionGNN(*args, **kwargs) for _ in range(size))

    def graph_embedding(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor,
                        batch: torch.Tensor) -> torch.Tensor:
        """Every member's pooled embedding, side by side (cached per graph like one network's)."""
        return torch.cat([m.graph_embedding(x, edge_index, edge_attr, batch) for m in self.members], dim=1)

    def factors(self, graph_emb: torch.Tensor | None, z: torch.Tensor) -> torch.Tensor:
        parts = [None] * len(self.members) if graph_emb is None else graph_emb.chunk(len(self.members), dim=1)
        return torch.exp(torch.stack([m.log_factors(e, z) for m, e in zip(self.members, parts)]).mean(0))
