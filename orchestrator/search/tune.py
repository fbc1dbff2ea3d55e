"""The plan search as a Ray Tune run: trials that each evaluate a batch of valid plans through the replicas.

Tune runs ~30 trials/s at best, so a trial is a batch (exhaustive: a chunk of the valid plans;
random: a group; Optuna TPE: a group chosen by a conditional tree, see `search_spaces.tune_space`),
never one plan. Trials hand their answers to a `ResultStore` actor on the driver's node, which
writes each batch to `OUT/evaluated/`; a failing trial costs only its batch (retried twice, then
recorded as errored). Imported only by a search that runs Tune (`import ray.tune` takes seconds).
"""

from __future__ import annotations

import logging
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import ray
from ray import tune
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.search.ray_replicas import ReplicaPool
from orchestrator.search.store import RETRIES, Outcome, ResultStore
from search_spaces import TuneSpace

if TYPE_CHECKING:
    from orchestrator.search.types import SearchOptions

EXPERIMENT = "search"

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
        answers = pool.predict(space.plans.take(members))
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


def run_tune(space: TuneSpace, searcher: str, pool: ReplicaPool, out_dir: Path, limit_gib: float, capacity_gib: float,
             options: "SearchOptions", done: set[str], on_batch: Callable[[int, float], None] | None) -> Outcome:
    """Evaluate the batches of `space` not in `done` (stored by the run being resumed) as Tune trials; the store's
    answers (`out_dir/evaluated/`, prepared by the caller) and the trials'."""
    # The store runs on this (the driver's) node, so its directory is this process's --out.
    store = ray.remote(ResultStore).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
    ).remote(str(out_dir / "evaluated"), options.resume, limit_gib, capacity_gib)
    trainable = tune.with_resources(tune.with_parameters(_trial, space_ref=[ray.put(space)], pool=pool, store=store),
                                    {"cpu": 0.25})
    callbacks = [_Progress(on_batch)] if on_batch else []
    storage = out_dir / "tune"
    run_config = tune.RunConfig(name=EXPERIMENT, storage_path=str(storage), verbose=0, callbacks=callbacks,
                                failure_config=tune.FailureConfig(max_failures=RETRIES, fail_fast=False))  # a lost node: retry the batch
    param_space = _param_space(space, searcher, options, done)
    grid = None
    if param_space is not None:  # None: a resumed search with nothing left to evaluate
        tuner = tune.Tuner(trainable, param_space=param_space, tune_config=_tune_config(space, searcher, options),
                           run_config=run_config)
        with _quiet_tune():
            grid = tuner.fit()
    ended = time.time()
    batches, predicted, first_call = ray.get(store.all.remote())
    ray.kill(store)
    errors = [str(e).splitlines()[0] for e in grid.errors] if grid is not None and grid.num_errors else []
    return Outcome(batches, predicted, first_call, ended, len(grid) if grid is not None else 0, errors,
                   str(storage / EXPERIMENT))


def _param_space(space: TuneSpace, searcher: str, options: "SearchOptions", done: set[str]) -> dict[str, Any] | None:
    """Tune's param_space; for a grid, only the batches not in `done`, None when none is left."""
    if searcher == "optuna":
        return {}  # the define-by-run function (space.suggest) is the space
    grid = space.grid(searcher, options.seed)
    axis, values = next(iter(grid.items()))
    if searcher == "random" and options.max_trials:
        values = values[: options.max_trials]
    values = [v for v in values if space.key({axis: v}) not in done]
    return {axis: tune.grid_search(values)} if values else None


def _tune_config(space: TuneSpace, searcher: str, options: "SearchOptions") -> tune.TuneConfig:
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
