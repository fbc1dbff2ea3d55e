"""Validation runs as profile-dataset rows (predictor.data.dataset 'iterations' schema)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from orchestrator.validation.jobs import ValidationJob, ValidationResult
from orchestrator.validation.run import on_gpu, profile_config
from predictor.data import dataset
from predictor.data.collect import config_row
from predictor.data.dataset import provenance
from predictor.spec.workload import parse_spec


def dataset_rows(jobs: Sequence[ValidationJob], results: Sequence[ValidationResult]) -> list[dict[str, Any]]:
    """Profile-dataset rows (predictor.data.dataset 'iterations' schema) of the runs that got to train.

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
            **config_row(profile_config(job, spec)),
            "design": "validate", **measured,
            **provenance("cuda" if on_gpu(job) else "cpu", max(1, int(job.cpus_per_rank))),
        })
    return rows


def append_to_dataset(root: str | Path, jobs: Sequence[ValidationJob], results: Sequence[ValidationResult]) -> Path | None:
    """Append the validation runs to the profile dataset at `root` (one atomic part file)."""
    return dataset.append(root, "iterations", dataset_rows(jobs, results))
