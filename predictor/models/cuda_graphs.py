"""What capturing part of a step as CUDA graphs changes (`training.kernels.cuda_graphs` with `cuda_graph_scope`):
the host launches a captured region once instead of operator by operator, and each graph keeps static buffers.

Scopes (Megatron-LM `--cuda-graph-scope`, megatron/core/transformer/cuda_graphs.py and transformer_layer.py):
- layer: the whole transformer layer, one graph per layer (Megatron-LM's default scope with `--cuda-graph-impl`);
- attn: the attention sublayer (input norm through the output projection), one graph per layer;
- moe_router: the MoE router; moe_preprocess: the router with the dispatcher's preprocessing (the routing map and
  the permutation metadata before the token exchange). The layer graph has no node for the preprocessing, so it
  adds nothing the router's graph does not; the experts stay eager (their token counts are dynamic);
- full_iteration: the whole forward and backward of every micro-batch (Megatron-LM's `FullCudaGraphWrapper`): no
  host time per operator at all.

Static buffers: Transformer Engine's `make_graphed_callables` (transformer_engine/pytorch/graph.py) keeps, for each
captured callable and micro-batch, its static inputs and outputs and, for backward, the gradients of both: four
hidden-sized tensors per region, layer and micro-batch in flight. A full-iteration graph's only static tensors are
the batch it reads, and its activations are those the eager step would hold.
"""

from __future__ import annotations

import numpy as np

from predictor.costs.parallel import Layout
from predictor.frameworks.kernels import Kernels


def regions(nodes, scope: str) -> list[np.ndarray]:
    """The captured regions of one block as node masks (each is launched as one graph per layer)."""
    repeated = np.asarray(nodes.repeated, dtype=bool)
    if scope == "layer":
        return [repeated]
    out = []
    parts = set(scope.split("+"))
    if "attn" in parts:
        core = np.flatnonzero(np.asarray(nodes.attention, dtype=bool) & repeated)
        if core.size:
            upto = np.arange(len(repeated)) <= core[0] + 1  # through the output projection after the core
            out.append(repeated & upto)
    if parts & {"moe_router", "moe_preprocess"}:
        out.append(repeated & (np.asarray(nodes.kind) == "router"))
    return [r for r in out if r.any()]


def host_ops(ops: np.ndarray, nodes, kernels: Kernels) -> np.ndarray:
    """Host operators per node under the kernels' CUDA graphs: each captured region one launch (spread over its
    nodes), none under full_iteration, the others eager."""
    if not kernels.cuda_graphs:
        return ops
    if kernels.cuda_graph_scope == "full_iteration":
        return np.zeros_like(ops)
    for region in regions(nodes, kernels.cuda_graph_scope):
        ops = np.where(region, 1.0 / int(region.sum()), ops)
    return ops


def static_bytes(layout: Layout, kernels: Kernels, in_flight: np.ndarray) -> np.ndarray:
    """Bytes of the graphs' static inputs, outputs and their gradients per pipeline rank (`in_flight`: micro-batches
    whose graphs hold them at the peak)."""
    if not kernels.cuda_graphs or kernels.cuda_graph_scope == "full_iteration":
        return np.zeros(layout.stages)
    plan, nodes = layout.plan, layout.nodes
    hidden = nodes.block_input * plan.mbs * layout.act_bytes  # one region's input, as its output and gradients
    count = len(regions(nodes, kernels.cuda_graph_scope))
    return 4 * hidden * count * layout.blocks_per_stage * in_flight
