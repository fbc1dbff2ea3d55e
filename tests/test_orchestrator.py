"""The Ray search on an embedded local Ray: right answer, replica crash, failing trials, budgets, resume, memory;
each of those both as a Ray Tune run and as the small exhaustive search that sends its batches to the replicas."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from orchestrator.search.ray_replicas import ReplicaPool  # noqa: E402
from orchestrator.search.run import run_search  # noqa: E402
from orchestrator.search.types import SearchOptions  # noqa: E402
from predictor.models.analytical import AnalyticalPredictor  # noqa: E402
from search_spaces import enumerate_plans, load_space  # noqa: E402
from tests.gpt3_search import CAPACITY, GRAPH, PLANS, SPEC, best_direct, best_found  # noqa: E402

# The two ways an exhaustive search runs: PLANS is small, so by default without Tune; a direct_limit of 0 makes it Tune.
RUNNERS = {"tune": {"direct_limit": 0}, "direct": {}}
runner = pytest.mark.parametrize("runner", list(RUNNERS))


@pytest.fixture(scope="module")
def pool():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    p = ReplicaPool.start("analytical", SPEC, GRAPH, count=2)
    p.ready()
    yield p
    ray.shutdown()


@runner
def test_exhaustive_search_finds_the_direct_answer(pool, tmp_path, runner) -> None:
    batches = []
    result = run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(batch_size=300, **RUNNERS[runner]), key="t",
                        on_batch=lambda n, best: batches.append(n))
    assert result.stats["searcher"] == "exhaustive" and result.stats["complete"]
    assert result.stats["tune"] == (runner == "tune") and (result.stats["tune_experiment"] is not None) == result.stats["tune"]
    assert sorted(str(e.plan) for e in result.evaluated) == sorted(map(str, PLANS))
    assert best_found(result) == best_direct()
    assert sum(batches) == len(PLANS)  # the progress callback saw every batch
    assert all(not i["gpu_ids"] for i in pool.ready())  # no GPU in this cluster: the replicas run on CPUs
    assert len(list((tmp_path / "evaluated").glob("*.pkl"))) == result.stats["trials"] == -(-len(PLANS) // 300)
    if runner == "tune":  # the running time excludes the trial process's start, so it is shorter and its rate higher
        assert 0 < result.stats["running_s"] < result.stats["search_s"]
        assert result.stats["plans_per_s_running"] > result.stats["plans_per_s"]


def test_an_exhaustive_search_of_any_size_runs_without_tune() -> None:
    from orchestrator.search.run import uses_tune
    from orchestrator.search.types import EXHAUSTIVE_LIMIT

    assert not uses_tune("exhaustive", EXHAUSTIVE_LIMIT, SearchOptions())  # a million plans too: its batches are fixed
    assert uses_tune("optuna", 10, SearchOptions()) and uses_tune("random", 10, SearchOptions())


def test_tune_and_direct_searches_give_the_same_answers(pool, tmp_path) -> None:
    """The same plans, predictions and files either way: which runs the batches is no part of the answer."""
    results = {name: run_search(PLANS, pool, tmp_path / name, CAPACITY, SearchOptions(batch_size=500, **options),
                                key="same") for name, options in RUNNERS.items()}
    rows = {name: sorted((str(e.plan), e.prediction, e.infeasible) for e in r.evaluated) for name, r in results.items()}
    assert rows["tune"] == rows["direct"] and len(rows["tune"]) == len(PLANS)
    files = {name: sorted(p.name for p in (tmp_path / name / "evaluated").iterdir()) for name in RUNNERS}
    assert files["tune"] == files["direct"]


def test_memory_infeasible_plans_are_kept_with_the_reason_never_ranked(pool, tmp_path) -> None:
    result = run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(headroom=0.5, batch_size=700), key="m")
    limit = CAPACITY * 0.5
    infeasible = [e for e in result.evaluated if e.infeasible]
    assert infeasible and all(e.prediction.peak_memory_gib > limit for e in infeasible)
    assert all("exceeds 20.0 GiB" in e.infeasible for e in infeasible)
    assert all(e.prediction.peak_memory_gib <= limit for e in result.evaluated if e.feasible)
    assert best_found(result) == best_direct(headroom=0.5)


@runner
def test_killing_a_replica_mid_search_keeps_the_answer(pool, tmp_path, runner) -> None:
    before = {i["pid"] for i in pool.ready()}
    killed = []

    def kill_once(n: int, best: float) -> None:
        if not killed:  # after the first batch: crash a replica; Ray restarts it and retries its calls
            ray.kill(pool.replicas[0], no_restart=False)
            killed.append(True)

    result = run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(batch_size=100, concurrency=2, **RUNNERS[runner]),
                        key="k", on_batch=kill_once)
    assert killed and result.stats["complete"] and result.stats["trials_failed"] == 0
    assert best_found(result) == best_direct()
    after = {i["pid"] for i in pool.ready()}
    assert after != before  # the killed replica runs again, in a new process


@runner
def test_a_failing_trial_is_recorded_not_fatal(pool, tmp_path, runner) -> None:
    broken = ReplicaPool.start("analytical", SPEC, GRAPH, count=1, max_restarts=0)
    broken.ready()
    ray.kill(broken.replicas[0], no_restart=True)
    result = run_search(PLANS, broken, tmp_path, CAPACITY, SearchOptions(batch_size=len(PLANS), **RUNNERS[runner]),
                        key="f")
    assert result.stats["trials_failed"] == result.stats["trials"] > 0
    assert result.evaluated == [] and result.stats["trial_errors"]


@pytest.mark.parametrize("searcher", ["optuna", "random"])
def test_sampling_searchers_stay_in_budget_and_valid(pool, tmp_path, searcher) -> None:
    result = run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(searcher=searcher, max_trials=12), key=searcher)
    assert result.stats["searcher"] == searcher and result.stats["tune"]
    assert 0 < result.stats["trials"] <= 12
    valid = set(map(str, PLANS))
    assert result.evaluated and all(str(e.plan) in valid for e in result.evaluated)
    assert not result.stats["complete"]


@runner
def test_budget_stops_early_with_what_was_found_and_resume_completes(pool, tmp_path, runner) -> None:
    options = {"batch_size": 20, "concurrency": 1, **RUNNERS[runner]}
    # Each batch stored takes 0.1 s here too (the progress callback), so the budget ends the search.
    result = run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(budget_s=0.5, **options), key="b",
                        on_batch=lambda n, best: time.sleep(0.1))
    assert not result.stats["complete"] and result.stats["trials"] < len(PLANS) / 20
    assert all(e.prediction is not None for e in result.evaluated)
    resumed = run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(resume=True, **options), key="b")
    assert resumed.stats["complete"] and resumed.stats["batches_reused"] == len(result.evaluated) // 20
    assert resumed.stats["trials"] == -(-len(PLANS) // 20) - resumed.stats["batches_reused"]
    assert best_found(resumed) == best_direct()
    again = run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(resume=True, **options), key="b")
    assert again.stats["complete"] and again.stats["trials"] == 0  # nothing left: no batch runs at all


@runner
def test_ctrl_c_keeps_what_was_found_and_resume_completes(pool, tmp_path, runner) -> None:
    def interrupt_once(n: int, best: float) -> None:
        if not interrupted:
            interrupted.append(n)
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does: the search stops, keeping what it stored

    interrupted: list[int] = []
    options = {"batch_size": 100, "concurrency": 1, **RUNNERS[runner]}
    before = signal.getsignal(signal.SIGINT)
    first = run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(**options), key="r", on_batch=interrupt_once)
    assert interrupted and 0 < len(first.evaluated) < len(PLANS) and not first.stats["complete"]
    if runner == "direct":  # its own handler is gone again (Tune leaves its own installed)
        assert signal.getsignal(signal.SIGINT) is before
    resumed = run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(resume=True, **options), key="r")
    assert resumed.stats["resumed"] and resumed.stats["complete"]
    assert best_found(resumed) == best_direct()


def test_sigterm_during_a_direct_search_is_not_taken_for_ctrl_c(pool, tmp_path) -> None:
    """Under lifecycle.terminating a SIGTERM raises KeyboardInterrupt too; the search lets it end the command."""
    from orchestrator.ray_cluster.lifecycle import Terminated, terminating

    def terminate(n: int, best: float) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Terminated), terminating():
        run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(batch_size=100), key="s", on_batch=terminate)


def test_resume_refuses_another_search(pool, tmp_path) -> None:
    from orchestrator.search.run import SearchError

    run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(batch_size=700), key="one")
    with pytest.raises(SearchError, match="another spec"):
        run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(batch_size=700, resume=True), key="two")


def test_nothing_to_resume_is_a_clear_error(pool, tmp_path) -> None:
    from orchestrator.search.run import SearchError

    with pytest.raises(SearchError, match="nothing to resume"):
        run_search(PLANS, pool, Path(tmp_path) / "empty", CAPACITY, SearchOptions(resume=True), key="x")


class _FailsOnMbs2(AnalyticalPredictor):
    """Fails any batch holding a plan with mbs=2, so the replica must isolate those plans."""

    def predict_table(self, spec, graph, plans):  # noqa: ANN001, ANN201 - the Predictor signature
        if any(p.mbs == 2 for p in plans):
            raise RuntimeError("mbs=2 is broken")
        return super().predict_table(spec, graph, plans)


def test_a_failing_plan_costs_only_its_own_answer_and_answers_stay_in_order() -> None:
    """No Ray: a replica's answer is a table of the plans predicted plus an error for each other, in batch order,
    across cluster sizes; the search result keeps the first answer of each plan."""
    from orchestrator.planning import sized_spec
    from orchestrator.search.replica import Answers, Replica
    from orchestrator.search.run import _collect

    big = sized_spec(SPEC, 4)
    plans = [p for pair in zip(PLANS[:40], enumerate_plans(big, load_space("megatron-3d")).plans[:40]) for p in pair]
    answers = Replica(_FailsOnMbs2(), SPEC, GRAPH, sizes=[big]).predict(plans)
    bad = [i for i, p in enumerate(plans) if p.mbs == 2]
    assert bad and sorted(answers.errors) == bad and all("mbs=2 is broken" in e for e in answers.errors.values())
    assert answers.rows.tolist() == [i for i in range(len(plans)) if i not in bad]
    direct = {str(p): pred for p, pred in zip(PLANS, AnalyticalPredictor().predict(SPEC, GRAPH, PLANS))}
    assert all(pred == direct[str(plans[i])] for i, pred in zip(answers.rows.tolist(), answers.table.rows())
               if plans[i].gpus == SPEC.cluster.gpus)
    head = answers.rows < 10  # the same first ten plans again (Optuna revisiting them): their first answers are kept
    again = Answers(answers.table.take(np.flatnonzero(head)), answers.rows[head], {i: e for i, e in answers.errors.items() if i < 10})
    batches = {"b": (np.arange(len(plans)), answers), "again": (np.arange(10), again)}
    result = _collect(batches, plans, 1e9, 1e9)
    assert [str(p) for p in result.plans] == [str(plans[i]) for i in answers.rows.tolist()]
    assert [str(p) for p, _ in result.failed] == [str(plans[i]) for i in bad]
    assert len(result.table) == len(result.plans) and result.evaluated[0].prediction == answers.table.row(0)
