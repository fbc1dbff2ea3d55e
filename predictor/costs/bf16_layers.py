"""Per-layer precision: the first and last N transformer layers of an FP8 or FP4 run kept in BF16.

Megatron-Core's `first_last_layers_bf16` with `num_layers_at_start_in_bf16` / `num_layers_at_end_in_bf16`
(megatron/core/fp8_utils.py `is_first_last_bf16_layer`: by global layer index, so the layers sit on the first and last
pipeline chunks), as Megatron-Bridge's Nemotron-H providers and NVFP4 recipes set it; torchtitan leaves a layer's
linears out of its float8/MX converters by `filter_fqns` (torchtitan/components/quantization/utils.py
`module_filter_fn`: a substring of the module's name, `layers.<i>.`). Such a layer's linears run at BF16's rate
without the recipe's quantisation passes and keep no low-precision weight copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from predictor.costs.parallel import Layout


def bf16_layer_indices(first: int, last: int, blocks: int) -> list[int]:
    """The global indices of the layers kept in BF16."""
    return sorted(set(range(min(first, blocks))) | set(range(max(blocks - last, 0), blocks)))


def bf16_blocks_per_rank(lay: "Layout", first: int, last: int) -> np.ndarray:
    """(stages,) BF16 layers each pipeline rank holds: layer i in chunk floor(i·stages·v / L) of the even model-order
    split (`predictor.costs.parallel.stage_counts`), chunk c on rank c mod stages."""
    stages, blocks = lay.stages, int(round(float(lay.blocks_per_stage.sum())))
    chunks = stages * lay.plan.v
    ranks = [min(i * chunks // max(blocks, 1), chunks - 1) % stages for i in bf16_layer_indices(first, last, blocks)]
    return np.bincount(np.asarray(ranks, dtype=int), minlength=stages).astype(float)


def per_layer_occurrences(lay: "Layout") -> np.ndarray:
    """Occurrences of each node in one transformer layer (0 outside the repeated blocks)."""
    blocks = max(float(lay.blocks_per_stage.sum()), 1.0)
    return np.where(lay.nodes.repeated, lay.stage_counts.sum(axis=0) / blocks, 0.0)
