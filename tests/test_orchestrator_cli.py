"""`scaledl plan` as users run it: a real subprocess (this checkout's, conftest's `scaledl`), embedded Ray, report
files, clean errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

SMALL = {"model": {"preset": "gpt3-125m"}, "training": {"global_batch": 32},
         "cluster": {"device": "a100-40gb", "nodes": 1, "gpus_per_node": 8}}


def write_spec(tmp_path: Path, **extra) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**SMALL, **extra}))
    return str(path)


def test_plan_writes_a_ranked_report(scaledl, tmp_path) -> None:
    spec = write_spec(tmp_path, search={"recompute": ["none"], "max_pp": 2})
    run = scaledl.run("plan", spec, "--out", str(tmp_path / "out"), "--top-k", "3", "--predictor", "analytical")
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["search"]["complete"] and report["predictor"]["name"] == "analytical"
    assert all(r["fields"]["recompute"] == "none" and r["fields"]["pp"] <= 2 for r in report["ranked"])
    assert "Top 3 of" in run.stdout and "predicted fastest" in run.stdout
    assert (tmp_path / "out" / "launch" / "megatron_args.txt").exists()


def test_a_small_search_is_priced_without_ray_and_answers_as_the_replicas_do(scaledl, tmp_path) -> None:
    """A search of few candidates runs in the driver (no Ray started: its timings have no Ray start); forced onto
    Ray's replicas (--replicas), the same plans get the same predictions."""
    spec = write_spec(tmp_path, search={"max_pp": 2})
    reports = {}
    for name, extra in (("here", ()), ("ray", ("--replicas", "1"))):
        run = scaledl.run("plan", spec, "--out", str(tmp_path / name), "--predictor", "analytical", *extra)
        assert run.returncode == 0, run.stderr[-3000:]
        reports[name] = json.loads((tmp_path / name / "report.json").read_text())
    here, ray = reports["here"], reports["ray"]
    assert "ray_init_s" not in here["search"]["timings"] and "ray_init_s" in ray["search"]["timings"]
    assert "node_id" not in here["search"]["replicas"][0] and "node_id" in ray["search"]["replicas"][0]
    assert here["ranked"] == ray["ranked"] and here["infeasible"] == ray["infeasible"]
    assert here["search"]["evaluated_plans"] == ray["search"]["evaluated_plans"] > 100


def test_a_search_without_ray_stops_at_its_budget_and_resumes(scaledl, tmp_path) -> None:
    """Priced in the driver, a search is as anytime as on the replicas: a spent budget keeps the batches stored, and
    --resume prices the rest, ranking as one uninterrupted run does."""
    spec, out, whole = write_spec(tmp_path), tmp_path / "out", tmp_path / "whole"
    args = [spec, "--predictor", "analytical", "--space", "full"]
    cut = scaledl.run("plan", *args, "--out", str(out), "--budget-s", "0.0001")
    first = json.loads((out / "report.json").read_text())["search"]
    assert "ray_init_s" not in first["timings"] and first["evaluated_plans"] < first["valid_plans"]
    assert cut.returncode == (0 if first["feasible_plans"] else 1), cut.stderr[-3000:]  # 1: no plan known to fit yet
    for run in (scaledl.run("plan", *args, "--out", str(out), "--resume"), scaledl.run("plan", *args, "--out", str(whole))):
        assert run.returncode == 0, run.stderr[-3000:]
    resumed, uncut = (json.loads((d / "report.json").read_text()) for d in (out, whole))
    assert resumed["search"]["resumed"] and resumed["search"]["complete"]
    assert resumed["ranked"] == uncut["ranked"] and resumed["search"]["evaluated_plans"] == first["valid_plans"]


def test_unknown_space_is_a_clean_error(scaledl, tmp_path) -> None:
    run = scaledl.run("plan", write_spec(tmp_path), "--out", str(tmp_path / "o"), "--space", "nope")
    assert run.returncode == 2 and "known spaces" in run.stderr and "Traceback" not in run.stderr


def test_bad_search_section_names_the_field(scaledl, tmp_path) -> None:
    # Megatron-Core's own space (the default) has no GPipe schedule: a spec may not widen it.
    run = scaledl.run("plan", write_spec(tmp_path, search={"schedule": ["gpipe"]}), "--out", str(tmp_path / "o"))
    assert run.returncode == 2 and "search.schedule" in run.stderr and "Traceback" not in run.stderr


def test_empty_space_says_why(scaledl, tmp_path) -> None:
    spec = write_spec(tmp_path, training={"global_batch": 12})  # dp=8 cannot split 12 samples
    run = scaledl.run("plan", spec, "--out", str(tmp_path / "o"), "--space", "zero-dp")
    assert run.returncode == 2 and "no valid plan" in run.stderr and "does not divide global_batch=12" in run.stderr


@pytest.mark.slow
def test_ctrl_c_then_resume_from_the_command_line(scaledl, tmp_path) -> None:
    spec, out = write_spec(tmp_path), tmp_path / "out"
    # Random search over 30 groups of the full space: one small trial each, so Ctrl-C lands mid-search.
    args = ["plan", spec, "--out", str(out), "--predictor", "analytical", "--space", "full",
            "--searcher", "random", "--max-trials", "30"]
    proc = scaledl.start(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not list((out / "evaluated").glob("*.pkl")):  # interrupt once the first batch is stored
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=300)
    assert proc.returncode == 0, proc.stderr.read()[-3000:]  # Ctrl-C ends the search, not the command
    first = json.loads((out / "report.json").read_text())
    assert first["ranked"] and first["search"]["trials"] < 30
    run = scaledl.run(*args, "--resume")
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    # the resumed run evaluates only the groups the first one had not stored
    assert report["search"]["resumed"] and report["search"]["trials"] + report["search"]["batches_reused"] == 30
    assert first["search"]["evaluated_plans"] < report["search"]["evaluated_plans"]


def test_a_missing_predictor_file_fails_before_ray_starts(scaledl, tmp_path) -> None:
    run = scaledl.run("plan", write_spec(tmp_path), "--out", str(tmp_path / "out"),
                      "--predictor", str(tmp_path / "nope.pt"))
    assert run.returncode == 2
    assert "nope.pt' is neither 'analytical', 'auto' nor an existing checkpoint file" in run.stderr
    assert not (tmp_path / "out").exists()


def test_a_predictor_that_does_not_load_is_a_clear_error(scaledl, tmp_path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_text("not a checkpoint")
    run = scaledl.run("plan", write_spec(tmp_path), "--out", str(tmp_path / "out"), "--predictor", str(bad))
    assert run.returncode == 2, run.stderr[-2000:]
    assert "could not be loaded in a replica" in run.stderr and "Traceback" not in run.stderr.splitlines()[-1]


USER_MODEL = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


def build(d=64, n=4):
    return nn.Sequential(nn.Linear(d, d), *(Block(d) for _ in range(n)), nn.Linear(d, 10))
"""
CUSTOM = {"model": {"module": "user_model:build", "kwargs": {"d": 64, "n": 4}, "inputs": [{"shape": [128, 64]}]},
          "training": {"global_batch": 32, "framework": "pytorch"},
          "cluster": {"device": "a100-40gb", "nodes": 1, "gpus_per_node": 8}}


def test_a_custom_module_is_predicted_and_searched_end_to_end(scaledl, tmp_path) -> None:
    """A user's `module:` model on their PYTHONPATH: predict gives figures for a plan it can run and names why
    tp cannot split it; plan searches only what the model allows and writes its report."""
    (tmp_path / "user_model.py").write_text(USER_MODEL)
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(CUSTOM))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return scaledl.run(*args, env=env)

    untrusted = run("predict", str(path), "--plan", "dp=8,mbs=2", "--predictor", "analytical")
    assert untrusted.returncode == 2 and "--trust-module" in untrusted.stderr and "Traceback" not in untrusted.stderr
    ok = run("predict", str(path), "--plan", "dp=8,mbs=2", "--predictor", "analytical", "--json", "--trust-module")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["iter_time_s"] > 0
    refused = run("predict", str(path), "--plan", "dp=4,tp=2", "--predictor", "analytical", "--trust-module")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "tp=2 splits attention heads" in refused.stderr and "model.heads" in refused.stderr
    searched = run("plan", str(path), "--out", str(tmp_path / "out"), "--predictor", "analytical", "--space", "full",
                   "--trust-module")
    assert searched.returncode == 0, searched.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["ranked"] and all(r["fields"]["tp"] == 1 and r["fields"]["pp"] == 1 for r in report["ranked"])


def test_plan_searches_several_cluster_sizes_in_one_run(scaledl, tmp_path) -> None:
    """--nodes: one search over every size's plans, ranked by cost, with the time-cost front and bad input refused."""
    spec = write_spec(tmp_path, search={"recompute": ["none"], "max_pp": 2})
    out = tmp_path / "out"
    run = scaledl.run("plan", spec, "--out", str(out), "--nodes", "1-2", "--predictor", "analytical",
                      "--rank-by", "cost", "--train-tokens", "1e9", "--price-per-gpu-hour", "2", "--budget-usd", "1e9")
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert [z["nodes"] for z in report["sizes"]] == [1, 2] and report["search"]["complete"]
    assert {r["nodes"] for r in report["ranked"]} == {1, 2} and report["pareto"]
    assert report["ranked"][0]["cost_usd_to_train"] == min(r["cost_usd_to_train"] for r in report["ranked"])
    assert "Pareto front" in (out / "report.md").read_text()
    bad = scaledl.run("plan", spec, "--out", str(out), "--budget-usd", "5")
    assert bad.returncode == 2 and "--train-tokens" in bad.stderr and "Traceback" not in bad.stderr
