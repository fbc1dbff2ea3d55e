"""One planning run, shared by `scaledl plan` and `python -m orchestrator.job`: spec -> valid plans ->
replicas -> search (Ray Tune, or batches sent straight to the replicas) -> report files.

With several cluster sizes (`--nodes`) the valid plans of every size are concatenated into one search (a plan's
degrees multiply to its size's GPU count, so the plan names its size), and the replicas hold the one graph.

A small search (at most `HERE_CANDIDATES` candidates, exhaustive, no --address, --replicas or --validate) runs
without Ray: one replica in this process prices it in less time than Ray takes to start. Otherwise, without an
address the Ray already running for this machine is used (RAY_ADDRESS, or a `ray start` cluster), else an embedded
one is started for the command (private: never another command's); the plans are enumerated and the layer graph built
while Ray starts, and the search starts while the replicas load, since each takes a second or more and neither needs
the other to begin.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pydantic import ValidationError

from orchestrator.ray_cluster.address import check_reachable
from orchestrator.ray_cluster.lifecycle import init_ray, shutdown_ray_meanwhile
from orchestrator.search.replica import LocalPool, ReplicaLoadError
from orchestrator.search.run import SearchError, check_resume, choose_searcher, run_search, uses_tune
from orchestrator.search.types import SearchOptions
from predictor.memory.facts import HEADROOM
from predictor.models.base import Dominated
from predictor.models.registry import check_predictor_name, dominated_values
from predictor.spec.resolver import resolve
from predictor.spec.workload import SpecError, load_spec
from predictor.spec.workload import WorkloadSpec
from search_spaces import Enumeration, SpaceConfig, candidate_count, enumerate_plans, resolve_space
from search_spaces.plan_list import PlanList

if TYPE_CHECKING:
    from orchestrator.report import Report

# A search of at most this many candidates (a bound on its valid plans) is priced in this process, without Ray: were
# every candidate valid, one core pricing ~25,000 plans a second (bench.predict_speed) takes about as long as Ray's
# start (~3 s on 2 cores, bench.plan_speed) and two replicas' halves; a space's rules keep a tenth to a quarter.
HERE_CANDIDATES = 150_000


@dataclass
class PlanRequest:
    spec: str
    out: str
    space: str | None = None
    searcher: str = "auto"
    budget_s: float | None = None
    max_trials: int | None = None
    top_k: int = 10
    rank_by: str = "time"
    price_per_gpu_hour: float | None = None
    headroom: float = HEADROOM
    predictor: str = "auto"
    address: str | None = None  # None: embedded Ray; "auto": the cluster of RAY_ADDRESS / ray start
    replicas: int | None = None
    resume: bool = False
    seed: int = 0
    show: bool = True  # progress bar and the ranked table on the terminal
    validate: int = 0  # run the K best plans for real (orchestrator.validation.trials)
    dataset: str | None = None  # with validate: profile dataset the runs are appended to
    history: str | None = None  # sqlite:///PATH storing the top predictions for `scaledl revalidate`
    nodes: list[int] | None = None  # cluster sizes searched together (default: the spec's nodes)
    train_tokens: float | None = None  # tokens of the whole run: days and cost to train
    deadline_days: float | None = None  # keep only plans that train within this many days
    budget_usd: float | None = None  # keep only plans that train within this cost
    trust_module: bool = False  # let the spec's `module:` model run (the user's --trust-module, never the spec's)
    timings: dict[str, float] = field(default_factory=dict)


def sized_spec(spec: WorkloadSpec, nodes: int) -> WorkloadSpec:
    """`spec` on a cluster of `nodes` nodes (validated: e.g. NVLink domains must still tile it)."""
    if nodes == spec.cluster.nodes:
        return spec
    cluster = type(spec.cluster).model_validate({**spec.cluster.model_dump(), "nodes": nodes})
    return spec.model_copy(update={"cluster": cluster})


def enumerate_sizes(specs: list[WorkloadSpec], space: SpaceConfig, dominated: Sequence[Dominated] = ()) -> Enumeration:
    """The valid plans of every cluster size, concatenated (size by size), with the rejections summed; less the plans
    the predictor's `dominated` rules leave out."""
    parts = [enumerate_plans(s, space, dominated) for s in specs]
    rejected: Counter[str] = Counter()
    pruned: Counter[str] = Counter()
    for part in parts:
        rejected.update(part.rejected)
        pruned.update(part.pruned)
    return Enumeration(plans=PlanList([b for part in parts for b in part.plans.blocks]), checked=sum(p.checked for p in parts),
                       rejected=rejected, pruned=pruned)


def running_ray() -> str | None:
    """The Ray already running for this machine: RAY_ADDRESS, else the cluster `ray start` recorded in Ray's temporary
    directory if its GCS still runs here (Ray itself would take a stale record and fail to connect); None when there is
    none (a command then starts its own)."""
    from ray._private.services import find_bootstrap_address, find_gcs_addresses

    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    recorded = find_bootstrap_address(None)
    return recorded if recorded is not None and recorded in find_gcs_addresses() else None


def _connect(address: str | None) -> bool:
    """Initialise Ray (without an address: the one running here, else a new embedded one); True if this call started
    it (and so must shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    running = running_ray() if address is None else None
    if running is not None:
        init_ray(address=running, log_to_driver=False, logging_level=logging.WARNING)
        return False
    if address is None:
        # Idle workers prestarted as Ray starts (one per CPU) are there when the replicas and the result
        # store ask, so those start in ~0.3 s instead of booting Python and Ray after. (Tune's trial
        # actors cannot use them: Tune gives its trainables their own runtime env, so a trial still boots its own.)
        init_ray(address="local", include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                 _system_config={"enable_worker_prestart": True, "prestart_worker_first_driver": True})
    else:
        init_ray(address=address, log_to_driver=False, logging_level=logging.WARNING)
    return True


def _graph(model: Any) -> Any:
    from predictor.graph.cache import graph_for  # a traced graph imports torch: done in this thread, while Ray starts

    return graph_for(model)


def _enumerate(specs: list[WorkloadSpec], space: SpaceConfig, options: SearchOptions,
               dominated: Sequence[Dominated]) -> Enumeration:
    """The valid plans of every size (less those the predictor's `dominated` rules leave out); then, should the search
    of them run Ray Tune, its import (seconds), here while Ray starts."""
    enumeration = enumerate_sizes(specs, space, dominated)
    n = len(enumeration.plans)
    if n and uses_tune(choose_searcher(options.searcher, n, options.exhaustive_limit), n, options):
        import orchestrator.search.tune  # noqa: F401
    return enumeration


def _import_report() -> None:
    """Import the report modules (matplotlib, plotly: a second and more) while Ray starts."""
    import plotly.graph_objects  # noqa: F401
    import orchestrator.report  # noqa: F401
    from orchestrator.report.plots import pyplot

    pyplot()


def _since_process_start() -> float:
    """Seconds since this process started (Python's start and the command's imports, before `run_plan`): the kernel's
    start time of the process and the clock since boot, both in the same clock, so exact to a clock tick."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, IndexError, ValueError):  # not Linux: unknown
        return 0.0


def _timed(timings: dict[str, float], name: str, work: Callable[..., Any], *args: Any) -> Any:
    """`work(*args)`, its seconds recorded in `timings[name]` (work done in a thread beside Ray's start: its own time,
    overlapped, not a phase of the run's sum)."""
    start = time.perf_counter()
    try:
        return work(*args)
    finally:
        timings[name] = time.perf_counter() - start


def _wait_ready(pool: Any) -> tuple[list[dict[str, Any]], float]:
    """The replicas' `info()` once all have loaded their predictor, and when that was (perf_counter)."""
    infos = pool.ready()
    return infos, time.perf_counter()


@dataclass(frozen=True)
class _Search:
    """What the stages before the search decide: the spec resolved, the space, the cluster sizes and the search's
    options, with the key that identifies it for --resume."""

    spec: WorkloadSpec
    resolved: Any  # predictor.spec.resolver.Resolved
    space_name: str
    space: SpaceConfig
    sizes: list[WorkloadSpec]
    options: SearchOptions
    key: str
    dominated: tuple[Dominated, ...]  # the predictor's: plan values the search leaves out unpriced
    here: bool  # priced in this process, without Ray (`prices_here`)


class _Laps:
    """The run's phases, each one's seconds in `timings` (the time since the previous lap)."""

    def __init__(self, timings: dict[str, float], start: float) -> None:
        self.timings, self.last = timings, start

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = now - self.last
        self.last = now


@dataclass
class _RayUse:
    """What of Ray the run holds, released once (`close`): the replicas, and Ray itself when the run started it."""

    started: bool
    pool: Any = None
    closing: Any = None  # the thread shutting Ray down while the report is made

    def release_pool(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def close(self) -> None:
        self.release_pool()
        if self.closing is not None:
            self.closing.join()
        elif self.started:
            import ray

            ray.shutdown()


def _prepare(req: PlanRequest) -> _Search:
    """The spec read and resolved, the space and cluster sizes, and the refusals that need no Ray: an unknown
    framework or predictor, a folder to resume that holds no search or another one, a cluster address nobody answers
    (before the graph and the plans take their time)."""
    spec = load_spec(req.spec, req.trust_module)
    resolved = resolve(spec)
    if isinstance(req.predictor, str):
        check_predictor_name(req.predictor)
        dominated = dominated_values(req.predictor, spec.cluster.device, resolved.device.model)
    else:
        dominated = req.predictor.dominated
    space_name, space = resolve_space(spec, req.space)
    sizes = []
    for n in req.nodes or [spec.cluster.nodes]:
        try:
            sizes.append(sized_spec(spec, n))
        except ValidationError as err:
            raise SpecError(f"{req.spec} on {n} nodes (--nodes): " + "; ".join(e["msg"] for e in err.errors())) from None
    options = SearchOptions(searcher=req.searcher, budget_s=req.budget_s, max_trials=req.max_trials,
                            headroom=req.headroom, resume=req.resume, seed=req.seed)
    key = repr((spec.model_dump_json(), space_name, space.model_dump_json(), req.predictor, [s.cluster.nodes for s in sizes]))
    check_resume(Path(req.out), key, options)
    if req.address is not None:
        check_reachable(req.address)
    return _Search(spec, resolved, space_name, space, sizes, options, key, tuple(dominated),
                   prices_here(req, space, sizes, options))


def prices_here(req: PlanRequest, space: SpaceConfig, sizes: list[WorkloadSpec], options: SearchOptions) -> bool:
    """Whether the search runs in this process, without Ray: an exhaustive search of at most `HERE_CANDIDATES`
    candidates, asked for no cluster (`--address`), replica count or measured runs (`--validate`), by a process that
    has not started Ray itself (a library caller's Ray is used)."""
    if req.address is not None or req.replicas or req.validate or options.searcher not in ("auto", "exhaustive"):
        return False
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return False
    limit = min(HERE_CANDIDATES, options.exhaustive_limit, options.direct_limit)
    total = 0
    for sized in sizes:
        total += candidate_count(sized, space)
        if total > limit:
            return False
    return True


def _check_plans(req: PlanRequest, search: _Search, enumeration: Enumeration) -> None:
    """SpecError when the space holds no valid plan, with the commonest reasons."""
    if not enumeration.plans:
        reasons = "; ".join(f"{n}x {r}" for r, n in enumeration.top_reasons(3))
        raise SpecError(f"{req.spec}: the space {search.space_name} has no valid plan "
                        f"({enumeration.checked} candidates rejected; most common: {reasons}); try another "
                        "--space or relax the search: section")


def _start_here(req: PlanRequest, search: _Search, lap: _Laps) -> tuple[_RayUse, Enumeration, Any]:
    """Without Ray: the plans enumerated, the graph built and the report modules imported, one after another (one
    process, one core's Python: threads would only take turns)."""
    enumeration = _enumerate(search.sizes, search.space, search.options, search.dominated)
    lap("enumerate_s")
    _check_plans(req, search, enumeration)
    graph = _graph(search.spec.model)
    lap("graph_s")
    _import_report()
    lap("report_imports_s")
    return _RayUse(started=False), enumeration, graph


def _start(req: PlanRequest, search: _Search, lap: _Laps) -> tuple[_RayUse, Enumeration, Any]:
    """Ray started, and meanwhile the plans enumerated, the graph built and the report modules imported.

    Enumerating a big space is seconds of Python, and starting Ray seconds of waiting for its processes: the plans,
    the graph and the imports come in threads while Ray starts here (its signal handlers need this thread).
    Meanwhile a short GIL switch interval: at the default 5 ms, each of Ray's many short waits ends waiting for the
    enumerating thread to let go."""
    import ray

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        with ThreadPoolExecutor(3) as ex:
            enumerating = ex.submit(_timed, req.timings, "enumeration_own_s", _enumerate, search.sizes, search.space,
                                    search.options, search.dominated)
            graph_job = ex.submit(_timed, req.timings, "graph_own_s", _graph, search.spec.model)
            imports = ex.submit(_timed, req.timings, "report_imports_own_s", _import_report)
            use = _RayUse(_connect(req.address))
            lap("ray_init_s")
            try:
                enumeration = enumerating.result()
                lap("enumerate_s")
                _check_plans(req, search, enumeration)
                graph = graph_job.result()
                imports.result()
            except BaseException:
                if use.started:
                    ray.shutdown()
                raise
    finally:
        sys.setswitchinterval(interval)
    lap("graph_wait_s")
    return use, enumeration, graph


def _search(req: PlanRequest, search: _Search, enumeration: Enumeration, graph: Any, use: _RayUse,
            console: Any) -> tuple[Any, list[dict[str, Any]], float, float]:
    """The search over the replicas: (its result, the replicas' info, when they were ready, when it ended)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    try:
        use.pool = (LocalPool(req.predictor, search.spec, graph, search.sizes) if search.here
                    else _ray_pool(req, search, enumeration, graph))
    except ReplicaLoadError as err:
        raise SearchError(f"the predictor {req.predictor!r} could not be loaded in a replica: {err}") from None
    # The search starts now and the replicas load meanwhile (Tune's first trial process takes over a second to
    # boot: a Ray worker, then `import ray.tune`); the first batch waits for them.
    with ThreadPoolExecutor(1) as ex:
        ready = ex.submit(_wait_ready, use.pool)
        with Progress(TextColumn("searching {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), console=console,
                      transient=False) as progress:
            task = progress.add_task(search.space_name, total=len(enumeration.plans), best="-")
            best = [float("inf")]

            def on_batch(n: int, score: float) -> None:
                best[0] = min(best[0], score)
                progress.update(task, advance=n, best=f"{best[0]:.3f} s" if best[0] < 1e6 else "none fits yet")

            result = run_search(enumeration.plans, use.pool, Path(req.out), search.resolved.device.mem_capacity / 2**30,
                                search.options, key=search.key, on_batch=on_batch)
        try:
            infos, ready_at = ready.result()
        except ReplicaLoadError as err:
            raise SearchError(f"the predictor {req.predictor!r} could not be loaded in a replica: {err}") from None
    return result, infos, ready_at, time.perf_counter()


def _ray_pool(req: PlanRequest, search: _Search, enumeration: Enumeration, graph: Any) -> Any:
    """The replicas as Ray actors (`orchestrator.search.ray_replicas.ReplicaPool`), loading while the search starts."""
    import ray

    from orchestrator.search.ray_replicas import ReplicaPool

    # One replica per ~2,000 plans, at most one per CPU: a replica's first plans are its slowest (each new
    # stage shape is priced once, then memoised), so two split even a few thousand plans' cold start.
    replicas = req.replicas or min(max(1, int(ray.cluster_resources().get("CPU", 1))),
                                   -(-len(enumeration.plans) // 2000), 8)
    return ReplicaPool.start(req.predictor, search.spec, graph, count=replicas, sizes=search.sizes)


def _report(req: PlanRequest, search: _Search, enumeration: Enumeration, result: Any, infos: list[dict[str, Any]],
            repredictor: Any, use: _RayUse) -> "Report":
    """The report, built once with what a wider space holds and, with --validate, the measured runs of its best
    plans (the replicas' CPUs go to those runs)."""
    from dataclasses import replace

    from orchestrator.report import TrainingGoal, build_report
    from orchestrator.search.wider_space import best_of_sample

    report = build_report(resolved=search.resolved, spec_path=req.spec,
                          predictor={"name": infos[0]["predictor"], "accuracy": infos[0].get("accuracy")},
                          space_name=search.space_name, space=search.space, enumeration=enumeration, result=result,
                          by=req.rank_by, price=req.price_per_gpu_hour, top_k=req.top_k, sizes=search.sizes,
                          goal=TrainingGoal(req.train_tokens, req.deadline_days, req.budget_usd),
                          repredictor=repredictor)
    checked = time.perf_counter()
    wider = best_of_sample(report, search.sizes, repredictor, req.seed)  # does the full space hold better plans?
    req.timings["wider_s"] = time.perf_counter() - checked
    validation = None
    if req.validate and report.fits:
        from orchestrator.validation.trials import validate_top

        use.release_pool()
        validation = validate_top(report, req.validate, dataset_dir=req.dataset)
    return replace(report, wider=wider, validation=validation)


def _write_timings(req: PlanRequest) -> None:
    """Where the command's time went, shutdown included (report.json is written before it): read by
    bench.plan_speed; written atomically."""
    done_at = Path(req.out) / "timings.json"
    tmp = done_at.with_name(f".{done_at.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({k: round(v, 3) for k, v in req.timings.items()}, indent=1))
    os.replace(tmp, done_at)


def run_plan(req: PlanRequest) -> "Report":
    """Search the plans of `req.spec`, write the report into `req.out`; returns the report. The stages: prepare
    (no Ray), start (Ray, with the plans, the graph and the imports beside it), search, levers, report, write."""
    t0 = time.perf_counter()
    req.timings["startup_s"] = _since_process_start()
    from rich.console import Console

    search = _prepare(req)
    lap = _Laps(req.timings, t0)
    use, enumeration, graph = (_start_here if search.here else _start)(req, search, lap)
    from orchestrator.search.levers import Repredictor, explore_levers
    from orchestrator.report import print_report, write_report

    console = Console(quiet=not req.show)
    try:
        result, infos, ready_at, done = _search(req, search, enumeration, graph, use, console)
        req.timings["replicas_ready_s"] = ready_at - lap.last  # overlapped with the search's start
        lap("search_s")
        # Nothing left needs Ray: it shuts down while the report is made. Not after a Tune run, whose objects (a
        # stopped run's above all) this thread may still free, which Ray takes for a use after shutdown and exits.
        if not req.validate and not result.stats["tune"]:
            use.release_pool()
            if use.started:
                use.closing = shutdown_ray_meanwhile()
        repredictor = Repredictor(req.predictor, graph, sized_spec)
        result = explore_levers(result, search.sizes, repredictor)
        lap("levers_s")
        # What the search costs once the predictor can answer (the search's start overlapped the loading).
        after = max(done - ready_at, 1e-9)
        result.stats.update(search_after_ready_s=round(after, 3),
                            plans_per_s_after_ready=round(result.stats["evaluated_plans"] / after, 1), replicas=infos,
                            timings={k: round(v, 3) for k, v in req.timings.items()})
        report = _report(req, search, enumeration, result, infos, repredictor, use)
        if req.history:
            from orchestrator.revalidation.record import record_top

            record_top(req.history, report, req.top_k)
        write_report(report, Path(req.out))
        lap("report_s")
        print_report(report, console)
        console.print(f"report: {Path(req.out) / 'report.html'} (and report.json, report.md, launch/)")
    finally:
        use.close()
    lap("shutdown_s")
    req.timings["total_s"] = time.perf_counter() - t0
    _write_timings(req)
    return report
