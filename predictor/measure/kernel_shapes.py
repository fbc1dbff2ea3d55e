"""Which kernel shapes a device profile measures: the paper's D-optimal design applied to kernels.

A GEMM's rate depends on (batch, m, n, k) and a grouped GEMM's on (groups, tokens per group, n, k) non-linearly
(tile and wave quantisation, the launch floor, the sustained rate), so the shapes worth timing are those that
best fix a quadratic model of the rate in the log dimensions: the candidates' log2 features, expanded to a full
quadratic model (`predictor.measure.design.quadratic_features`), picked by Fedorov exchange (`predictor.measure.design.fedorov`),
the method `scaledl profile` uses for model configurations. Attention (sequence length) and the memory-bound copy
(bytes) have one variable each and are measured on a log grid.

Two grids: `cpu` (what one single-threaded rank times in milliseconds) and `cuda` (a data-centre GPU: the
256-8,192 range XLA's matmul tables cover, and MoE expert shapes).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from predictor.measure.design import DesignError, fedorov, quadratic_features


@dataclass(frozen=True)
class KernelGrid:
    """Candidate shapes of one class of device."""

    gemm_batch: tuple[int, ...]
    gemm_dims: tuple[int, ...]
    gemm_flop_cap: float  # largest product timed (FLOPs), so a point costs milliseconds
    groups: tuple[int, ...]
    group_tokens: tuple[int, ...]
    group_dims: tuple[int, ...]
    attention_seqs: tuple[int, ...]
    attention_head_dims: tuple[int, ...]
    attention_heads: int
    attention_tokens: int  # batch · seq held near this, so short sequences still fill the device
    copy_bytes: tuple[int, ...]
    collective_bytes: tuple[int, ...]


GRIDS = {
    "cpu": KernelGrid(gemm_batch=(1, 2, 4), gemm_dims=(16, 32, 64, 128, 256, 512), gemm_flop_cap=2.0**27,
                      groups=(2, 4, 8), group_tokens=(16, 32, 64, 128), group_dims=(32, 64, 128), attention_seqs=(32, 64, 128, 256),
                      attention_head_dims=(32,), attention_heads=2, attention_tokens=256,
                      copy_bytes=tuple(4**e for e in range(6, 13)), collective_bytes=tuple(4**e * 1024 for e in range(0, 4))),
    "cuda": KernelGrid(gemm_batch=(1, 4, 16), gemm_dims=(128, 256, 512, 1024, 2048, 4096, 8192), gemm_flop_cap=2.0**42,
                       groups=(4, 8, 16, 32, 64, 128), group_tokens=(64, 256, 1024, 4096), group_dims=(512, 1024, 2048, 4096, 7168),
                       attention_seqs=(512, 1024, 2048, 4096, 8192, 16384), attention_head_dims=(64, 128),
                       attention_heads=16, attention_tokens=16384,
                       copy_bytes=tuple(4**e for e in range(6, 17)), collective_bytes=tuple(4**e * 1024 for e in range(0, 10))),
}


def gemm_candidates(grid: KernelGrid) -> list[tuple[int, int, int, int]]:
    """Every (batch, m, n, k) of the grid up to its FLOP cap."""
    return [(b, m, n, k) for b, m, n, k in itertools.product(grid.gemm_batch, *[grid.gemm_dims] * 3)
            if 2.0 * b * m * n * k <= grid.gemm_flop_cap]


def grouped_candidates(grid: KernelGrid) -> list[tuple[int, int, int, int]]:
    """Every (groups, tokens per group, n, k) of the grid up to its FLOP cap."""
    return [(g, t, n, k) for g, t, n, k in itertools.product(grid.groups, grid.group_tokens, grid.group_dims, grid.group_dims)
            if 2.0 * g * t * n * k <= grid.gemm_flop_cap]


def d_optimal(candidates: list[tuple[int, ...]], k: int, seed: int = 0) -> list[tuple[int, ...]]:
    """`k` of `candidates` maximising the D-criterion of a quadratic model in their log dimensions (all of them
    where k reaches their number), in candidate order."""
    if k < 1:
        raise DesignError(f"a kernel design needs at least one shape, got {k}")
    if k >= len(candidates):
        return list(candidates)
    idx, _ = fedorov(quadratic_features(np.array(candidates, dtype=float)), k, seed)
    return [candidates[i] for i in idx]


def attention_shapes(grid: KernelGrid) -> list[tuple[int, int, int, int]]:
    """(seq, head_dim, heads, batch) of each attention point: batch · seq near the grid's token count."""
    return [(s, d, grid.attention_heads, max(1, grid.attention_tokens // s))
            for d in grid.attention_head_dims for s in grid.attention_seqs]
