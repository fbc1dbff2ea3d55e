"""Validate predicted plans by real short training runs on Ray.

A plan runs as one Ray actor per rank, gathered in a placement group shaped by the plan:
one bundle per rank; a plan with tensor parallelism is packed (a plan that is one tp group
is STRICT_PACKed on one node when a node can hold it), pipeline stages are spread over
nodes, data-parallel replicas packed. The actors rendezvous on rank 0's address and run
the measurement code of `predictor.measure` (the same per-rank body `scaledl profile`
uses), so a validation measures exactly what the profile dataset measures.

Each validation is one Ray Tune trial whose resources are that placement group, so several
plans run side by side when the cluster has room and queue when it does not. Failures are
results, never exceptions: a rank over its memory limit ends the run as `oom` with the
memory reached, a crash as `error` with the log tail, a hang as `timeout` (the actors are
killed), and a plan the cluster can never hold as `error` without being launched.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import psutil
import ray
from ray import tune
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.lifecycle import init_ray
from predictor import dataset
from predictor.dataset import provenance
from predictor.design import ProfileConfig
from predictor.measure.iteration import summarise
from predictor.profile import config_row
from predictor.plan import Plan, plan_errors
from predictor.workload import WorkloadSpec, parse_spec

GIB = 1024**3
STATUSES = ("ok", "oom", "error", "timeout")


@dataclass(frozen=True)
class ValidationJob:
    """One plan to run for real, with what was predicted for it (None: nothing to compare with)."""

    spec: dict[str, Any]  # WorkloadSpec.model_dump(): plain data, so it travels to Ray workers
    plan: str
    predicted_time_s: float | None = None
    predicted_memory_gib: float | None = None
    warmup: int = 2
    steps: int = 3
    timeout_s: float = 300.0
    memory_limit_gib: float | None = None  # per rank; exceeding it ends the run as `oom`
    cpus_per_rank: float = 1.0


@dataclass
class ValidationResult:
    """What a real run of a plan measured; `status` says whether the figures exist."""

    plan: str
    status: str  # ok | oom | error | timeout
    measured_time_s: float | None = None
    measured_time_min_s: float | None = None
    measured_time_max_s: float | None = None
    peak_memory_gib: list[float] = field(default_factory=list)  # per rank: RSS high-water (CPU) or allocated (CUDA)
    memory_delta_gib: list[float] = field(default_factory=list)  # per rank: peak minus memory before the model
    memory_kind: str = ""  # rss | cuda
    predicted_time_s: float | None = None
    predicted_memory_gib: float | None = None
    strategy: str = ""
    nodes: list[str] = field(default_factory=list)  # node id of each rank
    started_at: float = 0.0  # epoch seconds when its placement group was granted and the run began
    wall_s: float = 0.0
    detail: str = ""  # failure reason / log tail, or a note on the placement
    dataset_row: dict[str, Any] = field(default_factory=dict)  # whole-iteration columns for the profile dataset

    @property
    def time_error(self) -> float | None:
        """Signed relative error of the predicted time: (predicted - measured) / measured."""
        if self.measured_time_s and self.predicted_time_s is not None:
            return (self.predicted_time_s - self.measured_time_s) / self.measured_time_s
        return None

    @property
    def measured_memory_gib(self) -> float | None:
        """What a memory prediction is compared with: the largest rank's memory of the training itself.

        On CPU the RSS high-water includes the interpreter and libraries, so the part the model
        added (peak minus the memory before it was built) is compared; CUDA counts allocations only.
        """
        per_rank = self.memory_delta_gib if self.memory_kind == "rss" else self.peak_memory_gib
        return max(per_rank) if per_rank and self.status == "ok" else None

    @property
    def memory_error(self) -> float | None:
        measured = self.measured_memory_gib
        if measured and self.predicted_memory_gib is not None:
            return (self.predicted_memory_gib - measured) / measured
        return None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(time_error=self.time_error, memory_error=self.memory_error,
                   measured_memory_gib=self.measured_memory_gib)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ValidationResult":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


# --- placement --------------------------------------------------------------------------------


def rank_bundles(plan: Plan, cpus_per_rank: float = 1.0, gpus: bool = False) -> list[dict[str, float]]:
    """One bundle per rank, in global rank order."""
    bundle = {"CPU": cpus_per_rank, **({"GPU": 1.0} if gpus else {})}
    return [dict(bundle) for _ in range(plan.gpus)]


def placement_strategy(plan: Plan, bundle: dict[str, float], nodes: Sequence[dict[str, float]]) -> tuple[str, str]:
    """(Ray placement strategy, note) for a plan on nodes with the given total resources.

    tp exchanges activations every layer, so its ranks belong on one node: a plan that is a
    single tp group is STRICT_PACKed when one node can hold it, otherwise PACKed (Ray keeps
    consecutive bundles, i.e. tp neighbours with tp innermost, together as far as it can).
    Pipeline stages only pass activations between neighbours once per micro-batch, so they are
    spread over nodes like a real pipeline; pure data parallelism is packed.
    """
    if plan.tp > 1:
        fits = any(all(node.get(k, 0.0) >= v * plan.tp for k, v in bundle.items()) for node in nodes)
        if plan.gpus == plan.tp and fits:
            return "STRICT_PACK", ""
        return "PACK", "" if fits else f"no node holds the tp={plan.tp} group; its ranks span nodes"
    if plan.pp > 1:
        return "SPREAD", ""
    return "PACK", ""


def connect_ray(address: str | None = None) -> None:
    """Join the Ray cluster at `address`, or start a local one; a no-op when already connected."""
    if ray.is_initialized():
        return
    if address:
        init_ray(address=address, configure_logging=False, log_to_driver=False)
    else:
        init_ray(include_dashboard=False, configure_logging=False, log_to_driver=False)


def default_device() -> str | None:
    """'cpu' on a cluster without GPUs; None when it has GPUs (their model must be named by the user)."""
    return "cpu" if not any(n.get("GPU", 0) for n in cluster_nodes()) else None


def cluster_nodes() -> list[dict[str, float]]:
    """Total resources of each alive node of the connected Ray cluster."""
    return [dict(n["Resources"]) for n in ray.nodes() if n["Alive"]]


def _unplaceable(bundles: list[dict[str, float]], nodes: Sequence[dict[str, float]]) -> str:
    """Why the cluster can never hold these bundles ('' when it can, greedily first-fit)."""
    free = [dict(n) for n in nodes]
    for i, bundle in enumerate(bundles):
        for node in free:
            if all(node.get(k, 0.0) >= v for k, v in bundle.items()):
                for k, v in bundle.items():
                    node[k] -= v
                break
        else:
            total = {k: sum(n.get(k, 0.0) for n in nodes) for k in bundles[0]}
            need = {k: sum(b.get(k, 0.0) for b in bundles) for k in bundles[0]}
            return f"the plan needs {len(bundles)} ranks ({need}) but the cluster has {total}; rank {i} has no room"
    return ""


# --- the rank workers -------------------------------------------------------------------------


@ray.remote(max_concurrency=2)
class RankWorker:
    """One rank of a validation run; a second thread answers memory polls while it trains."""

    def __init__(self, memory_limit_bytes: int | None):
        self.limit = memory_limit_bytes
        self.peak = 0
        self.over = 0  # RSS reached when the limit was passed (0: not passed)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        """Track the RSS high-water mark; past the limit, flag it and end the process like the kernel OOM killer."""
        proc = psutil.Process()
        while True:  # until the process ends: the driver kills every rank actor after the run
            rss = proc.memory_info().rss
            self.peak = max(self.peak, rss)
            if self.limit is not None and rss > self.limit:
                self.over = rss
                time.sleep(2.0)  # long enough for the driver's next poll to see the flag
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.01)

    def where(self) -> tuple[str, str, int]:
        """(node id, node address, a free port on it) for the rendezvous."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), port

    def memory(self) -> tuple[int, int]:
        return self.peak, self.over

    def run(self, job: dict[str, Any], rank: int, world_size: int, master_addr: str, master_port: int,
            threads: int) -> dict[str, Any]:
        """Join the run's process group and train with the measurement code's per-rank body."""
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        from predictor.measure.dist_worker import run_iteration

        torch.set_num_threads(threads)
        device = torch.device("cuda", 0) if torch.cuda.is_available() and job["device"] != "cpu" else torch.device("cpu")
        if world_size > 1:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size,
                                    init_method=f"tcp://{master_addr}:{master_port}",
                                    timeout=timedelta(seconds=job["timeout_s"]))
        # The actor is killed afterwards, so gloo's exit-time abort (ARCHITECTURE.md) never happens here.
        return run_iteration(job, rank, world_size, device)


# --- one validation (a Tune trial) ------------------------------------------------------------


def run_job(job: ValidationJob, pg: PlacementGroup | None = None) -> ValidationResult:
    """Run one validation on the connected Ray cluster; every failure comes back as a result."""
    t0 = time.perf_counter()
    result = ValidationResult(job.plan, "error", predicted_time_s=job.predicted_time_s,
                              predicted_memory_gib=job.predicted_memory_gib, started_at=time.time())
    problem = _plan_problem(job)
    if problem:
        result.detail = problem
        return result
    plan, spec = Plan.parse(job.plan), parse_spec(job.spec)
    workers: list[Any] = []
    try:
        limit = int(job.memory_limit_gib * GIB) if job.memory_limit_gib else None
        options: dict[str, Any] = {"num_cpus": job.cpus_per_rank, "num_gpus": 1 if _on_gpu(job) else 0}
        for rank in range(plan.gpus):
            if pg is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank)
            workers.append(RankWorker.options(**options).remote(limit))
        places = ray.get([w.where.remote() for w in workers], timeout=job.timeout_s)
        result.nodes = [node for node, _, _ in places]
        _, master_addr, master_port = places[0]
        payload = _payload(job, spec)
        threads = max(1, int(job.cpus_per_rank))
        runs = [w.run.remote(payload, rank, plan.gpus, master_addr, master_port, threads)
                for rank, w in enumerate(workers)]
        _wait(job, workers, runs, result)
    except (ray.exceptions.RayError, OSError) as err:  # a worker that never started or answered
        result.status, result.detail = "error", _tail(f"{type(err).__name__}: {err}")
    finally:
        for w in workers:
            ray.kill(w)
        result.wall_s = time.perf_counter() - t0
    return result


_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _payload(job: ValidationJob, spec: WorkloadSpec) -> dict[str, Any]:
    """The measurement code's job dict (see predictor.measure.dist_worker.run_iteration)."""
    on_gpu = _on_gpu(job)
    return {"kind": "iteration", "spec_json": _profile_config(job, spec).spec_json, "plan": job.plan,
            "batch": spec.training.global_batch, "dtype": _DTYPES[spec.training.precision] if on_gpu else "float32",
            "warmup": job.warmup, "steps": job.steps, "device": "cuda" if on_gpu else "cpu",
            "timeout_s": job.timeout_s}


def _profile_config(job: ValidationJob, spec: WorkloadSpec) -> ProfileConfig:
    return ProfileConfig(spec.model, spec.training.global_batch, Plan.parse(job.plan))


def dataset_rows(jobs: Sequence[ValidationJob], results: Sequence[ValidationResult]) -> list[dict[str, Any]]:
    """Profile-dataset rows (predictor.dataset 'iterations' schema) of the runs that got to train.

    Failed runs are kept too (status oom/error/timeout): a learner must know what does not fit.
    """
    rows = []
    for job, res in zip(jobs, results):
        if not res.dataset_row and not res.nodes:
            continue  # never launched (invalid or unplaceable plan): nothing was measured
        spec = parse_spec(job.spec)
        measured = res.dataset_row or {"status": res.status, "error": res.detail[-2000:], "steps": 0, "mem_kind": "",
                                       "iter_time_s": float("nan"), "iter_time_min_s": float("nan"),
                                       "iter_time_max_s": float("nan"), "peak_mem_bytes": 0, "peak_mem_delta_bytes": 0}
        rows.append({
            **config_row(_profile_config(job, spec)),
            "design": "validate", **measured,
            **provenance("cuda" if _on_gpu(job) else "cpu", max(1, int(job.cpus_per_rank))),
        })
    return rows


def append_to_dataset(root: str | Path, jobs: Sequence[ValidationJob], results: Sequence[ValidationResult]) -> Path | None:
    """Append the validation runs to the profile dataset at `root` (one atomic part file)."""
    return dataset.append(root, "iterations", dataset_rows(jobs, results))


def _plan_problem(job: ValidationJob) -> str:
    """Why this job's plan cannot be validated ('' when it can); tp may cross nodes here."""
    try:
        plan = Plan.parse(job.plan)
        errors = plan_errors(plan, parse_spec(job.spec), allow_cross_node_tp=True)
    except ValueError as err:  # PlanError, SpecError
        return f"invalid plan: {err}"
    if errors:
        return "invalid plan: " + "; ".join(errors)
    missing = unmeasurable(plan)
    return f"not measurable yet: {missing}" if missing else ""


def unmeasurable(plan: Plan) -> str:
    """What of `plan` the measurement code (predictor.measure.dist_worker) does not implement ('' if nothing).

    A run of a different plan than the one predicted would compare the wrong things, so such
    plans are reported as not measurable instead of being approximated.
    """
    reasons = []
    if sum(d > 1 for d in (plan.dp, plan.tp, plan.pp)) > 1:
        reasons.append("combined dp/tp/pp degrees (one kind of parallelism per run)")
    if plan.pp > 2:
        reasons.append(f"pp={plan.pp} (pipelines of 2 stages only)")
    if plan.recompute not in ("none", "full"):
        reasons.append(f"recompute={plan.recompute} (full recomputation only)")
    if plan.sp:
        reasons.append("sequence parallelism")
    if plan.schedule == "interleaved":
        reasons.append("the interleaved schedule")
    return "; ".join(reasons)


def _on_gpu(job: ValidationJob) -> bool:
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
                result.detail = _oom_note(job, *over) if over else f"rank {rank} failed:\n" + _tail(text)
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
        result.detail = _tail(summary.error)
        return
    result.measured_time_s = summary.iter_time_s
    result.measured_time_min_s = summary.iter_time_min_s
    result.measured_time_max_s = summary.iter_time_max_s
    result.peak_memory_gib = [b / GIB for b in summary.peak_mem_bytes]
    result.memory_delta_gib = [(p - b) / GIB for p, b in zip(summary.peak_mem_bytes, summary.base_mem_bytes)]
    result.memory_kind = summary.mem_kind
    result.dataset_row = summary.row()


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _trial(config: dict[str, Any], jobs: Sequence[ValidationJob]) -> None:
    """Tune function trainable: run the job named by the config inside the trial's placement group."""
    result = run_job(jobs[config["job"]], ray.util.get_current_placement_group())
    # As one JSON string: Tune's loggers skip strings, and nested lists would upset TensorBoard's.
    tune.report({"job": config["job"], "result": json.dumps(result.to_dict())})


def validate(jobs: Sequence[ValidationJob], storage: str | None = None,
             concurrency: int | None = None) -> list[ValidationResult]:
    """Validate plans as Ray Tune trials on the connected (or a new local) Ray cluster; results in job order.

    `concurrency` caps the runs in flight (default: as many as the cluster holds). Cap it at 1 where
    the cluster's declared CPUs are not separate cores (e.g. `ray.cluster_utils` nodes on one
    machine): runs side by side there slow each other down and measure the contention."""
    if not jobs:
        return []
    connect_ray()
    nodes = cluster_nodes()
    results: dict[int, ValidationResult] = {}
    factories: dict[int, tune.PlacementGroupFactory] = {}
    placement: dict[int, tuple[str, str]] = {}
    for i, job in enumerate(jobs):
        why = _plan_problem(job)
        if not why:
            plan = Plan.parse(job.plan)
            bundles = rank_bundles(plan, job.cpus_per_rank, _on_gpu(job))
            placement[i] = placement_strategy(plan, bundles[0], nodes)
            why = _unplaceable(bundles, nodes)
        if why:
            results[i] = ValidationResult(job.plan, "error", predicted_time_s=job.predicted_time_s,
                                          predicted_memory_gib=job.predicted_memory_gib, detail=why)
            continue
        # An empty head bundle: the trial driver only waits, the ranks own the resources.
        factories[i] = tune.PlacementGroupFactory([{}] + bundles, strategy=placement[i][0])
    if factories:
        results.update(_run_trials(jobs, factories, storage, concurrency))
    for i in factories:  # launched runs: say how they were placed
        results[i].strategy, note = placement[i]
        if note:
            results[i].detail = f"{results[i].detail}\n{note}".strip()
    return [results[i] for i in range(len(jobs))]


def _run_trials(jobs: Sequence[ValidationJob], factories: dict[int, tune.PlacementGroupFactory],
                storage: str | None, concurrency: int | None) -> dict[int, ValidationResult]:
    """One Tune trial per job; Tune starts each as soon as its placement group fits, the rest queue."""
    trainable = tune.with_resources(tune.with_parameters(_trial, jobs=list(jobs)),
                                    resources=lambda config: factories[config["job"]])
    results: dict[int, ValidationResult] = {}
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the legacy reporter is silent at verbose=0
    with tempfile.TemporaryDirectory(prefix="scaledl-validate-") as tmp:
        tuner = tune.Tuner(
            trainable,
            param_space={"job": tune.grid_search(sorted(factories))},
            tune_config=tune.TuneConfig(max_concurrent_trials=concurrency or len(factories)),
            run_config=tune.RunConfig(storage_path=storage or tmp, name="validate", verbose=0),
        )
        for res in tuner.fit():
            i = res.config["job"]
            if res.error is not None or "result" not in (res.metrics or {}):
                job = jobs[i]
                results[i] = ValidationResult(job.plan, "error", predicted_time_s=job.predicted_time_s,
                                              predicted_memory_gib=job.predicted_memory_gib, detail=_tail(str(res.error)))
                continue
            results[i] = ValidationResult.from_dict(json.loads(res.metrics["result"]))
    return results


def winner_note(results: Sequence[ValidationResult]) -> str:
    """A sentence when the measured fastest plan is not the predicted fastest ('' otherwise)."""
    ok = [r for r in results if r.status == "ok" and r.predicted_time_s is not None]
    if len(ok) < 2:
        return ""
    predicted = min(ok, key=lambda r: r.predicted_time_s)  # type: ignore[arg-type, return-value]
    measured = min(ok, key=lambda r: r.measured_time_s)  # type: ignore[arg-type, return-value]
    if predicted is measured:
        return ""
    return (f"measured winner differs from the predicted one: {measured.plan} ran in {measured.measured_time_s:.4g} s "
            f"(predicted {measured.predicted_time_s:.4g} s) while predicted-best {predicted.plan} ran in "
            f"{predicted.measured_time_s:.4g} s (predicted {predicted.predicted_time_s:.4g} s)")


def jobs_for(spec: WorkloadSpec, plans: Sequence[Plan], predictions: Sequence[Any] | None = None,
             **options: Any) -> list[ValidationJob]:
    """ValidationJobs of `plans` of `spec`, carrying their predictions (Prediction objects) when given."""
    data = spec.model_dump(mode="json", exclude_none=True)
    preds = list(predictions) if predictions is not None else [None] * len(plans)
    return [ValidationJob(data, str(p), getattr(pr, "iter_time_s", None), getattr(pr, "peak_memory_gib", None), **options)
            for p, pr in zip(plans, preds)]


# --- `scaledl plan --validate K` ----------------------------------------------------------------


def validate_top(report: dict[str, Any], k: int, steps: int = 3, warmup: int = 2, timeout_s: float = 300.0,
                 dataset_dir: str | None = None) -> dict[str, Any]:
    """Run the report's K best plans for real; the report's `validation` section (see `validation_lines`)."""
    jobs = [ValidationJob(report["spec"], r["plan"], r["iter_time_s"], r["peak_memory_gib"], warmup, steps, timeout_s)
            for r in report["ranked"][:k]]
    results = validate(jobs)
    if dataset_dir:
        append_to_dataset(dataset_dir, jobs, results)
    plans = []
    for r in results:
        data = r.to_dict()
        data.pop("dataset_row")
        plans.append(data)
    return {"k": k, "steps": steps, "warmup": warmup, "plans": plans, "note": winner_note(results)}


def record_top(history_url: str, report: dict[str, Any], k: int) -> None:
    """Store the report's K best predictions in the history database, for `scaledl revalidate` to re-measure."""
    from orchestrator.history import History

    name = str(report["predictor"]["name"])
    with History.open(history_url) as history:
        history.record_predictions(report["spec"], report["spec"]["cluster"]["device"], name.split(" ")[0], name,
                                   [(r["plan"], r["iter_time_s"], r["peak_memory_gib"]) for r in report["ranked"][:k]])


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def short_plan(text: str) -> str:
    """dp/tp/pp and the fields that differ from their defaults: what a table has room for."""
    plan, default = Plan.parse(text), Plan()
    return ",".join(f"{f.name}={str(getattr(plan, f.name)).lower()}" for f in fields(plan)
                    if f.name in ("dp", "tp", "pp") or getattr(plan, f.name) != getattr(default, f.name))


def validation_rows(section: dict[str, Any]) -> list[list[str]]:
    """Table rows: plan, predicted s, measured s, time error, predicted GiB, measured GiB, status."""
    rows = []
    for p in section["plans"]:
        status = p["status"] if p["status"] == "ok" else f"{p['status']}: {p['detail'].splitlines()[0][:80] if p['detail'] else ''}"
        error = "-" if p["time_error"] is None else f"{100 * p['time_error']:+.1f}%"
        rows.append([short_plan(p["plan"]), _fmt(p["predicted_time_s"], ".4g"), _fmt(p["measured_time_s"], ".4g"), error,
                     _fmt(p["predicted_memory_gib"], ".3g"), _fmt(p["measured_memory_gib"], ".3g"), status])
    return rows


VALIDATION_HEADER = ["plan", "predicted s", "measured s", "time error", "predicted GiB", "measured GiB", "status"]


def validation_intro(section: dict[str, Any]) -> str:
    """The sentence that opens a validation section (report.md and report.html)."""
    return (f"The {section['k']} best plans, {section['warmup']} warm-up + {section['steps']} measured steps each "
            "(measured memory: the largest rank's training memory).")


def validation_lines(section: dict[str, Any]) -> list[str]:
    """The report.md section of a validation."""
    lines = ["## Measured by real runs", "", validation_intro(section), "",
             "| " + " | ".join(VALIDATION_HEADER) + " |", "|" + "---|" * len(VALIDATION_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in validation_rows(section)]
    if section["note"]:
        lines += ["", f"Note: {section['note']}."]
    return lines + [""]


def print_validation(section: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"measured by real runs (top {section['k']})")
    for h in VALIDATION_HEADER:
        table.add_column(h, justify="left" if h in ("plan", "status") else "right")
    for row in validation_rows(section):
        table.add_row(*row)
    console.print(table)
    if section["note"]:
        console.print(f"note: {section['note']}")
