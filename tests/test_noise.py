"""Measurement noise of a profile dataset: the MRE floor a predictor cannot beat on single measurements."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from predictor.data import dataset
from predictor.data.noise import mre_floor, noise_floor, remeasured


def test_floor_estimates_what_a_perfect_predictor_scores():
    """Against one draw of a configuration whose times scatter by 5 % around their mean, a predictor of the
    mean scores about E|e| = 5 % * sqrt(2/pi); the estimate from three draws per configuration agrees."""
    rng = np.random.default_rng(0)
    draws = 1.0 + 0.05 * rng.standard_normal((4000, 3))
    estimate = np.mean([mre_floor(list(d)) for d in draws])
    assert estimate == pytest.approx(0.05 * np.sqrt(2 / np.pi), rel=0.05)
    assert mre_floor([1.0, 1.0, 1.0]) == 0.0


def _row(cid: str, t: float, at: str) -> dict:
    return {"config_id": cid, "family": "bert", "spec_json": "{}", "batch": 2, "plan": "dp=1,tp=1,pp=1,mbs=2",
            "dp": 1, "tp": 1, "pp": 1, "mbs": 2, "zero": 0, "schedule": "1f1b", "layers": 2, "hidden": 64, "heads": 2,
            "tokens": 32, "design": "doptimal", "status": "ok", "error": "", "iter_time_s": t, "iter_time_min_s": t,
            "iter_time_max_s": t, "steps": 3, "peak_mem_bytes": 1, "peak_mem_delta_bytes": 1, "mem_kind": "rss",
            "device": "cpu:x:2c", "torch_version": "2.13.0+cpu", "threads": 1, "measured_at": at, "measure_s": 1.0}


def test_a_sessions_drift_is_taken_out_of_the_steady_floor(tmp_path):
    """Re-measured a day later on a machine 10 % faster, with no other noise: the floor as measured shows the
    drift, the steady floor none."""
    dataset.append(tmp_path, "iterations", [_row(c, t, "2026-11-30T03:00:00") for c, t in (("a", 0.1), ("b", 0.3))])
    assert noise_floor(tmp_path) is None
    dataset.append(tmp_path, "noise", [_row(c, 0.9 * t, f"2026-12-01T10:00:0{i}") for c, t in (("a", 0.1), ("b", 0.3))
                                       for i in range(2)])
    table, drift = remeasured(tmp_path)
    assert list(table["runs"]) == [3, 3] and drift.to_dict() == {"2026-12-01T10": pytest.approx(0.9)}
    floor = noise_floor(tmp_path)
    assert floor.configs == 2 and floor.floor_pct > 5 and floor.steady_pct == pytest.approx(0.0, abs=1e-9)


def test_the_shipped_cpu_dataset_has_a_floor():
    floor = noise_floor(Path(__file__).resolve().parents[1] / "predictor" / "data" / "cpu")
    assert floor is not None and floor.configs >= 20 and 3 < floor.steady_pct < 10
    assert floor.steady_interval[0] <= floor.steady_pct <= floor.steady_interval[1]


def test_evaluate_command_prints_the_floor_beside_the_tables(capsys):
    from orchestrator.cli import main

    assert main(["evaluate", "--methods", "analytical", "--protocols", "id", "--families", "bert"]) == 0
    out = capsys.readouterr().out
    assert "measurement noise: a predictor that knew each configuration's true mean time would score" in out
    assert "re-measured configurations" in out
    assert "In-domain" in out
