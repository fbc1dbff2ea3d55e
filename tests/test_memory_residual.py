"""The learned memory residual: an affine base for what the analytical per-rank peak does not count."""

import numpy as np
import pytest

from predictor.models.memory_residual import MemoryResidual


def test_affine_base_recovers_a_runtime_offset_and_extrapolates_it():
    """Peaks that are a fixed runtime plus a scaled model peak: the fit finds both, and a model peak
    ten times the largest seen is predicted as the same line (a ratio learned by trees alone stays flat)."""
    rng = np.random.default_rng(0)
    analytical = rng.uniform(0.01, 0.3, 200)
    measured = 0.45 + 1.1 * analytical
    x = rng.normal(size=(200, 3))
    residual = MemoryResidual(seed=0).fit(x, measured, analytical)
    assert residual.intercept_gib == pytest.approx(0.45, rel=1e-6) and residual.scale == pytest.approx(1.1, rel=1e-6)
    big = np.array([3.0, 0.005])
    predicted = big * residual.ratio(rng.normal(size=(2, 3)), big)
    assert predicted == pytest.approx(0.45 + 1.1 * big, rel=1e-6)


def test_forest_learns_what_the_line_leaves_and_is_seeded():
    rng = np.random.default_rng(1)
    analytical = rng.uniform(0.05, 0.5, 300)
    x = rng.integers(0, 2, size=(300, 1)).astype(float)
    measured = (0.3 + analytical) * np.where(x[:, 0] > 0, 1.2, 1.0)  # a setting that costs 20 % more
    one, two = (MemoryResidual(seed=3).fit(x, measured, analytical) for _ in range(2))
    err = np.abs(analytical * one.ratio(x, analytical) / measured - 1)
    assert err.mean() < 0.02
    assert np.array_equal(one.ratio(x, analytical), two.ratio(x, analytical))


def test_a_ratio_forest_from_an_older_checkpoint_predicts_as_it_did():
    from sklearn.ensemble import RandomForestRegressor

    rng = np.random.default_rng(2)
    x, log_ratio = rng.normal(size=(50, 2)), rng.normal(size=50)
    forest = RandomForestRegressor(n_estimators=5, random_state=0).fit(x, log_ratio)
    analytical = rng.uniform(0.1, 1.0, 50)
    assert np.allclose(MemoryResidual.of_ratio_forest(forest).ratio(x, analytical), np.exp(forest.predict(x)))


def test_what_the_residual_adds_is_runtime_memory_on_every_rank():
    from predictor.costs.prediction import MEMORY_PARTS
    from predictor.models.composition import corrected_memory

    parts = {"weights": 0.2, "gradients": 0.2, "optimizer": 0.4, "activations": 0.1, "buffers": 0.1, "runtime": 0.0}
    peak, parts_in = np.array([1.0, 1.0]), np.array([list(parts.values())] * 2)
    stages, corrected = corrected_memory(peak, np.array([1.0, 0.6, 1.0, 0.6]), np.array([0, 2, 4]), parts_in,
                                         np.array([1.5, 0.5]))
    grown, shrunk = dict(zip(MEMORY_PARTS, corrected[0])), dict(zip(MEMORY_PARTS, corrected[1]))
    # +0.5 GiB the model does not count
    assert stages[:2] == pytest.approx([1.5, 1.1]) and grown["runtime"] == pytest.approx(0.5)
    assert {k: grown[k] for k in MEMORY_PARTS if k != "runtime"} == {k: v for k, v in parts.items() if k != "runtime"}
    assert sum(grown.values()) == pytest.approx(1.5)
    # the model over-counts: every part scales down
    assert stages[2:] == pytest.approx([0.5, 0.3]) and sum(shrunk.values()) == pytest.approx(0.5)
