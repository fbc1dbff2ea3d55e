"""One validation on the connected Ray cluster: start the rank actors, rendezvous, train, gather or fail.

Failures are results, never exceptions: a rank over its memory limit ends the run as `oom` with the
memory reached, a crash as `error` with the log tail, a hang as `timeout` (the actors are killed).
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.validation.jobs import GIB, ValidationJob, ValidationResult
from orchestrator.validation.measurable import plan_problem
from orchestrator.validation.worker import RankWorker
from predictor.measure.design import ProfileConfig
from predictor.measure.iteration import summarise
from predictor.plan import Plan
from predictor.spec.workload import WorkloadSpec, parse_spec


def run_job(job: ValidationJob, pg: PlacementGroup | None = None) -> ValidationResult:
    """Run one validation on the connected Ray cluster; every failure comes back as a result."""
    t0 = time.perf_counter()
    result = ValidationResult(job.plan, "error", predicted_time_s=job.predicted_time_s,
                              predicted_memory_gib=job.predicted_memory_gib, started_at=time.time())
    problem = plan_problem(job)
    if problem:
        result.detail = problem
        return result
    plan, spec = Plan.parse(job.plan), parse_spec(job.spec)
    workers: list[Any] = []
    try:
        limit = int(job.memory_limit_gib * GIB) if job.memory_limit_gib else None
        options: dict[str, Any] = {"num_cpus": job.cpus_per_rank, "num_gpus": 1 if on_gpu(job) else 0}
        for rank in range(plan.gpus):
            if pg is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank)
            workers.append(RankWorker.options(**options).remote(limit))
        places = ray.get([w.where.remote() for w in workers], timeout=job.timeout_s)
        result.nodes = [node for node, *_ in places]
        _, master_addr, master_port, _, _ = places[0]
        payload = _payload(job, spec)
        threads = max(1, int(job.cpus_per_rank))
        if not on_gpu(job):
            result.core_sharing, note = core_sharing([(host, cores) for *_, host, cores in places], threads)
            result.detail = note
        runs = [w.run.remote(payload, rank, plan.gpus, master_addr, master_port, threads)
                for rank, w in enumerate(workers)]
        _wait(job, workers, runs, result)
    except (ray.exceptions.RayError, OSError) as err:  # a worker that never started or answered
        result.status, result.detail = "error", tail(f"{type(err).__name__}: {err}")
    finally:
        for w in workers:
            ray.kill(w)
        result.wall_s = time.perf_counter() - t0
    return result


def core_sharing(hosts: list[tuple[str, int]], threads: int) -> tuple[float, str]:
    """(CPU ranks' threads per core on the busiest machine, a note when ranks share cores) from each rank's
    (host name, usable cores)."""
    load: dict[str, list[int]] = {}
    for host, cores in hosts:
        load.setdefault(host, [0, cores])[0] += threads
    host, (used, cores) = max(load.items(), key=lambda kv: kv[1][0] / kv[1][1])
    factor = used / cores
    if factor <= 1:
        return 1.0, ""
    return factor, (f"ranks share cores: {used} rank threads on {cores} cores of {host} ({factor:.3g}x); the "
                    f"measurement is compared with the prediction x {factor:.3g} (each rank gets 1/{factor:.3g} of a core)")


_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _payload(job: ValidationJob, spec: WorkloadSpec) -> dict[str, Any]:
    """The measurement code's job dict (see predictor.measure.dist_worker.run_iteration)."""
    gpu = on_gpu(job)
    return {"kind": "iteration", "spec_json": profile_config(job, spec).spec_json, "plan": job.plan,
            "batch": spec.training.global_batch, "dtype": _DTYPES[spec.training.precision] if gpu else "float32",
            "warmup": job.warmup, "steps": job.steps, "device": "cuda" if gpu else "cpu",
            "optimizer": spec.training.optimizer, "timeout_s": job.timeout_s}


def profile_config(job: ValidationJob, spec: WorkloadSpec) -> ProfileConfig:
    return ProfileConfig(spec.model, spec.training.global_batch, Plan.parse(job.plan))


def on_gpu(job: ValidationJob) -> bool:
    return str(job.spec.get("cluster", {}).get("device", "cpu")) != "cpu"


def _wait(job: ValidationJob, workers: list[Any], runs: list[Any], result: ValidationResult) -> None:
    """Wait for every rank, polling memory; the first failure, a rank over its limit or the deadline ends the run."""
    deadline = time.monotonic() + job.timeout_s
    peaks = [0] * len(workers)
    pending = list(runs)
    outputs: dict[int, dict[str, Any]] = {}
    while pending:
        over = _poll(workers, peaks)
        if over is not None:
            result.status, result.peak_memory_gib = "oom", [p / GIB for p in peaks]
            result.detail = _oom_note(job, *over)
            return
        if time.monotonic() > deadline:
            result.status, result.peak_memory_gib = "timeout", [p / GIB for p in peaks]
            result.detail = f"killed after {job.timeout_s:g} s; ranks still running: {[runs.index(r) for r in pending]}"
            return
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.25)
        for ref in done:
            rank = runs.index(ref)
            try:
                outputs[rank] = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
                text = str(err)
                over = _poll(workers, peaks)  # the watchdog's flag, if the rank is still there to ask
                if over is None and job.memory_limit_gib and peaks[rank] > job.memory_limit_gib * GIB:
                    over = (rank, peaks[rank])  # it died before the flag was read, but past its limit
                oom = over is not None or any(s in text for s in ("out of memory", "can't allocate memory", "MemoryError"))
                result.status = "oom" if oom else "error"
                result.peak_memory_gib = [p / GIB for p in peaks]
                result.detail = _oom_note(job, *over) if over else f"rank {rank} failed:\n" + tail(text)
                return
    _collect(outputs, result)


def _oom_note(job: ValidationJob, rank: int, reached: int) -> str:
    limit = job.memory_limit_gib or 0.0
    verdict = ""
    if job.predicted_memory_gib is not None:
        verdict = (f"; the memory prediction ({job.predicted_memory_gib:.3g} GiB) said it fits: wrong"
                   if job.predicted_memory_gib <= limit else
                   f"; the memory prediction ({job.predicted_memory_gib:.3g} GiB) said it does not fit: right")
    return f"infeasible: rank {rank} passed its memory limit of {limit:g} GiB (reached {reached / GIB:.3g} GiB){verdict}"


def _poll(workers: list[Any], peaks: list[int]) -> tuple[int, int] | None:
    """Update per-rank RSS peaks; (rank, rss) of a rank past its memory limit, if any."""
    over = None
    for rank, w in enumerate(workers):
        try:
            peak, passed = ray.get(w.memory.remote(), timeout=5)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            continue
        peaks[rank] = max(peaks[rank], peak)
        if passed and over is None:
            over = (rank, passed)
    return over


def _collect(outputs: dict[int, dict[str, Any]], result: ValidationResult) -> None:
    """Combine the ranks' answers with the measurement code's own rule (a step lasts as long as its slowest rank)."""
    summary = summarise([outputs[r] for r in sorted(outputs)])
    result.status = summary.status
    if summary.status != "ok":
        result.detail = tail(summary.error)
        return
    result.measured_time_s = summary.iter_time_s
    result.measured_time_min_s = summary.iter_time_min_s
    result.measured_time_max_s = summary.iter_time_max_s
    result.peak_memory_gib = [b / GIB for b in summary.peak_mem_bytes]
    result.memory_delta_gib = [(p - b) / GIB for p, b in zip(summary.peak_mem_bytes, summary.base_mem_bytes)]
    result.memory_kind = summary.mem_kind
    result.dataset_row = summary.row()


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
