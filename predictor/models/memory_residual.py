"""The learned correction of the analytical peak memory, where peaks were measured.

Measured peaks carry what no per-rank model counts: the process's runtime (the framework's own
resident memory on CPU, the CUDA context and allocator reserve on a GPU) and a scale the model
misses (allocator rounding, temporaries). So the base is affine in the analytical peak,
c + b·analytical, fitted on relative residuals; a random forest then learns what is left,
log(measured / base), from the plan's settings. An affine base extrapolates to peaks outside the
training range where a ratio learned by a forest stays flat: in leave-one-architecture-out
cross-validation inside the CPU dataset's out-of-domain training sets the memory error fell by
0.6-1.3 points against the forest on log(measured / analytical) alone (bench/results/memory_cv.txt).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

_MIN_BASE_GIB = 1e-3  # the affine base never goes below this, whatever the fit
MIN_ROWS = 10  # measured peaks needed before a residual is learned


def residual_forest(seed: int):
    """The forest that learns what the base leaves, log(measured / base), from the plan's settings."""
    from sklearn.ensemble import RandomForestRegressor

    return RandomForestRegressor(n_estimators=40, max_leaf_nodes=64, random_state=seed, n_jobs=1)


class MemoryResidual:
    """Peak memory = (c + b·analytical) · exp(forest(x)), learned from measured peaks (GiB)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.intercept_gib = 0.0
        self.scale = 1.0
        self.forest = None

    @classmethod
    def of_ratio_forest(cls, forest) -> "MemoryResidual":
        """A residual with a unit base: `forest` alone, on log(measured / analytical) (what checkpoints before
        format 5 learned; bench/memory_cv.py compares it)."""
        residual = cls()
        residual.forest = forest
        return residual

    def fit(self, x: np.ndarray, measured_gib: np.ndarray, analytical_gib: np.ndarray) -> "MemoryResidual":
        design = np.column_stack([np.ones_like(analytical_gib), analytical_gib]) / measured_gib[:, None]
        (c, b), *_ = np.linalg.lstsq(design, np.ones_like(measured_gib), rcond=None)
        if b <= 0:  # peaks that do not grow with the model's: keep the analytical scale, fit the offset alone
            b, c = 1.0, float(np.median(measured_gib - analytical_gib))
        self.intercept_gib, self.scale = float(c), float(b)
        target = np.log(measured_gib / self._base(analytical_gib))
        self.forest = residual_forest(self.seed).fit(x, target)
        return self

    def _base(self, analytical_gib: np.ndarray) -> np.ndarray:
        return np.maximum(self.intercept_gib + self.scale * np.asarray(analytical_gib, dtype=float), _MIN_BASE_GIB)

    def ratio(self, x: np.ndarray, analytical_gib: np.ndarray) -> np.ndarray:
        """Predicted peak over the analytical peak, per row."""
        analytical_gib = np.asarray(analytical_gib, dtype=float)
        learned = self._base(analytical_gib) * np.exp(self.forest.predict(x))
        return learned / np.maximum(analytical_gib, 1e-12)


def memory_features(z: np.ndarray, analytical_gib: Sequence[float]) -> np.ndarray:
    """The residual's features per plan (rows): Z and the log analytical peak (a process's fixed overhead
    matters more for small peaks)."""
    peaks = np.asarray(analytical_gib, dtype=float)
    return np.column_stack([z, np.log(np.maximum(peaks, 1e-6))])


def fit_memory_residual(rows: Sequence[tuple[np.ndarray, float, float]], seed: int) -> MemoryResidual | None:
    """The residual of (features, measured GiB, analytical GiB) rows; None below MIN_ROWS measured peaks."""
    if len(rows) < MIN_ROWS:
        return None
    x, measured, analytical = (np.asarray([r[i] for r in rows]) for i in range(3))
    return MemoryResidual(seed).fit(x, measured, analytical)
