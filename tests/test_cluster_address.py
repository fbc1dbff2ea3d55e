"""A cluster address fails fast and says so: an unreachable `--address` (or `auto` with no cluster) ends within 30 s
with exit status 3 and a message naming the address and what was tried, Ray's own lines held back; `--resume` on a
folder holding no search, or another one, is refused before Ray starts. Real Ray and real sockets throughout."""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.ray_cluster.address import EXIT_UNREACHABLE
from orchestrator.search.store import prepare_store

ROOT = Path(__file__).resolve().parents[1]
SPEC = str(ROOT / "examples" / "gpt3-175b-a100x1024.yaml")
DEADLINE_S = 30
RAY_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d .*\] \w+\.(h|cc|py):\d+", re.M)


@functools.cache
def _pid_namespace() -> list[str]:
    """A prefix that runs a command where it sees no other process (so no other Ray of this machine), if any."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-pf", "--mount-proc", "true"], capture_output=True).returncode == 0:
        return [unshare, "-pf", "--mount-proc"]
    return []


def _plan(tmp_path: Path, *args: str, isolated: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(tmp_path / "ray")  # where a Ray started by the command would leave its session
    prefix = _pid_namespace() if isolated else []
    started = time.monotonic()
    run = subprocess.run([*prefix, sys.executable, "-m", "orchestrator.cli", "plan", SPEC, "--predictor", "analytical",
                          *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return run, time.monotonic() - started


def _assert_clear(run: subprocess.CompletedProcess, code: int, *named: str) -> None:
    assert run.returncode == code, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and not RAY_LINE.search(run.stderr), run.stderr
    assert run.stderr.count("error:") == 1 and all(n in run.stderr for n in named), run.stderr


def test_an_unreachable_address_exits_3_within_30_s(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("", 0))
        port = s.getsockname()[1]
    for address in ("127.0.0.1:1", f"127.0.0.1:{port}"):
        run, seconds = _plan(tmp_path, "--out", str(tmp_path / "out"), "--address", address)
        _assert_clear(run, EXIT_UNREACHABLE, f"--address {address}", "TCP connection", "refused")
        assert seconds < DEADLINE_S
    assert not (tmp_path / "ray").exists()


def test_address_auto_without_a_cluster_exits_3(tmp_path: Path) -> None:
    if not _pid_namespace():
        from ray._private.services import find_gcs_addresses

        if find_gcs_addresses():
            pytest.skip("another Ray runs on this machine and no PID namespace hides it: auto would join it")
    run, seconds = _plan(tmp_path, "--out", str(tmp_path / "out"), "--address", "auto", isolated=True)
    _assert_clear(run, EXIT_UNREACHABLE, "--address auto", "no running Ray cluster", "ray start --head")
    assert seconds < DEADLINE_S


def test_resume_of_an_empty_or_foreign_folder_is_refused_before_ray_starts(tmp_path: Path) -> None:
    """Refused with status 2 before Ray starts: no Ray session is made, and an unreachable address is not even tried."""
    run, _ = _plan(tmp_path, "--out", str(tmp_path / "empty"), "--resume")
    _assert_clear(run, 2, "nothing to resume", str(tmp_path / "empty"))
    foreign = tmp_path / "foreign"
    prepare_store(foreign / "evaluated", "a fingerprint", resume=False, search="another search")
    run, _ = _plan(tmp_path, "--out", str(foreign), "--resume", "--address", "127.0.0.1:1")
    _assert_clear(run, 2, "holds another search")
    assert not (tmp_path / "ray").exists()


@pytest.mark.slow
def test_a_port_that_is_no_ray_cluster_exits_3_within_30_s(tmp_path: Path) -> None:
    """Something listens, but no Ray GCS: Ray's client would retry for minutes; the deadline ends it."""
    with socket.socket() as listener:
        listener.bind(("", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        run, seconds = _plan(tmp_path, "--out", str(tmp_path / "out"), "--address", address)
    _assert_clear(run, EXIT_UNREACHABLE, f"--address {address}", "no Ray GCS answered")
    assert seconds < DEADLINE_S
