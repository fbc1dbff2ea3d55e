"""The host's cost per eager operator read from GPU layer timings (predictor.models.host_cost)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from predictor.data.evaluate import load_profile_dataset, mre, predict_samples
from predictor.models.analytical import AnalyticalPredictor, kernel_model_config
from predictor.models.features import TrainingData
from predictor.models.host_cost import LayerHostAnalytical, layer_host_op_s
from predictor.models.registry import PREDICTORS
from predictor.models.roofline import AnalyticalConfig
from predictor.spec.resolver import resolve

DATA = Path(__file__).resolve().parents[1] / "predictor" / "data"


@pytest.fixture(scope="module")
def h200() -> TrainingData:
    """BERT on the H200 (41 configurations, single GPU, eager transformers modules, their layers timed alone)."""
    return load_profile_dataset(DATA / "h200", families=("bert",))


def test_the_h200_layers_show_a_host_slower_than_first_principles(h200):
    """Timed alone, the small layers of the H200 dataset wait for the host tens of µs an operator, several times
    first principles' 10 µs; without GPU layer timings there is nothing to read."""
    base = kernel_model_config(resolve(h200.samples[0].spec))
    host = layer_host_op_s(h200.layers, base)
    assert host is not None and 3 * AnalyticalConfig.host_op_s < host < 100e-6
    assert layer_host_op_s([], base) is None
    cpu = load_profile_dataset(DATA / "cpu", families=("bert",))
    assert cpu.layers and layer_host_op_s(cpu.layers[:200], base) is None  # a measured CPU's host is its device


def test_the_measured_host_cost_carries_to_held_out_configurations(h200):
    """Read on half the configurations' layers (no iteration time used), the host cost prices the other half's
    iterations closer than the kernel model's constant does."""
    train, test = h200.samples[::2], h200.samples[1::2]
    ids = {s.config_id for s in train}
    data = TrainingData(train, [o for o in h200.layers if any(o.spec is s.spec for s in train)])
    assert data.layers and all(s.config_id in ids for s in data.samples)
    model = PREDICTORS["analytical-layerhost"].make(0).fit(data)
    assert isinstance(model, LayerHostAnalytical) and model.config.host_op_s > AnalyticalConfig.host_op_s
    true = np.asarray([s.iter_time_s for s in test])
    measured, _ = predict_samples(model, test)
    constant, _ = predict_samples(AnalyticalPredictor(), test)
    assert mre(measured, true) < 0.7 * mre(constant, true)
