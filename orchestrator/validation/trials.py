"""Validate predicted plans by real short training runs on Ray: the Ray Tune driver, one trial per plan.

A plan runs as one Ray actor per rank, gathered in a placement group shaped by the plan
(`orchestrator.validation.placement`). The actors rendezvous on rank 0's address and run the composed
runner of `predictor.measure.compose` (the same per-rank body `scaledl profile` uses), so a validation
measures exactly the plan that was predicted, and a plan the runner cannot run exactly is refused with
the reason (`orchestrator.validation.measurable`).

Each validation is one Ray Tune trial whose resources are that placement group, so several plans run
side by side when the cluster has room and queue when it does not. Failures are results
(`orchestrator.validation.run`), and a plan the cluster can never hold is an `error` without being launched.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

import ray
from ray import tune

from orchestrator.ray_cluster.connect import cluster_nodes, connect_ray
from orchestrator.validation.jobs import ValidationJob, ValidationResult
from orchestrator.validation.measurable import plan_problem
from orchestrator.validation.placement import placement_strategy, rank_bundles, shared_cpus, unplaceable
from orchestrator.validation.report_section import interval_note, winner_note
from orchestrator.validation.rows import append_to_dataset
from orchestrator.validation.run import on_gpu, run_job, tail
from predictor.plan import Plan

if TYPE_CHECKING:
    from orchestrator.report import Report


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
    jobs = list(jobs)  # each with the CPUs its ranks get on this cluster
    results: dict[int, ValidationResult] = {}
    factories: dict[int, tune.PlacementGroupFactory] = {}
    placement: dict[int, tuple[str, str]] = {}
    for i, job in enumerate(jobs):
        why = plan_problem(job)
        if not why:
            plan = Plan.parse(job.plan)
            job = jobs[i] = replace(job, cpus_per_rank=shared_cpus(plan.gpus, job.cpus_per_rank, nodes))
            bundles = rank_bundles(plan, job.cpus_per_rank, on_gpu(job))
            placement[i] = placement_strategy(plan, bundles[0], nodes)
            why = unplaceable(bundles, nodes)
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
                                              predicted_memory_gib=job.predicted_memory_gib, detail=tail(str(res.error)))
                continue
            results[i] = ValidationResult.from_dict(json.loads(res.metrics["result"]))
    return results


# --- `scaledl plan --validate K` ----------------------------------------------------------------


def validate_top(report: "Report", k: int, steps: int = 3, warmup: int = 2, timeout_s: float = 300.0,
                 dataset_dir: str | None = None) -> dict[str, Any]:
    """Run the report's K best plans for real; the report's `validation` section (`report_section` renders it)."""
    # The ranking's head: the plans the predictor cannot tell from the winner (its interval) come first. Each
    # runs on its own cluster size (`scaledl plan --nodes`).
    spec = report.spec.model_dump(mode="json", exclude_none=True)
    jobs = [ValidationJob({**spec, "cluster": {**spec["cluster"], "nodes": r.costs.nodes}}, str(r.plan), r.iter_time_s,
                          r.peak_memory_gib, warmup, steps, timeout_s)
            for r in report.ranked[:k]]
    results = validate(jobs)
    if dataset_dir:
        append_to_dataset(dataset_dir, jobs, results)
    plans = []
    for r in results:
        data = r.to_dict()
        data.pop("dataset_row")
        plans.append(data)
    note = "; ".join(filter(None, (winner_note(results), interval_note(results, report.interval))))
    return {"k": k, "steps": steps, "warmup": warmup, "plans": plans, "note": note}

