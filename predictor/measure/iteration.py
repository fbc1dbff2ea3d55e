"""Whole training iterations of a plan, measured for real with torch.distributed on local processes.

`WorkerPool` keeps `world` rank processes (gloo on CPU, NCCL on CUDA, one thread each on CPU)
alive across configurations and hands them jobs (see `dist_worker`). `measure_iteration`
returns an `IterationResult`: the median steady-state step time (max over ranks, after
warm-up) with its spread, and the peak memory of every rank. A crash, an OOM or a hang is a
result with that status; the pool is restarted behind it, so the caller never hangs.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from predictor.measure.collectives import free_port
from predictor.measure.design import ProfileConfig


@dataclass
class IterationResult:
    status: str  # ok | error | timeout | oom
    error: str = ""
    iter_time_s: float = float("nan")
    iter_time_min_s: float = float("nan")
    iter_time_max_s: float = float("nan")
    steps: int = 0
    peak_mem_bytes: list[int] = field(default_factory=list)  # per rank
    base_mem_bytes: list[int] = field(default_factory=list)
    mem_kind: str = ""

    def row(self) -> dict[str, Any]:
        """The whole-iteration columns of a dataset row (see predictor.data.dataset)."""
        peak = max(self.peak_mem_bytes, default=0)
        delta = max((p - b for p, b in zip(self.peak_mem_bytes, self.base_mem_bytes)), default=0)
        return {"status": self.status, "error": self.error, "iter_time_s": self.iter_time_s,
                "iter_time_min_s": self.iter_time_min_s, "iter_time_max_s": self.iter_time_max_s,
                "steps": self.steps, "peak_mem_bytes": peak, "peak_mem_delta_bytes": delta, "mem_kind": self.mem_kind}


class WorkerPool:
    """`world` persistent rank processes; `run(job, ranks, timeout)` answers or says why not."""

    def __init__(self, world: int = 2, threads: int = 1, device: str = "cpu", start_timeout: float = 120.0):
        self.world, self.threads, self.device, self.start_timeout = world, threads, device, start_timeout
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        from predictor.measure.dist_worker import worker_main

        ctx = mp.get_context("spawn")
        port = free_port()
        for rank in range(self.world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(rank, self.world, port, child, self.threads, self.device),
                               daemon=True, name=f"scaledl-rank{rank}")
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        answers = self._collect(range(self.world), self.start_timeout)
        if any(a is None or a.get("status") != "ready" for a in answers):
            self._kill()
            raise RuntimeError(f"measurement workers did not start: {answers}")

    def _collect(self, ranks: Any, timeout: float) -> list[dict | None]:
        """One answer per rank, None for a rank that died or missed the deadline."""
        deadline = time.monotonic() + timeout
        answers: list[dict | None] = []
        for rank in ranks:
            conn, proc = self._conns[rank], self._procs[rank]
            answer = None
            while time.monotonic() < deadline:
                if conn.poll(0.05):
                    try:
                        answer = conn.recv()
                    except (EOFError, OSError):
                        answer = {"status": "error", "error": f"rank {rank} died (exit code {proc.exitcode})"}
                    break
                if not proc.is_alive():
                    code = proc.exitcode
                    status = "oom" if code == -9 else "error"  # SIGKILL: almost always the OOM killer
                    answer = {"status": status, "error": f"rank {rank} died (exit code {code})"}
                    break
            answers.append(answer)
        return answers

    def run(self, job: dict, ranks: int, timeout: float) -> list[dict]:
        """Send `job` to ranks 0..ranks-1 and gather their answers; never blocks past `timeout`."""
        for rank in range(ranks):
            self._conns[rank].send(job)
        answers = self._collect(range(ranks), timeout)
        if any(a is None for a in answers):
            self.restart()
            return [a or {"status": "timeout", "error": f"no answer within {timeout:.0f} s"} for a in answers]
        if any(a["status"] != "ok" for a in answers) and ranks > 1:
            self.restart()  # a rank that failed mid-collective leaves the group unusable
        elif any("died" in a.get("error", "") for a in answers):
            self.restart()
        return answers

    def restart(self) -> None:
        self._kill()
        self.restarts += 1
        self._start()

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def close(self) -> None:
        """Ask every rank to leave (barrier + _exit); kill whatever does not within 20 s."""
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 20
        for proc in self._procs:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
        self._kill()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def summarise(answers: list[dict]) -> IterationResult:
    """Combine the ranks' answers: a step lasts as long as its slowest rank."""
    bad = [a for a in answers if a.get("status") != "ok"]
    if bad:
        worst = next((a for a in bad if a["status"] in ("oom", "timeout")), bad[0])
        return IterationResult(status=worst["status"], error=worst.get("error", ""))
    per_step = [max(ts) for ts in zip(*(a["times"] for a in answers))]
    return IterationResult(
        status="ok", iter_time_s=statistics.median(per_step), iter_time_min_s=min(per_step),
        iter_time_max_s=max(per_step), steps=len(per_step),
        peak_mem_bytes=[a["peak_mem_bytes"] for a in answers], base_mem_bytes=[a["base_mem_bytes"] for a in answers],
        mem_kind=answers[0]["mem_kind"])


def measure_iteration(pool: WorkerPool, cfg: ProfileConfig, steps: int = 3, warmup: int = 1,
                      timeout: float = 300.0, dtype: str = "float32") -> IterationResult:
    """Real training steps of `cfg` on the pool's ranks (as many as the plan has processes)."""
    if cfg.plan.gpus > pool.world:
        return IterationResult(status="error", error=f"plan {cfg.plan} needs {cfg.plan.gpus} processes, pool has {pool.world}")
    job = {"kind": "iteration", "spec_json": cfg.spec_json, "plan": str(cfg.plan), "batch": cfg.batch,
           "steps": steps, "warmup": warmup, "dtype": dtype}
    return summarise(pool.run(job, cfg.plan.gpus, timeout))
