"""Validation ranks that outnumber the cluster's CPUs share them (as the README promises): each rank asks for an
equal share, the run is placed, and its time is compared with the prediction times ranks per core."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from orchestrator.validation.placement import rank_bundles, shared_cpus, unplaceable
from predictor.plan import Plan


def test_ranks_ask_for_an_equal_share_of_too_few_cpus() -> None:
    one_machine = [{"CPU": 2.0}]
    assert shared_cpus(2, 1.0, one_machine) == 1.0  # room enough: one CPU each
    assert shared_cpus(8, 1.0, one_machine) == 0.25
    assert shared_cpus(3, 1.0, one_machine) == 0.6666  # Ray's resource unit is 1/10,000
    share = shared_cpus(8, 1.0, one_machine)
    assert unplaceable(rank_bundles(Plan(dp=8), share), one_machine) == ""
    assert "the plan needs 8 ranks" in unplaceable(rank_bundles(Plan(dp=8)), one_machine)
    two_nodes = [{"CPU": 2.0}, {"CPU": 2.0}]
    assert unplaceable(rank_bundles(Plan(dp=2, tp=3), shared_cpus(6, 1.0, two_nodes)), two_nodes) == ""
    assert shared_cpus(4, 2.0, [{"CPU": 16.0}]) == 2.0  # what a job asks for stays when it fits


@pytest.mark.slow
def test_plan_validate_runs_more_ranks_than_the_machine_has_cores(scaledl, tmp_path: Path) -> None:
    """`scaledl plan SPEC --validate 1` on its embedded Ray (one CPU per core) with twice as many ranks as cores."""
    ranks = 2 * (os.cpu_count() or 1)
    spec = {"model": {"family": "gpt2", "hidden": 64, "layers": 2, "heads": 2, "seq_len": 32, "vocab": 256},
            "training": {"global_batch": ranks, "precision": "fp32"},
            "cluster": {"device": "cpu", "nodes": 1, "gpus_per_node": ranks},
            "search": {"tp": [1], "pp": [1], "zero": [0], "recompute": ["none"], "mbs": [1]}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    run = scaledl.run("plan", str(path), "--out", str(out), "--predictor", "analytical", "--validate", "1")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Token authentication" not in run.stdout + run.stderr  # Ray's warning on every run, named away
    (result,) = json.loads((out / "report.json").read_text())["validation"]["plans"]
    assert result["status"] == "ok", result["detail"]
    assert result["core_sharing"] > 1 and "ranks share cores" in result["detail"]
