"""Revalidation rounds: re-measure stored predictions on the live cluster and watch the error drift.

A round samples N stored predictions of this cluster's device (recent, most used, random;
see `History.sample`), runs them for real with `orchestrator.validation.trials`, and writes every
outcome as one all-or-nothing round to the history database. The rolling error per device
fingerprint and model family then says whether the predictor still describes this cluster:
past the threshold the round raises an alert (the CLI exits non-zero, so cron and
`ray job` notice).
"""

from __future__ import annotations

import random
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.revalidation.history import History, MeasurementRow, StoredPrediction
from orchestrator.validation.jobs import ValidationJob, ValidationResult
from orchestrator.validation.report_section import short_plan
from orchestrator.validation.rows import append_to_dataset
from orchestrator.validation.trials import validate
from predictor.data.dataset import device_fingerprint

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_every(text: str) -> float:
    """'6h', '30m', '90s', '1d' (or a bare number of seconds) → seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"--every must be a positive duration like 6h, 30m or 90s, got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


@dataclass
class Drift:
    device: str
    family: str
    error: float  # rolling mean |relative time error|
    rows: int


@dataclass
class RoundReport:
    """What one revalidation round did and found."""

    round_id: int | None
    results: list[tuple[StoredPrediction, ValidationResult]]
    rolling: dict[tuple[str, str], tuple[float, int]]
    alerts: list[Drift] = field(default_factory=list)

    @property
    def drifted(self) -> bool:
        return bool(self.alerts)


def _row(p: StoredPrediction, r: ValidationResult, fingerprint: str) -> MeasurementRow:
    measured_mem = max(r.peak_memory_gib) if r.peak_memory_gib else None
    # ranks that time-shared CPU cores are compared with the prediction for the run as it ran (r.detail says so)
    return MeasurementRow(
        p.id, p.plan, p.family, fingerprint, p.predictor_version, p.predicted_time_s * max(1.0, r.core_sharing),
        p.predicted_memory_gib,
        r.measured_time_s if r.status == "ok" else None, measured_mem, r.status, r.detail,
    )


def run_round(
    history: History,
    sample: int,
    device: str,
    threshold: float = 0.1,
    window: int = 20,
    rng: random.Random | None = None,
    job_options: dict[str, Any] | None = None,
    dataset_dir: str | None = None,
) -> RoundReport:
    """One round: sample, re-measure on the connected Ray cluster, record, compute drift.

    With `dataset_dir` the runs are also appended to that profile dataset (for `scaledl train`).
    """
    started = time.time()
    chosen = history.sample(sample, rng, device=device)
    if not chosen:
        return RoundReport(None, [], history.rolling_error(window))
    options = job_options or {}
    jobs = [ValidationJob(p.spec, p.plan, p.predicted_time_s, p.predicted_memory_gib, **options) for p in chosen]
    results = validate(jobs)
    if dataset_dir:
        append_to_dataset(dataset_dir, jobs, results)
    fingerprint = device_fingerprint("cuda" if device != "cpu" else "cpu")
    versions = sorted({p.predictor_version for p in chosen})
    round_id = history.record_round([_row(p, r, fingerprint) for p, r in zip(chosen, results)], fingerprint,
                                    ",".join(versions), started)
    rolling = history.rolling_error(window)
    return RoundReport(round_id, list(zip(chosen, results)), rolling, drift_alerts(rolling, fingerprint, threshold))


def drift_alerts(rolling: dict[tuple[str, str], tuple[float, int]], fingerprint: str, threshold: float) -> list[Drift]:
    """The (device, family) rolling errors above `threshold` on this cluster's device: other devices' drift is
    reported by the rounds that run there."""
    return [Drift(dev, fam, err, n) for (dev, fam), (err, n) in sorted(rolling.items())
            if dev == fingerprint and err > threshold]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def print_round(report: RoundReport, threshold: float) -> None:
    """The round's runs and the rolling error as rich tables; drift alerts on stderr."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if report.round_id is None:
        console.print("no stored predictions for this device: nothing to revalidate")
    else:
        table = Table(title=f"revalidation round {report.round_id}")
        for col in ("plan", "family", "predicted s", "measured s", "error", "status"):
            table.add_column(col)
        for p, r in report.results:
            table.add_row(short_plan(p.plan), p.family, f"{p.predicted_time_s:.4g}",
                          "-" if r.measured_time_s is None else f"{r.measured_time_s:.4g}",
                          _pct(r.time_error), r.status if r.status == "ok" else f"{r.status}: {r.detail[:60]}")
        console.print(table)
    rolling = Table(title=f"rolling mean |error| (alert above {100 * threshold:.0f}%)")
    for col in ("device", "family", "rows", "mean |error|"):
        rolling.add_column(col)
    for (device, family), (err, n) in sorted(report.rolling.items()):
        rolling.add_row(device, family, str(n), f"{100 * err:.1f}%")
    console.print(rolling)
    for a in report.alerts:
        print(f"DRIFT ALERT: {a.family} on {a.device}: rolling mean |error| {100 * a.error:.1f}% over {a.rows} runs "
              f"passes the {100 * threshold:.0f}% threshold; retrain the predictor (scaledl revalidate --retrain --dataset DIR)",
              file=sys.stderr)

