"""`ray job submit` against a real local head, and the cluster-launcher config checked by Ray itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from predictor.measure.collectives import free_port

ROOT = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).parent / "ray"


def test_ray_cluster_yaml_passes_rays_own_validation() -> None:
    from jsonschema import ValidationError
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())
    validate_config(prepare_config(config))
    assert any(t["node_config"]["InstanceType"].startswith("g") for t in config["available_node_types"].values())
    assert any("pip install" in cmd and "scaledl" in cmd for cmd in config["setup_commands"])
    config["available_node_types"]["gpu_worker"]["min_wrokers"] = 1  # a typo must not pass
    with pytest.raises(ValidationError):
        validate_config(prepare_config(config))


@pytest.mark.slow
def test_ray_job_submit_runs_a_search_on_a_real_head(tmp_path) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # Ray 2.60 token auth: disabled on both sides
    port, dash = free_port(), free_port()
    head = subprocess.Popen(
        [str(RAY), "start", "--head", "--block", f"--port={port}", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dash}", "--disable-usage-stats", "--num-cpus=2", "--include-dashboard=true"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while True:  # the job API is up once the dashboard answers
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{dash}/api/version", timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "the Ray head did not come up"
                time.sleep(1)
        out = tmp_path / "out"
        job_id = f"scaledl-test-{os.getpid()}-{port}"
        submit = subprocess.run(
            [str(RAY), "job", "submit", "--address", f"http://127.0.0.1:{dash}", "--submission-id", job_id,
             "--working-dir", str(ROOT), "--",
             sys.executable, "-m", "orchestrator.job", "--spec", "examples/gpt3-175b-a100x1024.yaml",
             "--out", str(out), "--predictor", "analytical"],
            env=env, capture_output=True, text=True, timeout=600)
        from ray.job_submission import JobStatus, JobSubmissionClient

        assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
        status = JobSubmissionClient(f"http://127.0.0.1:{dash}").get_job_status(job_id)
        assert status == JobStatus.SUCCEEDED, submit.stdout[-3000:] + submit.stderr[-3000:]
        report = json.loads((out / "report.json").read_text())
        assert report["ranked"] and report["search"]["complete"]
        assert (out / "report.html").exists() and (out / "launch" / "torchrun.sh").exists()
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # only the head this test started
        head.wait(timeout=60)
