"""Where a search's answers go: one actor on the driver's node that keeps each trial's batch and writes it
to `OUT/evaluated/` atomically, so the search is anytime and resumable.

Kept apart from `orchestrator.search` so the store's worker process does not import Ray Tune.
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any

from orchestrator.replicas import Answer
from predictor.prediction import Prediction


class SearchError(RuntimeError):
    """A search that cannot start or continue; the message says what to change."""


def infeasibility(pred: Prediction, limit_gib: float, capacity_gib: float) -> str | None:
    """Why `pred` cannot run on a device of `capacity_gib` keeping `limit_gib` usable, or None."""
    if pred.peak_memory_gib > limit_gib:
        return (f"predicted peak memory {pred.peak_memory_gib:.1f} GiB exceeds {limit_gib:.1f} GiB "
                f"({capacity_gib:.1f} GiB device less headroom)")
    return None


class ResultStore:
    """Collects each trial's answers on the driver's node and persists them, one atomic file per batch."""

    def __init__(self, directory: str, resume: bool, limit_gib: float, capacity_gib: float) -> None:
        self.dir = Path(directory)
        self.limit_gib, self.capacity_gib = limit_gib, capacity_gib
        self.batches: dict[str, tuple[list[int], list[Answer]]] = {}  # by indices into the search's valid plans
        self.summaries: dict[str, dict[str, Any]] = {}
        self.predicted = (0, 0.0)  # plans predicted in this run, and the time trials waited for them
        self.first_call: float | None = None  # when (time.time) the first trial asked: its process was up
        for path in sorted(self.dir.glob("*.pkl")) if resume else ():
            self.batches[path.stem] = pickle.loads(path.read_bytes())
            self.summaries[path.stem] = self._summary(*self.batches[path.stem])

    def summary(self, key: str) -> dict[str, Any] | None:
        """The stored batch's summary, or None; every trial asks this first."""
        if self.first_call is None:
            self.first_call = time.time()
        return self.summaries.get(key)

    def add(self, key: str, plans: list[int], answers: list[Answer], seconds: float) -> dict[str, Any]:
        self.predicted = (self.predicted[0] + len(plans), self.predicted[1] + seconds)
        _atomic_write(self.dir / f"{key}.pkl", pickle.dumps((plans, answers)))
        self.batches[key] = (plans, answers)
        self.summaries[key] = self._summary(plans, answers)
        return self.summaries[key]

    def all(self) -> tuple[dict[str, tuple[list[int], list[Answer]]], tuple[int, float], float | None]:
        return self.batches, self.predicted, self.first_call

    def _summary(self, plans: list[int], answers: list[Answer]) -> dict[str, Any]:
        """The trial's metric: best feasible time; without one, a penalty growing with the memory overflow."""
        preds = [a for a in answers if isinstance(a, Prediction)]
        feasible = [p.iter_time_s for p in preds if infeasibility(p, self.limit_gib, self.capacity_gib) is None]
        if feasible:
            score = min(feasible)
        elif preds:
            score = 1e6 * min(p.peak_memory_gib for p in preds) / self.limit_gib
        else:
            score = 1e12
        return {"score": score, "plans": len(plans), "feasible": len(feasible), "errors": len(answers) - len(preds)}


def prepare_store(directory: Path, fingerprint: str, resume: bool) -> None:
    """A fresh store directory stamped with the search's fingerprint, or (resume) check it is the same search."""
    stamp = directory / "FINGERPRINT"
    if resume:
        if not stamp.exists() or stamp.read_text() != fingerprint:
            raise SearchError(f"{directory} holds no stored batches of this search (another spec, space, predictor "
                              "or searcher); run without --resume")
        return
    directory.mkdir(parents=True, exist_ok=True)
    for path in directory.glob("*.pkl"):
        path.unlink()
    _atomic_write(stamp, fingerprint.encode())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


