"""Fitting a GPU framework's fixed costs (host per operator, per collective call) to measured iterations."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from predictor.data.evaluate import mre, predict_samples
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.calibration import fit_fixed_costs, log_error
from predictor.models.features import Sample, TrainingData
from predictor.models.roofline import AnalyticalConfig, device_config
from predictor.models.scaledl import ScaleDLPredictor
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec
from tests.vtrain_rows import a100_rows

CPU_PROFILE = Path(__file__).resolve().parents[1] / "predictor" / "data" / "cpu" / "device.json"
H200 = Path(__file__).resolve().parents[1] / "predictor" / "data" / "h200"


@pytest.fixture(scope="module")
def rows() -> tuple[list[Sample], list[Sample]]:
    """Real A100 rows (vTrain single-node, hidden 1024): 12 layers to fit, 24 layers held out."""
    rows = a100_rows()
    return [s for s in rows if s.spec.model.layers == 12], [s for s in rows if s.spec.model.layers == 24]


def test_fit_recovers_the_costs_that_priced_the_iterations(rows):
    """Iterations priced by the analytical model with known costs: the fit finds those costs again."""
    train, _ = rows
    truth = AnalyticalConfig(host_op_s=35e-6, call_s=120e-6)
    picked = train[::4]
    priced, _ = predict_samples(AnalyticalPredictor(truth), picked)
    samples = [replace(s, iter_time_s=float(t)) for s, t in zip(picked, priced)]
    fitted = fit_fixed_costs(samples)
    assert fitted.host_op_s == pytest.approx(truth.host_op_s, rel=0.05)
    assert fitted.call_s == pytest.approx(truth.call_s, rel=0.15)
    assert log_error(fitted, samples) < 1e-3 < log_error(AnalyticalConfig(), samples)


def test_calibrated_scaledl_carries_to_deeper_models_and_keeps_its_costs(rows, tmp_path):
    """On real rows the fitted costs are a host-bound framework's (tens of µs an operator), the held-out
    error falls well below the first-principles model's, and a checkpoint keeps the fitted base."""
    train, test = rows
    model = ScaleDLPredictor(use_gnn=False, use_global=False, calibrate=True).fit(TrainingData(train))
    costs = model.fixed_costs_s
    assert 10e-6 < costs["host_op_s"] < 200e-6 and costs["call_s"] < 1e-3
    true = np.asarray([s.iter_time_s for s in test])
    calibrated, _ = predict_samples(model, test)
    # First principles: the A100 generation's, not DeepSpeed's constants recorded on this file's rows.
    analytical, _ = predict_samples(AnalyticalPredictor(device_config("ampere")), test)
    assert mre(calibrated, true) < 0.5 * mre(analytical, true)
    path = tmp_path / "calibrated.pt"
    model.save(path)
    loaded = ScaleDLPredictor.load(path)
    assert loaded.analytical.config == model.analytical.config
    np.testing.assert_array_equal(predict_samples(loaded, test)[0], calibrated)


def test_measured_devices_and_empty_data_are_refused(rows):
    spec = parse_spec({"model": {"family": "gpt", "hidden": 64, "layers": 2, "heads": 2, "seq_len": 32, "vocab": 128},
                       "training": {"global_batch": 4},
                       "cluster": {"device": "cpu", "gpus_per_node": 2, "device_profile": str(CPU_PROFILE)}})
    cpu = replace(rows[0][0], spec=spec)
    with pytest.raises(ValueError, match="cpu is a measured device"):
        fit_fixed_costs([cpu])
    with pytest.raises(ValueError, match="needs measured iterations"):
        fit_fixed_costs([])


def test_single_gpu_data_leaves_the_call_cost_alone():
    """Without a collective or send/recv in any plan the call cost is not identifiable: it keeps its value.
    The H200 profile dataset is single-GPU; its host cost comes out near vTrain's Megatron-DeepSpeed one."""
    from predictor.data.evaluate import load_profile_dataset

    samples = load_profile_dataset(H200, families=("gpt2",)).samples[::2]
    assert samples and all(s.plan.gpus == 1 for s in samples)
    fitted = fit_fixed_costs(samples, AnalyticalConfig(call_s=7e-6))
    assert fitted.call_s == 7e-6 and 10e-6 < fitted.host_op_s < 200e-6


def test_calibrated_analytical_fits_the_fixed_costs_over_the_kernel_model(rows):
    """`analytical-calibrated` (scaledl evaluate's variant) is the analytical model with the host and call costs
    fitted on its training rows over the constants it prices them with (DeepSpeed's on Ampere here)."""
    from predictor.models.analytical import kernel_model_config
    from predictor.models.calibration import CalibratedAnalytical
    from predictor.models.registry import PREDICTORS

    train, test = rows
    model = PREDICTORS["analytical-calibrated"].make(0).fit(TrainingData(train))
    assert isinstance(model, CalibratedAnalytical)
    assert model.config == fit_fixed_costs(train, kernel_model_config(resolve(train[0].spec)))
    assert model.config.gemm_eff_max == kernel_model_config(resolve(train[0].spec)).gemm_eff_max
    true = np.asarray([s.iter_time_s for s in test])
    fitted, _ = predict_samples(model, test)
    first_principles, _ = predict_samples(AnalyticalPredictor(device_config("ampere")), test)
    assert mre(fitted, true) < mre(first_principles, true)
