"""The worker side of real measurements: one process per rank, kept alive across configurations.

Starting a process, importing torch and transformers and forming a gloo group costs seconds,
more than measuring one small configuration, so `predictor.measure.iteration.WorkerPool`
starts the ranks once and sends them jobs over pipes. Each job builds the real model, applies
the plan (`predictor.measure.compose`), runs warm-up and measured training steps and sends
back per-step times and the peak memory of that job. Single-process jobs go to rank 0 alone
(the other rank stays idle, so its core is free). Workers leave with `dist.barrier();
os._exit(0)`: gloo can abort in its destructors otherwise (see ARCHITECTURE.md).
"""

from __future__ import annotations

import ctypes
import gc
import os
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak_memory(device: torch.device) -> int:
    """Start a fresh peak for this job; returns the memory in use now (bytes).

    CPU: writing 5 to /proc/self/clear_refs resets the kernel's resident-set high-water mark
    (VmHWM), so each job gets its own peak even though the process lives on.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back, or RSS never drops below old peaks
    except OSError:
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status_kib("VmRSS") * 1024


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return _status_kib("VmHWM") * 1024


def run_iteration(job: dict, rank: int, world: int, device: torch.device) -> dict:
    """Real training steps of one configuration on this rank (`predictor.measure.compose.run_plan`)."""
    from predictor.measure.compose import run_plan

    return run_plan(job, rank, world, device, reset_peak_memory, peak_memory)


def run_job(job: dict, rank: int, world: int, device: torch.device) -> dict:
    if job["kind"] == "iteration":
        return run_iteration(job, rank, world, device)
    if job["kind"] == "layers":
        from predictor.measure.layers import time_layers_job

        return time_layers_job(job, device)
    raise ValueError(f"unknown job kind {job['kind']!r}")


def _classify(err: BaseException) -> str:
    text = str(err).lower()
    return "oom" if isinstance(err, MemoryError) or "out of memory" in text else "error"


def worker_main(rank: int, world: int, port: int, conn: Any, threads: int, device_name: str) -> None:
    """Rank `rank`'s loop: answer jobs from `conn` until it sends None, then leave cleanly."""
    torch.set_num_threads(threads)
    device = torch.device(device_name if device_name != "cuda" else f"cuda:{rank}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=120), device_id=device if device.type == "cuda" else None)
    import predictor.graph.modelzoo  # noqa: F401  (import cost paid once, not by the first job's timing/memory)
    import transformers  # noqa: F401

    conn.send({"status": "ready", "pid": os.getpid()})
    while True:
        try:
            job = conn.recv()
        except EOFError:
            os._exit(1)  # the pool went away: nobody to report to
        if job is None:
            break
        try:
            result = run_job(job, rank, world, device)
        except BaseException as err:  # a failed job is a result, the worker lives on
            result = {"status": _classify(err), "error": f"{type(err).__name__}: {err}"[:2000],
                      "traceback": traceback.format_exc()[-4000:]}
        if device.type == "cuda":
            torch.cuda.empty_cache()
        conn.send(result)
    try:
        dist.barrier()
    finally:
        os._exit(0)
