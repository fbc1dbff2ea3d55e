"""Where a search's answers go: one actor on the driver's node that keeps each trial's batch and writes it
to `OUT/evaluated/` atomically, so the search is anytime and resumable.

Kept apart from `orchestrator.search.run` and `orchestrator.search.tune` so the store's worker process imports
neither; a search without Tune keeps its store in the driver (the same class, not an actor).
"""

from __future__ import annotations

import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.search.replica import Answers

# A stored batch: the indices (into the search's valid plans) of the plans it holds, in batch order, and their answers.
Batch = tuple[np.ndarray, Answers]
# A failing batch is tried this many more times before it is recorded as failed, with Tune or without.
RETRIES = 2


@dataclass
class Outcome:
    """What one search run left: the store's batches by key, the plans it predicted and the seconds spent waiting for
    them, when the first batch asked the store (time.time; None if none did) and when the run ended, the trials
    (batches) it ran, the first lines of the errors of those that failed, and Tune's experiment directory (None
    without Tune)."""

    batches: dict[str, Batch]
    predicted: tuple[int, float]
    first_call: float | None
    ended: float
    trials: int
    errors: list[str]
    experiment: str | None


class SearchError(RuntimeError):
    """A search that cannot start or continue; the message says what to change."""


class ResultStore:
    """Collects each trial's answers on the driver's node and persists them, one atomic file per batch."""

    def __init__(self, directory: str, resume: bool, limit_gib: float, capacity_gib: float) -> None:
        self.dir = Path(directory)
        self.limit_gib, self.capacity_gib = limit_gib, capacity_gib
        self.batches: dict[str, Batch] = {}
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

    def add(self, key: str, members: np.ndarray, answers: Answers, seconds: float) -> dict[str, Any]:
        """Keep and persist (one atomic file) a trial's batch: `members`, the indices of its plans in the search's
        valid plans, and their answers, predicted in `seconds`; its summary."""
        self.predicted = (self.predicted[0] + len(members), self.predicted[1] + seconds)
        _atomic_write(self.dir / f"{key}.pkl", pickle.dumps((members, answers), protocol=pickle.HIGHEST_PROTOCOL))
        self.batches[key] = (members, answers)
        self.summaries[key] = self._summary(members, answers)
        return self.summaries[key]

    def all(self) -> tuple[dict[str, Batch], tuple[int, float], float | None]:
        return self.batches, self.predicted, self.first_call

    def _summary(self, members: np.ndarray, answers: Answers) -> dict[str, Any]:
        """The trial's metric: best feasible time; without one, a penalty growing with the memory overflow."""
        peak = answers.table.peak_memory_gib
        feasible = ~(peak > self.limit_gib)
        if feasible.any():
            score = float(answers.table.iter_time_s[feasible].min())
        elif len(peak):
            score = 1e6 * float(peak.min()) / self.limit_gib
        else:
            score = 1e12
        return {"score": score, "plans": len(members), "feasible": int(feasible.sum()), "errors": len(answers.errors)}


# The stamp of what a search is before its plans are enumerated (workload, space, predictor, sizes, seed), which
# `check_resumable` reads before Ray starts; FINGERPRINT adds what the enumeration decides (searcher, batch size).
SEARCH_STAMP = "SEARCH"


def check_resumable(directory: Path, search: str) -> None:
    """Refuse, before anything starts, to resume from a folder holding no search or another search than `search`."""
    if not (directory / "FINGERPRINT").is_file():
        raise SearchError(f"nothing to resume in {directory.parent}: it holds no stored search; run without --resume")
    own = directory / SEARCH_STAMP
    if own.is_file() and own.read_text() != search:
        raise SearchError(f"{directory.parent} holds another search (another spec, space, predictor, cluster sizes "
                          f"or seed); run without --resume, or resume with that search's options")


def prepare_store(directory: Path, fingerprint: str, resume: bool, search: str) -> None:
    """A fresh store directory stamped with the search's fingerprint and `search` stamp, or (resume) check it is the
    same search."""
    stamp = directory / "FINGERPRINT"
    if resume:
        if not stamp.exists() or stamp.read_text() != fingerprint:
            raise SearchError(f"{directory} holds no stored batches of this search (another spec, space, predictor "
                              "or searcher); run without --resume")
        return
    directory.mkdir(parents=True, exist_ok=True)
    for path in directory.glob("*.pkl"):
        path.unlink()
    _atomic_write(directory / SEARCH_STAMP, search.encode())
    _atomic_write(stamp, fingerprint.encode())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


