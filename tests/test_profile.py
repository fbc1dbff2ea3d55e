"""`scaledl profile` end to end, for real: a tiny run killed with SIGKILL, then resumed."""

import os
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.cli import main
from predictor.data import dataset
from predictor.data.collect import select

ARGS = ["--families", "vit", "--budget", "4", "--procs", "1", "--flop-cap", "2e8", "--steps", "1", "--warmup", "1"]


def _cli(out, *extra):
    return [sys.executable, "-m", "orchestrator.cli", "profile", *ARGS, "--out", str(out), *extra]


@pytest.mark.slow
def test_kill_9_then_resume_loses_and_duplicates_nothing(tmp_path):
    out = tmp_path / "ds"
    proc = subprocess.Popen(_cli(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not dataset.parts(out, "iterations"):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first = dataset.measured_ids(out)
    assert 1 <= len(first) < 4, "the kill should land after the first configuration and before the last"

    done = subprocess.run(_cli(out, "--resume"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{len(first)} already in" in done.stdout + done.stderr

    rows = dataset.load(out)
    expected = {c.config_id for c, _ in select(["vit"], "doptimal", 4, max_procs=1, flop_cap=2e8)}
    assert set(rows["config_id"]) == expected
    raw = sum(len(__import__("pandas").read_parquet(p)) for p in dataset.parts(out, "iterations"))
    assert raw == 4, "every configuration measured exactly once across the killed and the resumed run"
    assert (rows["status"] == "ok").all() and (rows["iter_time_s"] > 0).all()
    layers = dataset.load(out, "layers")
    assert set(layers["config_id"]) == expected
    assert {"device", "torch_version", "threads", "measured_at"} <= set(rows.columns)


def test_existing_output_needs_resume_and_bad_flags_are_clear(tmp_path, capsys):
    assert main(["profile", "--families", "nope", "--out", str(tmp_path)]) == 2
    assert "--families" in capsys.readouterr().err
    assert main(["profile", "--families", "vit", "--plans", "weird", "--out", str(tmp_path)]) == 2
    assert "--plans" in capsys.readouterr().err
    row = {c: 0 for c in dataset.ITERATION_COLUMNS} | {"config_id": "x", "status": "ok", "plan": "dp=1"}
    dataset.append(tmp_path, "iterations", [row])
    assert main(["profile", *ARGS, "--out", str(tmp_path)]) == 2
    assert "--resume" in capsys.readouterr().err


@pytest.mark.parametrize("flag,value", [("--budget", "0"), ("--steps", "0")])
def test_non_positive_counts_are_rejected(tmp_path, capsys, flag, value):
    assert main(["profile", "--out", str(tmp_path), flag, value]) == 2
    assert flag in capsys.readouterr().err


MOE_SPEC = """model:
  family: mixtral
  hidden: 64
  layers: 6
  heads: 4
  kv_heads: 2
  seq_len: 32
  vocab: 256
  experts: 4
  top_k: 2
  expert_ffn: 96
training:
  global_batch: 2
  precision: fp32
cluster:
  device: cpu
  nodes: 1
  gpus_per_node: 1
"""


def test_a_specs_own_moe_model_is_measured_into_a_dataset_the_learned_predictor_reads(tmp_path):
    from predictor.data.evaluate import load_profile_dataset

    spec = tmp_path / "moe.yaml"
    spec.write_text(MOE_SPEC)
    out = tmp_path / "ds"
    assert main(["profile", "--spec", str(spec), "--out", str(out), "--procs", "1", "--steps", "1", "--warmup", "1",
                 "--layer-repeats", "1"]) == 0
    rows = dataset.load(out, "iterations")
    assert sorted(rows["batch"]) == [1, 2] and set(rows["status"]) == {"ok"} and set(rows["layers"]) == {2}
    assert "experts" in set(dataset.load(out, "layers")["kind"])  # the MoE layer's grouped GEMMs, timed
    data = load_profile_dataset(out, designs=None, families=None)
    assert [s.model for s in data.samples] == ["mixtral", "mixtral"]
    assert any(o.graph.nodes[o.index].kind == "experts" for o in data.layers)
