"""A GEMM's rate from a device profile's measured grid: FLOP/s at (m, n, k, batch), interpolated over the grid.

The grid is XLA-style (predictor.kernels.profile: rows of (batch, m, n, k, FLOP/s) on powers of two). A query is
placed on it as the kernel would run it:
- m or n above the grid's largest is more output tiles of the same kind: the excess folds into the batch (an
  (8192, 4096, 4096) GEMM runs like two (4096, 4096, 4096) ones side by side), and a batch above the grid's largest
  keeps the largest's rate (the device is full);
- k above the grid's largest keeps that k's rate (a longer main loop over the same tiles);
- a dimension below the grid's smallest keeps the smallest's time, not its rate: a kernel that small is bound by its
  fixed cost (one wave, prologue and epilogue), so its rate falls in proportion;
- between grid points, log-rate is multilinear in log2 of each coordinate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from predictor.kernels.profile import DeviceProfile, shipped_profile
from predictor.spec.hardware import DEVICES, GENERATIONS, Device


@dataclass(frozen=True)
class GemmGrid:
    """log FLOP/s on the regular grid of log2 batch, m, n, k a profile's points span (every combination present)."""

    axes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # log2 of batch, m, n, k values
    log_rate: np.ndarray  # (batches, ms, ns, ks)

    @classmethod
    def of(cls, points: np.ndarray) -> "GemmGrid":
        """The grid of (batch, m, n, k, FLOP/s) rows; ValueError unless they cover every combination once."""
        values = [np.unique(points[:, i]) for i in range(4)]
        shape = tuple(len(v) for v in values)
        if len(points) != int(np.prod(shape)):
            raise ValueError(f"GEMM points do not form a full grid: {len(points)} rows for {shape} batch x m x n x k "
                             f"values")
        index = tuple(np.searchsorted(v, points[:, i]) for i, v in enumerate(values))
        log_rate = np.full(shape, np.nan)
        log_rate[index] = np.log(points[:, 4])
        if np.isnan(log_rate).any():
            raise ValueError("GEMM points repeat a (batch, m, n, k) and leave another out")
        return cls(tuple(np.log2(v) for v in values), log_rate)

    def rate(self, m, n, k, batch=1) -> np.ndarray:
        """FLOP/s of a batch of `batch` (m×k)·(k×n) GEMMs (arrays broadcast), placed on the grid as the module says."""
        m, n, k, batch = np.broadcast_arrays(*(np.maximum(np.asarray(x, dtype=float), 1.0) for x in (m, n, k, batch)))
        lb, lm, ln, lk = (np.log2(x) for x in (batch, m, n, k))
        top_m, top_n = self.axes[1][-1], self.axes[2][-1]
        lb = lb + np.maximum(lm - top_m, 0.0) + np.maximum(ln - top_n, 0.0)  # excess rows and columns: more tiles
        coords = [lb, np.minimum(lm, top_m), np.minimum(ln, top_n), lk]
        value = np.zeros(lb.shape)
        weights = []
        for axis, x in zip(self.axes, coords):
            x = np.clip(x, axis[0], axis[-1])
            if len(axis) == 1:
                weights.append((np.zeros(x.shape, dtype=int), np.zeros(x.shape)))
                continue
            i = np.clip(np.searchsorted(axis, x, side="right") - 1, 0, len(axis) - 2)
            weights.append((i, (x - axis[i]) / (axis[i + 1] - axis[i])))
        for corner in np.ndindex(*(2 if len(a) > 1 else 1 for a in self.axes)):
            idx = tuple(i + c for (i, _), c in zip(weights, corner))
            w = np.ones(lb.shape)
            for (_, t), c in zip(weights, corner):
                w = w * (t if c else 1 - t)
            value = value + w * self.log_rate[idx]
        below = sum(np.minimum(x - axis[0], 0.0) for axis, x in zip(self.axes[1:], (lm, ln, lk)))
        return np.exp(value) * np.exp2(below)  # below the grid: the smallest shape's time


@cache
def _grid(points_key: bytes, shape: tuple[int, int]) -> GemmGrid:
    return GemmGrid.of(np.frombuffer(points_key).reshape(shape))


def gemm_grid(profile: DeviceProfile | None, precision: str) -> GemmGrid | None:
    """The profile's measured grid at `precision` ('fp16' runs on the BF16 grid), or None where it has none."""
    if profile is None:
        return None
    points = profile.gemm_grid("bf16" if precision == "fp16" else precision)
    if points is None:
        return None
    points = np.ascontiguousarray(points, dtype=float)
    return _grid(points.tobytes(), points.shape)


def measured_gemm(device: Device, precision: str) -> tuple[GemmGrid, float] | None:
    """The measured grid that prices `device`'s GEMMs at `precision`, and the factor its rates take: the device's own
    profile's (1.0), else the first device of its generation with one, scaled by their data-sheet peaks at that
    precision (the same SM architecture at another SM count, clock and power limit: GB200 from B200, H20 from H100).
    None for a measured device (it has no catalogue generation) or where no device of the generation has a grid."""
    if device.measured or device.name not in GENERATIONS:
        return None
    gen = GENERATIONS[device.name]
    for name in [device.name, *sorted(n for n, g in GENERATIONS.items() if g == gen and n != device.name)]:
        grid = gemm_grid(shipped_profile(name), precision)
        if grid is not None:
            return grid, device.flops(precision) / DEVICES[name].flops(precision)
    return None
