"""LoRA fine-tuning (`training.lora_rank`), as Megatron-Bridge's PEFT runs it (megatron/bridge/peft/lora.py `LoRA`:
adapters on the blocks' `linear_qkv`, `linear_proj`, `linear_fc1` and `linear_fc2`, the base model frozen).

Each adapted linear of k inputs and n outputs gains A (k x r) and B (r x n); under tensor parallelism the adapter
shards with its linear (`ParallelLinearAdapter`: a column linear's B by columns, a row linear's A by rows), so one
rank holds r·(k_local + n_local). Only the adapters train: the base weights keep no gradient, no fp32 master and no
optimizer state, and synchronise nothing over data parallelism. A frozen linear's backward computes its input's
gradient (dgrad) but no weight gradient, about its forward's work; the frozen embedding's backward is nothing. The
adapters' two skinny GEMMs run beside each linear, forward and backward (dgrad and wgrad). Routed experts and the
output layer are frozen without adapters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from predictor.costs.parallel import Layout, ShardedNodes

_BLOCK_GROUPS = ("block", "enc", "dec")


def adapted(nodes: "ShardedNodes") -> np.ndarray:
    """The linears LoRA adapts: every linear inside the repeated blocks."""
    return (nodes.kind == "linear") & np.isin(nodes.group, _BLOCK_GROUPS)


def adapter_params(nodes: "ShardedNodes", rank: int) -> np.ndarray:
    """Adapter parameters on one rank per occurrence of each node: r·(k_local + n_local) for an adapted linear."""
    return np.where(adapted(nodes), rank * (nodes.gemm_k + nodes.gemm_n), 0.0)


def trainable_params(layout: "Layout", rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(all, routed experts') trainable parameters per rank of each pipeline stage: the adapters, no expert's."""
    psi = layout.stage_counts @ adapter_params(layout.nodes, rank)
    return psi, np.zeros_like(psi)


def frozen_backward(nodes: "ShardedNodes", fwd: np.ndarray, bwd: np.ndarray) -> np.ndarray:
    """Backward seconds per node with the base frozen: a linear's or the experts' dgrad alone (its forward's GEMMs
    again, at most its full backward), the embedding's nothing, the rest unchanged."""
    gemms = np.isin(nodes.kind, ("linear", "experts"))
    return np.where(gemms, np.minimum(bwd, fwd), np.where(nodes.kind == "embedding", 0.0, bwd))
