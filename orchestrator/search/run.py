"""The plan search: batches of valid plans evaluated by the predictor replicas, as Ray Tune trials or, for a small
exhaustive search, sent to the replicas straight from here.

A batch, never one plan, is the unit (Tune runs ~30 trials/s at best): exhaustive, a chunk of the valid plans;
random, a group; Optuna TPE, a group chosen by a conditional tree (see `search_spaces.tune_space`). Each batch's
answers go to a `ResultStore`, which writes it to `OUT/evaluated/` atomically; so the search is anytime (a budget
or Ctrl-C stops it, what was evaluated is kept), and a failing batch costs only itself (retried twice, then
recorded as errored). An exhaustive search's batches are fixed in advance, so nothing in it needs
a searcher: they go to the replicas from the driver, which keeps the store, and Tune (a trial process booting Ray
and importing Tune, seconds on two cores, and a result row per trial) is not imported. The sampling searchers run
Tune (`orchestrator.search.tune`).

`--resume` continues from the stored batches, after Ctrl-C, a crash or a spent budget alike: a new
run over what is left (exhaustive and random: the batches not stored yet; Optuna: the same
seeded TPE, whose trials on stored groups answer from the store at once, so it replays its history
and goes on). Not `Tuner.restore`: Tune counts a run stopped by its budget as finished, so restoring
it continues nothing, and a restored run keeps the old budget.
Plans predicted above the device memory, less a headroom, are kept as infeasible with the reason. The options and the
result are plain data (`orchestrator.search.types`).
"""

from __future__ import annotations

import hashlib
import math
import signal
import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, Union

import numpy as np

from orchestrator.search.replica import Answers, LocalPool, Sent, join_tables
from orchestrator.search.types import SEARCHERS, SearchOptions, SearchResult
from orchestrator.search.store import (RETRIES, Batch, Outcome, ResultStore, SearchError, check_resumable,
                               prepare_store)
from predictor.costs.prediction_table import PredictionTable
from predictor.plan import Plan
from search_spaces import GROUP_AXES, TuneSpace
from search_spaces.plan_list import PlanList

if TYPE_CHECKING:
    from orchestrator.search.ray_replicas import ReplicaPool

# The replicas a search sends its batches to: Ray actors, or one replica in this process (a small search).
Pool = Union["ReplicaPool", LocalPool]

MAX_BATCH = 131_072
STORE_FORMAT = "plan-indices-table-2"  # stored batches: plans by their index in the enumeration, answers as columns (2: stage memories end to end)


def choose_searcher(requested: str, n_plans: int, limit: int) -> str:
    if requested not in SEARCHERS:
        raise SearchError(f"unknown searcher {requested!r}; use one of {', '.join(SEARCHERS)}")
    if requested == "auto":
        return "exhaustive" if n_plans <= limit else "optuna"
    return requested


def fingerprint(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def search_stamp(key: str, options: SearchOptions) -> str:
    """What a search is before its plans are enumerated: `key` (workload, space, predictor, sizes) and the seed."""
    return fingerprint(key, options.seed, STORE_FORMAT)


def check_resume(out_dir: Path, key: str, options: SearchOptions) -> None:
    """With --resume: `out_dir` holds this search's batches, checked before Ray starts (SearchError otherwise)."""
    if options.resume:
        check_resumable(out_dir.resolve() / "evaluated", search_stamp(key, options))


def uses_tune(searcher: str, n_plans: int, options: SearchOptions) -> bool:
    """Whether the search of `n_plans` by `searcher` (chosen) runs Ray Tune."""
    return searcher != "exhaustive" or n_plans > options.direct_limit


def run_search(plans: PlanList, pool: Pool, out_dir: Path, capacity_gib: float,
               options: SearchOptions, key: str, on_batch: Callable[[int, float], None] | None = None) -> SearchResult:
    """Search `plans` (all valid) through the replicas; returns every evaluated plan and the search statistics.

    `key` identifies the workload/space/predictor so `--resume` never mixes two searches.
    """
    if not plans:
        raise SearchError("the search space has no valid plan for this workload")
    plans = PlanList.of(plans)
    searcher = choose_searcher(options.searcher, len(plans), options.exhaustive_limit)
    # Few, large trials: Tune's per-trial cost (a result row, a trial directory, ~1 s on 2 cores) dwarfs
    # predicting thousands of plans; two rounds of trials keep a progress bar and a budget meaningful.
    batch = options.batch_size or min(MAX_BATCH, max(256, math.ceil(len(plans) / (2 * options.concurrency))))
    space = TuneSpace(plans, batch_size=batch)
    limit_gib = capacity_gib * (1 - options.headroom)
    out_dir = out_dir.resolve()
    check_resume(out_dir, key, options)
    prepare_store(out_dir / "evaluated", fingerprint(key, searcher, batch, options.seed, STORE_FORMAT), options.resume,
                  search_stamp(key, options))
    done = {p.stem for p in (out_dir / "evaluated").glob("*.pkl")} if options.resume else set()
    tuned = uses_tune(searcher, len(plans), options)
    started = time.perf_counter()
    if tuned:
        from orchestrator.search.tune import run_tune

        run = run_tune(space, searcher, pool, out_dir, limit_gib, capacity_gib, options, done, on_batch)
    else:
        store = ResultStore(str(out_dir / "evaluated"), options.resume, limit_gib, capacity_gib)
        run = _run_direct(space, pool, store, options, done, on_batch)
    elapsed = time.perf_counter() - started
    predicted, predict_s = run.predicted
    # The run less its one-off start (with Tune, the first trial's process boots Ray and imports Tune: ~1 s).
    running = run.ended - run.first_call if run.first_call is not None else None
    result = _collect(run.batches, plans, limit_gib, capacity_gib)
    evaluated = len(result.plans) + len(result.failed)
    result.stats.update({
        "searcher": searcher, "tune": tuned, "valid_plans": len(plans), "evaluated_plans": evaluated,
        "feasible_plans": int((~result.infeasible).sum()), "complete": evaluated == len(plans),
        "trials": run.trials, "trials_failed": len(run.errors), "trial_errors": run.errors[:5],
        "batches_reused": len(done),
        "batch_size": batch if searcher == "exhaustive" else None, "groups": len(space.groups) if searcher != "exhaustive" else None,
        "group_axes": list(GROUP_AXES), "budget_s": options.budget_s, "search_s": round(elapsed, 3),
        # plans/s over the whole run (its start included), once the first batch ran, and while waiting for
        # the replicas' answers.
        "plans_per_s": round(evaluated / elapsed, 1) if elapsed > 0 else None,
        "running_s": round(running, 3) if running is not None else None,
        "plans_per_s_running": round(evaluated / running, 1) if running else None,
        "predict_s": round(predict_s, 3),
        "plans_per_s_predicting": round(predicted / predict_s, 1) if predict_s else None,
        "resumed": options.resume, "headroom": options.headroom, "memory_limit_gib": round(limit_gib, 3),
        "tune_experiment": run.experiment,
    })
    return result


def _run_direct(space: TuneSpace, pool: Pool, store: ResultStore, options: SearchOptions, done: set[str],
                on_batch: Callable[[int, float], None] | None) -> Outcome:
    """The exhaustive batches of `space` not in `done`, sent to the replicas from here, `options.concurrency` + 1 in
    flight so the replicas predict the next batch while one is stored. Stops at the budget or a first Ctrl-C, as a
    Tune run does, keeping what was stored."""
    todo = deque(b for b in range(space.n_batches) if space.key({"batch": b}) not in done)
    deadline = time.monotonic() + options.budget_s if options.budget_s else math.inf
    flight: deque[tuple[int, list[int], Sent]] = deque()  # a batch: its index, its plans' indices, its chunks
    trials, errors = 0, []
    first_call = time.time() if todo else None
    with _ctrl_c_stops() as interrupted:
        try:
            while todo or flight:
                while todo and len(flight) <= options.concurrency:
                    b = todo.popleft()
                    members = space.batch(b)
                    flight.append((b, members, pool.submit(space.plans.take(members))))
                b, members, sent = flight.popleft()
                waited, left = time.perf_counter(), deadline - time.monotonic()
                if left <= 0 or not (left == math.inf or pool.arrive(sent, left)):
                    break  # the budget is spent; the batch in flight is left unstored, as Tune stops its trial
                trials += 1
                try:
                    answers = _answers(pool, sent, space.plans.take(members))
                except Exception as err:  # noqa: BLE001 - a failed batch is recorded, as Tune records a failed trial
                    errors.append(f"batch {b}: {type(err).__name__}: {err}".splitlines()[0])
                    continue
                summary = store.add(space.key({"batch": b}), np.asarray(members, dtype=np.int64), answers,
                                    time.perf_counter() - waited)
                if on_batch is not None:
                    on_batch(summary["plans"], summary["score"])
        except KeyboardInterrupt:
            if not interrupted:
                raise  # not a Ctrl-C: a SIGTERM (lifecycle.terminating) ends the command
    batches, predicted, _ = store.all()
    return Outcome(batches, predicted, first_call, time.time(), trials, errors, None)


def _answers(pool: Pool, sent: Sent, plans: PlanList) -> Answers:
    """The answers of the batch `plans`, sent as `sent`; a batch that fails is sent again, `RETRIES` times at most."""
    tries = RETRIES
    while True:
        try:
            return pool.gather(sent)
        except Exception:  # noqa: BLE001 - retried like a failed Tune trial; the last failure is raised
            if not tries:
                raise
            tries -= 1
            sent = pool.submit(plans)


@contextmanager
def _ctrl_c_stops() -> Iterator[list[int]]:
    """A first Ctrl-C (SIGINT) in the block ends the search, as it ends a Tune run: the handler notes it in the list
    the block gets and raises KeyboardInterrupt (the one exception Ray's blocking calls let through), so the block
    tells it from a SIGTERM's KeyboardInterrupt (lifecycle.terminating); a second Ctrl-C meets the previous handler.
    Main thread only, where signals are handled; without a Python SIGINT handler to come back to, none is set."""
    seen: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous) or threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        signal.signal(signal.SIGINT, previous)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _collect(batches: dict[str, Batch], plans: Sequence[Plan], limit_gib: float, capacity_gib: float) -> SearchResult:
    """Stored answers (by index into the search's valid plans) as one result, each plan once (Optuna may revisit a
    group), in the order stored."""
    plans = PlanList.of(plans)
    stored = list(batches.values())
    if not stored:
        return SearchResult(plans.take([]), PredictionTable.from_predictions([]), limit_gib, capacity_gib)
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
    index = members[predicted & first]
    failed = [(plans[int(members[o + i])], error) for o, (_, a) in zip(offsets, stored) for i, error in a.errors.items()
              if first[o + i]]
    return SearchResult(plans.take(index), table, limit_gib, capacity_gib, failed)
