"""The worker side of real measurements: one process per rank, kept alive across configurations.

Starting a process, importing torch and transformers and forming a gloo group costs seconds,
more than measuring one small configuration, so `predictor.measure.iteration.WorkerPool`
starts the ranks once and sends them jobs over pipes. Each job builds the real model, applies
the plan (`predictor.measure.parallelize`), runs warm-up and measured training steps and sends
back per-step times and the peak memory of that job. Single-process jobs go to rank 0 alone
(the other rank stays idle, so its core is free). Workers leave with `dist.barrier();
os._exit(0)`: gloo can abort in its destructors otherwise (see ARCHITECTURE.md).
"""

from __future__ import annotations

import ctypes
import gc
import os
import statistics
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from predictor.plan import Plan
from predictor.workload import ModelSpec

_MESH: Any = None


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


def _mesh(world: int, device: torch.device) -> Any:
    global _MESH
    if _MESH is None:
        from torch.distributed.device_mesh import init_device_mesh

        _MESH = init_device_mesh(device.type, (world,))
    return _MESH


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_iteration(job: dict, rank: int, world: int, device: torch.device) -> dict:
    """Real training steps of one configuration on this rank: per-step seconds and peak memory."""
    from predictor.measure.parallelize import apply_ddp, apply_fsdp, apply_full_recompute, apply_tp, pipeline_stage
    from predictor.modelzoo import build_model, example_inputs, primary_input, training_loss

    spec = ModelSpec.model_validate_json(job["spec_json"])
    plan = Plan.parse(job["plan"])
    batch, dtype = int(job["batch"]), getattr(torch, job.get("dtype", "float32"))
    distributed = plan.gpus > 1
    if plan.gpus > world:
        raise ValueError(f"plan {plan} needs {plan.gpus} processes, the pool has {world}")
    base = reset_peak_memory(device)
    torch.manual_seed(1000 + rank)
    model = build_model(spec, device, dtype)
    model.train()
    if plan.recompute == "full":
        apply_full_recompute(model)
    elif plan.recompute != "none":
        raise ValueError(f"recompute={plan.recompute}: only full recomputation is implemented in measured runs")
    torch.manual_seed(0)  # same data on every rank: tensor parallel ranks must see identical inputs

    if plan.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        stage_mod, loss_fn = pipeline_stage(model, spec, rank, plan.mbs)
        del model
        stage_mod.to(device)
        stage = PipelineStage(stage_mod, rank, plan.pp, device)
        sched_cls = ScheduleGPipe if plan.schedule == "gpipe" else Schedule1F1B
        schedule = sched_cls(stage, n_microbatches=batch // plan.mbs, loss_fn=loss_fn)
        inputs = example_inputs(spec, batch, device, dtype)
        first = primary_input(inputs)
        params = list(stage_mod.parameters())

        def forward_backward() -> None:
            if rank == 0:
                schedule.step(first)
            else:
                schedule.step(target=inputs["labels"], losses=[])
    else:
        per_rank = batch // plan.dp
        if plan.tp > 1:
            model = apply_tp(model, _mesh(world, device))
        elif plan.dp > 1 and plan.zero >= 2:
            model = apply_fsdp(model, _mesh(world, device), reshard_after_forward=plan.zero == 3)
        elif plan.dp > 1:
            model = apply_ddp(model)  # zero=1 shards the optimizer below
        micro = [example_inputs(spec, plan.mbs, device, dtype) for _ in range(max(1, per_rank // plan.mbs))]
        params = list(model.parameters())

        def forward_backward() -> None:
            for inputs in micro:
                training_loss(model, inputs, spec).backward()

    if plan.dp > 1 and plan.zero == 1:  # ZeRO-1: each rank keeps and updates the Adam states of its shard
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr=1e-4, foreach=False)
    else:
        optimizer = torch.optim.Adam(params, lr=1e-4, foreach=False)
    times = []
    for step in range(int(job["warmup"]) + int(job["steps"])):
        if distributed:
            dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        forward_backward()
        optimizer.step()
        _sync(device)
        if step >= int(job["warmup"]):
            times.append(time.perf_counter() - t0)
    peak = peak_memory(device)
    if distributed:
        dist.barrier()
    return {"status": "ok", "times": times, "peak_mem_bytes": peak, "base_mem_bytes": base,
            "mem_kind": "cuda" if device.type == "cuda" else "rss", "median": statistics.median(times)}


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
    import predictor.modelzoo  # noqa: F401  (import cost paid once, not by the first job's timing/memory)
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
