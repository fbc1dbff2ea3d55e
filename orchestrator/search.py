"""The plan search: Ray Tune trials that each evaluate a batch of valid plans through the replicas.

Tune runs ~30 trials/s at best, so a trial is a batch (exhaustive: a chunk of the valid plans;
random: a group; Optuna TPE: a group chosen by a conditional tree, see `search_spaces.tune_space`),
never one plan. Trials hand their answers to a `ResultStore` actor on the driver's node, which
writes each batch to `OUT/evaluated/` atomically; so the search is anytime (a budget or Ctrl-C
stops Tune, what was evaluated is kept), and a failing trial costs only its batch (retried twice,
then recorded as errored).

`--resume` continues from the stored batches, after Ctrl-C, a crash or a spent budget alike: a new
Tune run over what is left (exhaustive and random: the batches not stored yet; Optuna: the same
seeded TPE, whose trials on stored groups answer from the store at once, so it replays its history
and goes on). Not `Tuner.restore`: Tune counts a run stopped by its budget as finished, so restoring
it continues nothing, and a restored run keeps the old budget.
Plans predicted above the device memory, less a headroom, are kept as infeasible with the reason.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import ray
from ray import tune
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.replicas import ReplicaPool, join_tables
from orchestrator.store import Batch, ResultStore, SearchError, memory_reason, prepare_store
from predictor.plan import Plan
from predictor.prediction import Prediction
from predictor.prediction_table import PredictionTable
from predictor.memory.facts import HEADROOM
from search_spaces import GROUP_AXES, TuneSpace

SEARCHERS = ("auto", "exhaustive", "optuna", "random")
EXHAUSTIVE_LIMIT = 2_000_000  # predicting every plan beats sampling while the driver holds their columns (~1.5 kB a plan)
MAX_BATCH = 131_072
STORE_FORMAT = "plan-indices-table-2"  # stored batches: plans by their index in the enumeration, answers as columns (2: stage memories end to end)
EXPERIMENT = "search"


@dataclass
class SearchOptions:
    searcher: str = "auto"
    budget_s: float | None = None  # wall-clock budget of the Tune run
    max_trials: int | None = None  # Optuna / random: trials (groups) to try; default: all groups, at most 256
    exhaustive_limit: int = EXHAUSTIVE_LIMIT  # auto: exhaustive up to this many valid plans, else Optuna
    headroom: float = HEADROOM  # memory kept free: feasible iff peak <= capacity * (1 - headroom)
    batch_size: int | None = None  # exhaustive: plans per trial (default: 2 rounds of trials, 256..MAX_BATCH plans)
    concurrency: int = 1  # trials in flight; each is a process, and the replicas do the work in parallel
    seed: int = 0
    resume: bool = False


@dataclass
class Evaluated:
    """One evaluated plan: its prediction, or the error of predicting it; `infeasible` says why it cannot run."""

    plan: Plan
    prediction: Prediction | None
    error: str | None = None
    infeasible: str | None = None

    @property
    def feasible(self) -> bool:
        return self.prediction is not None and self.error is None and self.infeasible is None


def infeasibility(pred: Prediction, limit_gib: float, capacity_gib: float) -> str | None:
    """Why `pred` cannot run on a device of `capacity_gib` keeping `limit_gib` usable, or None."""
    return memory_reason(pred.peak_memory_gib, limit_gib, capacity_gib)


@dataclass
class SearchResult:
    """Every evaluated plan, as columns (a search evaluates up to millions; a report shows a few hundred):
    `plans[i]` was predicted as row i of `table`, in the order evaluated; `failed` holds the plans whose prediction
    failed, with why. A plan is infeasible when its predicted peak memory exceeds `limit_gib`."""

    plans: list[Plan]
    table: PredictionTable
    limit_gib: float
    capacity_gib: float
    failed: list[tuple[Plan, str]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, evaluated: list[Evaluated], stats: dict[str, Any], limit_gib: float, capacity_gib: float) -> "SearchResult":
        """The result of already evaluated plans (their predictions are kept as the objects given)."""
        done = [e for e in evaluated if e.prediction is not None]
        return cls([e.plan for e in done], PredictionTable.from_predictions([e.prediction for e in done]),  # type: ignore[misc]
                   limit_gib, capacity_gib, [(e.plan, e.error or "") for e in evaluated if e.prediction is None], stats)

    @cached_property
    def infeasible(self) -> np.ndarray:
        return self.table.peak_memory_gib > self.limit_gib

    @cached_property
    def gpus(self) -> np.ndarray:
        return np.fromiter((p.gpus for p in self.plans), dtype=np.int64, count=len(self.plans))

    def reason(self, row: int) -> str | None:
        """Why the plan of `row` cannot run, or None."""
        return memory_reason(float(self.table.peak_memory_gib[row]), self.limit_gib, self.capacity_gib)

    @property
    def evaluated(self) -> list[Evaluated]:
        """Every plan as an `Evaluated` (one Prediction object each: for small searches and tests)."""
        return ([Evaluated(p, pred, infeasible=self.reason(i)) for i, (p, pred) in enumerate(zip(self.plans, self.table.rows()))]
                + [Evaluated(p, None, error=e) for p, e in self.failed])


# A trial process's copy of the space, by its object id: Tune's `with_parameters` would unpickle every plan of the
# space again for each trial the process runs (seconds a trial for a big space under Optuna's hundreds of trials).
_SPACES: dict[str, TuneSpace] = {}


def _space(ref: Any) -> TuneSpace:
    if ref.hex() not in _SPACES:
        _SPACES.clear()
        _SPACES[ref.hex()] = ray.get(ref)
    return _SPACES[ref.hex()]


def _trial(config: dict[str, Any], space_ref: list[Any], pool: ReplicaPool, store: Any) -> None:
    """One Tune trial: predict the batch the config addresses (unless stored already) and report its best.
    `space_ref`: [the TuneSpace's ObjectRef] (in a list, so Tune passes the reference, not the space)."""
    space = _space(space_ref[0])
    key = space.key(config)
    summary = ray.get(store.summary.remote(key))
    cached = summary is not None
    if summary is None:
        members = space.members(config)
        start = time.perf_counter()
        answers = pool.predict([space.plans[i] for i in members])
        summary = ray.get(store.add.remote(key, np.asarray(members, dtype=np.int64), answers, time.perf_counter() - start))
    tune.report({**summary, "cached": cached})


class _Progress(tune.Callback):
    """Forwards each finished batch to the caller's progress function (e.g. a rich progress bar)."""

    def __init__(self, on_batch: Callable[[int, float], None]) -> None:
        self.on_batch: Callable[[int, float], None] | None = on_batch

    def __getstate__(self) -> dict[str, Any]:
        return {"on_batch": None}  # Tune pickles its run config; a live progress bar stays in this process

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:  # noqa: ANN001 - Tune's signature
        if self.on_batch is not None and not result.get("cached"):
            self.on_batch(int(result.get("plans", 0)), float(result.get("score", math.inf)))


@contextmanager
def _quiet_tune() -> Iterator[None]:
    """Tune without its console tables and per-trial result files, for this search only (other Tune
    users in the process, e.g. validation runs, keep their defaults)."""
    settings = {"RAY_AIR_NEW_OUTPUT": "0",  # the legacy reporter is silent at verbose=0; ours is the bar
                "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}  # results live in the store: CSV/JSON/TBX only cost time
    saved = {k: os.environ.get(k) for k in settings}
    logger = logging.getLogger("ray.tune")
    level = logger.level
    os.environ.update(settings)
    logger.setLevel(logging.ERROR)  # e.g. "could not fetch metrics", which the missing loggers would cause
    try:
        yield
    finally:
        logger.setLevel(level)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def choose_searcher(requested: str, n_plans: int, limit: int) -> str:
    if requested not in SEARCHERS:
        raise SearchError(f"unknown searcher {requested!r}; use one of {', '.join(SEARCHERS)}")
    if requested == "auto":
        return "exhaustive" if n_plans <= limit else "optuna"
    return requested


def fingerprint(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def run_search(plans: list[Plan], pool: ReplicaPool, out_dir: Path, capacity_gib: float,
               options: SearchOptions, key: str, on_batch: Callable[[int, float], None] | None = None) -> SearchResult:
    """Search `plans` (all valid) with Ray Tune; returns every evaluated plan and the search statistics.

    `key` identifies the workload/space/predictor so `--resume` never mixes two searches.
    """
    if not plans:
        raise SearchError("the search space has no valid plan for this workload")
    searcher = choose_searcher(options.searcher, len(plans), options.exhaustive_limit)
    # Few, large trials: Tune's per-trial cost (a result row, a trial directory, ~1 s on 2 cores) dwarfs
    # predicting thousands of plans; two rounds of trials keep a progress bar and a budget meaningful.
    batch = options.batch_size or min(MAX_BATCH, max(256, math.ceil(len(plans) / (2 * options.concurrency))))
    space = TuneSpace(plans, batch_size=batch)
    limit_gib = capacity_gib * (1 - options.headroom)
    out_dir = out_dir.resolve()
    storage = out_dir / "tune"
    experiment = storage / EXPERIMENT
    if options.resume and not (out_dir / "evaluated" / "FINGERPRINT").is_file():
        raise SearchError(f"nothing to resume in {out_dir}; run without --resume")
    # The store runs on this (the driver's) node, so its directory is this process's --out.
    prepare_store(out_dir / "evaluated", fingerprint(key, searcher, batch, options.seed, STORE_FORMAT), options.resume)
    store = ray.remote(ResultStore).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
    ).remote(str(out_dir / "evaluated"), options.resume, limit_gib, capacity_gib)
    trainable = tune.with_resources(tune.with_parameters(_trial, space_ref=[ray.put(space)], pool=pool, store=store),
                                    {"cpu": 0.25})
    callbacks = [_Progress(on_batch)] if on_batch else []
    run_config = tune.RunConfig(name=EXPERIMENT, storage_path=str(storage), verbose=0, callbacks=callbacks,
                                failure_config=tune.FailureConfig(max_failures=2, fail_fast=False))  # a lost node: retry the batch
    started = time.perf_counter()
    done = {p.stem for p in (out_dir / "evaluated").glob("*.pkl")} if options.resume else set()
    param_space = _param_space(space, searcher, options, done)
    grid = None
    if param_space is not None:  # None: a resumed search with nothing left to evaluate
        tuner = tune.Tuner(trainable, param_space=param_space, tune_config=_tune_config(space, searcher, options),
                           run_config=run_config)
        with _quiet_tune():
            grid = tuner.fit()
    elapsed, ended = time.perf_counter() - started, time.time()
    batches, (predicted, predict_s), first_call = ray.get(store.all.remote())
    # The Tune run less its one-off start (the first trial's process boots Ray and imports Tune: ~1 s).
    running = ended - first_call if first_call is not None else None
    result = _collect(batches, plans, limit_gib, capacity_gib)
    ray.kill(store)
    errors = [str(e).splitlines()[0] for e in grid.errors] if grid is not None and grid.num_errors else []
    evaluated = len(result.plans) + len(result.failed)
    result.stats.update({
        "searcher": searcher, "valid_plans": len(plans), "evaluated_plans": evaluated,
        "feasible_plans": int((~result.infeasible).sum()), "complete": evaluated == len(plans),
        "trials": len(grid) if grid is not None else 0, "trials_failed": len(errors), "trial_errors": errors[:5],
        "batches_reused": len(done),
        "batch_size": batch if searcher == "exhaustive" else None, "groups": len(space.groups),
        "group_axes": list(GROUP_AXES), "budget_s": options.budget_s, "search_s": round(elapsed, 3),
        # plans/s over the whole Tune run (its start included), once the first trial runs, and while
        # trials were predicting.
        "plans_per_s": round(evaluated / elapsed, 1) if elapsed > 0 else None,
        "running_s": round(running, 3) if running is not None else None,
        "plans_per_s_running": round(evaluated / running, 1) if running else None,
        "predict_s": round(predict_s, 3),
        "plans_per_s_predicting": round(predicted / predict_s, 1) if predict_s else None,
        "resumed": options.resume, "headroom": options.headroom, "memory_limit_gib": round(limit_gib, 3),
        "tune_experiment": str(experiment),
    })
    return result


def _param_space(space: TuneSpace, searcher: str, options: SearchOptions, done: set[str]) -> dict[str, Any] | None:
    """Tune's param_space; for a grid, only the batches not in `done` (stored by the run being resumed),
    None when none is left."""
    if searcher == "optuna":
        return {}  # the define-by-run function (space.suggest) is the space
    grid = space.grid(searcher, options.seed)
    axis, values = next(iter(grid.items()))
    if searcher == "random" and options.max_trials:
        values = values[: options.max_trials]
    values = [v for v in values if space.key({axis: v}) not in done]
    return {axis: tune.grid_search(values)} if values else None


def _tune_config(space: TuneSpace, searcher: str, options: SearchOptions) -> tune.TuneConfig:
    common = dict(metric="score", mode="min", reuse_actors=True, time_budget_s=options.budget_s,
                  max_concurrent_trials=options.concurrency)
    if searcher != "optuna":
        return tune.TuneConfig(num_samples=1, **common)
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    algo = OptunaSearch(space=space.suggest, metric="score", mode="min",
                        sampler=optuna.samplers.TPESampler(seed=options.seed, n_startup_trials=16))
    trials = options.max_trials or min(len(space.groups), 256)
    return tune.TuneConfig(search_alg=algo, num_samples=trials, **common)


def _collect(batches: dict[str, Batch], plans: list[Plan], limit_gib: float, capacity_gib: float) -> SearchResult:
    """Stored answers (by index into the search's valid plans) as one result, each plan once (Optuna may revisit a
    group), in the order stored."""
    stored = list(batches.values())
    if not stored:
        return SearchResult([], PredictionTable.from_predictions([]), limit_gib, capacity_gib)
    members = np.concatenate([m for m, _ in stored])
    offsets = np.cumsum([0] + [len(m) for m, _ in stored])  # of each batch in `members`
    predicted = np.zeros(len(members), dtype=bool)
    for o, (_, answers) in zip(offsets, stored):
        predicted[o + answers.rows] = True
    first = np.zeros(len(members), dtype=bool)
    first[np.unique(members, return_index=True)[1]] = True
    table = join_tables([a.table for _, a in stored])
    keep = first[predicted]  # of the table's rows
    if not keep.all():
        table = table.take(np.flatnonzero(keep))
    index = members[predicted & first].tolist()
    failed = [(plans[int(members[o + i])], error) for o, (_, a) in zip(offsets, stored) for i, error in a.errors.items()
              if first[o + i]]
    return SearchResult([plans[i] for i in index], table, limit_gib, capacity_gib, failed)
