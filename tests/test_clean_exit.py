"""Killing `scaledl plan`, `scaledl revalidate` or a validation leaves nothing running: real commands, real signals.

Each run has its own RAY_TMPDIR, so "the run's Ray" is every process whose environment names that
directory or that has a file open under it, which also finds the processes the run's tree lost
when their parent died. SIGKILL and SIGTERM go to the command's pid (`kill`, a supervisor), SIGINT
to its process group, as a Ctrl-C in a terminal does.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import psutil
import pytest

from orchestrator.revalidation.history import History
from tests.stored_predictions import store

ROOT = Path(__file__).resolve().parents[1]
SPEC = str(ROOT / "examples" / "bert-cpu2.yaml")
SETTLE_S = 30.0  # what may still run this long after the signal is left behind

Tree = dict[psutil.Process, str]  # a process (pid and start time) -> its command line


def raylet_has_children(tree: Tree) -> bool:
    """Ray is up: the raylet runs the agents and workers that a killed driver used to leave behind."""
    raylets = [p for p, cmd in tree.items() if cmd.split(" ", 1)[0].endswith("/raylet")]
    return any(_children(p) for p in raylets)


def rank_worker_runs(tree: Tree) -> bool:
    """A validation runs: a rank actor exists."""
    return any(cmd.startswith("ray::RankWorker") for cmd in tree.values())


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children()
    except psutil.Error:
        return []


def _title(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def ray_processes(ray_tmp: str) -> list[psutil.Process]:
    """Live processes of the Ray under `ray_tmp`: RAY_TMPDIR in their environment, or a file open under it
    (Ray's agents blank their environment as they rename themselves, but keep their logs open)."""
    found = []
    for p in psutil.process_iter():
        try:
            if _alive(p) and (p.environ().get("RAY_TMPDIR") == ray_tmp
                              or any(f.path.startswith(ray_tmp + "/") for f in p.open_files())):
                found.append(p)
        except psutil.Error:
            continue
    return found


def ray_env(ray_tmp: str) -> dict[str, str]:
    """This environment, for a Ray of its own under `ray_tmp`."""
    # Ray's memory monitor off: on a machine shared with other jobs it may kill a worker of this
    # run first, which is not what these tests look at. Token authentication one way on both sides (Ray 2.60's
    # `ray start` turns it on while a joining driver leaves it off), as tests/test_job.py does.
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "RAY_TMPDIR": ray_tmp, "RAY_memory_monitor_refresh_ms": "0", "RAY_AUTH_MODE": "disabled"}


def ray_tmpdir() -> str:
    return tempfile.mkdtemp(prefix="scaledl-exit-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes


@dataclass
class Run:
    """A command started in its own session, and every descendant it was seen with."""

    proc: subprocess.Popen
    ray_tmp: str
    log: Path
    seen: Tree = field(default_factory=dict)

    def look(self) -> Tree:
        """The command's descendants now (their command lines refreshed: a fork execs after it is first seen)."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return {}
        tree = {p: _title(p) for p in kids}
        self.seen.update(tree)
        return tree

    def wait_until(self, ready: Callable[[Tree], bool], timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready(self.look()):
            assert self.proc.poll() is None, f"exited with {self.proc.returncode} first:\n{self.stderr()}"
            assert time.monotonic() < deadline, "not ready in time"
            time.sleep(0.1)

    def ray_processes(self) -> list[psutil.Process]:
        return ray_processes(self.ray_tmp)

    def left(self) -> list[str]:
        procs = {p for p in self.seen if _alive(p)} | set(self.ray_processes())
        return sorted(f"{p.pid} {_title(p) or self.seen.get(p, '')}"[:100] for p in procs)

    def settle(self) -> tuple[float, list[str]]:
        """Seconds until the command and everything it started are gone (at most SETTLE_S), and what is left."""
        start = time.monotonic()
        while time.monotonic() - start < SETTLE_S:
            if self.proc.poll() is None:
                self.look()
            elif not self.left():
                break
            time.sleep(0.2)
        return time.monotonic() - start, self.left()

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@pytest.fixture
def launch(scaledl, tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """Start `scaledl ARGS...` of this checkout with a Ray of its own (or the one under `ray_tmp`); whatever a
    failing test leaves, the Ray under `ray_tmp` included, is killed after it."""
    runs: list[Run] = []

    def start(*args: str, ray_tmp: str | None = None) -> Run:
        ray_tmp = ray_tmp or ray_tmpdir()
        log = tmp_path / f"stderr-{len(runs)}.txt"
        with open(log, "w") as err:
            proc = scaledl.start(*args, env=ray_env(ray_tmp), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=err, start_new_session=True)
        runs.append(Run(proc, ray_tmp, log))
        return runs[-1]

    yield start
    for run in runs:
        run.proc.kill()
        run.proc.wait(timeout=30)
        kill({p for p in run.seen if _alive(p)} | set(run.ray_processes()))
        shutil.rmtree(run.ray_tmp, ignore_errors=True)


def kill(procs: Iterable[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def send(run: Run, sig: signal.Signals) -> None:
    if sig == signal.SIGINT:
        os.killpg(run.proc.pid, sig)  # Ctrl-C: the whole foreground process group
    else:
        os.kill(run.proc.pid, sig)


def check_exit(run: Run, sig: signal.Signals, tune_may_take_ctrl_c: bool = False) -> None:
    """Nothing left within SETTLE_S, and the exit status and message that the signal calls for."""
    took, left = run.settle()
    assert not left, f"left running {SETTLE_S:.0f} s after {sig.name}: {left}"
    code, err = run.proc.wait(timeout=5), run.stderr()
    print(f"{sig.name}: all gone after {took:.1f} s, status {code}")
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    elif sig == signal.SIGTERM:
        assert code == 143 and err.rstrip().endswith(": terminated"), err
    elif not tune_may_take_ctrl_c or code == 130:
        assert code == 130 and err.rstrip().endswith(": interrupted"), err
    else:  # Ray Tune takes a Ctrl-C during its run as "stop": the command ends with what it has
        assert code in (0, 1), err


SIGNALS = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT]


def _marks(default: signal.Signals) -> list:
    """The default suite kills `scaledl plan` with one signal, the cheapest of these tests of the same reaping;
    -m slow adds the other signals and the validation and revalidation runs."""
    return [pytest.param(s, id=s.name, marks=() if s == default else pytest.mark.slow) for s in SIGNALS]


@pytest.mark.parametrize("sig", _marks(signal.SIGKILL))
def test_plan(launch, tmp_path: Path, sig: signal.Signals) -> None:
    # --replicas: a search this small is otherwise priced without Ray (orchestrator.planning.prices_here)
    run = launch("plan", SPEC, "--out", str(tmp_path / "out"), "--predictor", "analytical", "--replicas", "1")
    run.wait_until(raylet_has_children)
    send(run, sig)
    check_exit(run, sig)


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_validation(launch, tmp_path: Path, sig: signal.Signals) -> None:
    run = launch("plan", SPEC, "--out", str(tmp_path / "out"), "--predictor", "analytical", "--validate", "1")
    run.wait_until(rank_worker_runs)
    send(run, sig)
    check_exit(run, sig, tune_may_take_ctrl_c=True)


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_revalidate(launch, tmp_path: Path, sig: signal.Signals) -> None:
    url = f"sqlite:///{tmp_path}/history.db"
    with History.open(url) as history:
        store(history, "gpt2", 1.0, "analytical")
    run = launch("revalidate", "--history", url, "--every", "1h", "--sample", "1", "--steps", "1", "--warmup", "1")
    run.wait_until(rank_worker_runs)  # a round runs: a Ctrl-C there must end the command, not only the round
    send(run, sig)
    check_exit(run, sig)


@pytest.mark.slow
def test_a_cluster_it_joined_is_left_alone(launch, tmp_path: Path) -> None:
    ray_tmp = ray_tmpdir()
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    try:
        head = subprocess.run([str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={port}",
                               "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
                              env=ray_env(ray_tmp), capture_output=True, text=True, timeout=300)
        assert head.returncode == 0, head.stderr
        # Its processes but the idle workers, which may retire of their own accord.
        cluster = [p for p in ray_processes(ray_tmp) if not _title(p).startswith("ray::IDLE")]
        run = launch("plan", SPEC, "--out", str(tmp_path / "out"), "--predictor", "analytical", "--address", "auto",
                     ray_tmp=ray_tmp)
        deadline = time.monotonic() + 240
        while not (replicas := [p for p in ray_processes(ray_tmp) if _title(p).startswith("ray::PredictorReplica")]):
            assert run.proc.poll() is None and time.monotonic() < deadline, run.stderr()
            time.sleep(0.1)
        send(run, signal.SIGKILL)
        run.proc.wait(timeout=30)
        gone, _ = psutil.wait_procs(replicas, timeout=SETTLE_S)  # the run's actors end with their owner
        assert len(gone) == len(replicas)
        time.sleep(2)  # longer than a reaper takes
        assert cluster and all(_alive(p) for p in cluster), [_title(p) for p in cluster if not _alive(p)]
    finally:  # the cluster, by its processes: `ray stop` would stop every Ray on this machine
        kill(ray_processes(ray_tmp))
        shutil.rmtree(ray_tmp, ignore_errors=True)
