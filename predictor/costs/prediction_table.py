"""Predictions of many plans as columns: what a search ranks, without one Python object per plan.

A search predicts hundreds of thousands of plans and keeps only a few; building a `Prediction` (five
dicts and a list) for each costs more than predicting it. A predictor that vectorises over plans fills
a `PredictionTable`; `row(i)` or `rows()` give the `Prediction`s where they are needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from predictor.costs.prediction import MEMORY_PARTS, TIME_PARTS, Prediction
from predictor.plan.axes import HIDDEN_KINDS



@dataclass
class PredictionTable:
    """Column arrays, one row per plan (P plans), each meaning what the `Prediction` field of its name means.

    stage_memory_gib, stage_offsets: every plan's per-stage peaks (`memory_per_stage_gib`) end to end, plan i's
        at stage_offsets[i]:stage_offsets[i + 1] (a table of 155k plans of pipelines up to 128 deep stays small).
    extra: per-plan columns of `Prediction.extra`: 1-D arrays (one number per plan), 2-D arrays named
        by `extra_names[key]` (a dict per plan), or lists (one value per plan; None leaves it out).
    shared_extra: entries of `Prediction.extra` every plan has alike.
    """

    iter_time_s: np.ndarray
    breakdown: np.ndarray  # (P, len(TIME_PARTS))
    peak_memory_gib: np.ndarray
    stage_memory_gib: np.ndarray
    stage_offsets: np.ndarray  # (P + 1,)
    memory_breakdown: np.ndarray  # (P, len(MEMORY_PARTS))
    tflops_per_gpu: np.ndarray
    mfu: np.ndarray
    hidden: np.ndarray  # (P, len(HIDDEN_KINDS))
    extra: dict[str, np.ndarray | list[Any]] = field(default_factory=dict)
    extra_names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    shared_extra: dict[str, Any] = field(default_factory=dict)
    source: list[Prediction] | None = None  # the Predictions a table was made from, which `rows` returns as they are

    def __len__(self) -> int:
        return len(self.iter_time_s)

    def part(self, name: str) -> np.ndarray:
        """One TIME_PARTS column of the breakdown."""
        return self.breakdown[:, TIME_PARTS.index(name)]

    def take(self, index: Sequence[int] | np.ndarray) -> "PredictionTable":
        """The rows `index` as a table of their own (what a search keeps of a batch)."""
        idx = np.asarray(index, dtype=int)
        at, offsets = _segments(self.stage_offsets, idx)
        extra = {k: [c[i] for i in idx.tolist()] if isinstance(c, list) else c[idx] for k, c in self.extra.items()}
        return PredictionTable(
            iter_time_s=self.iter_time_s[idx], breakdown=self.breakdown[idx], peak_memory_gib=self.peak_memory_gib[idx],
            stage_memory_gib=self.stage_memory_gib[at], stage_offsets=offsets,
            memory_breakdown=self.memory_breakdown[idx], tflops_per_gpu=self.tflops_per_gpu[idx], mfu=self.mfu[idx],
            hidden=self.hidden[idx], extra=extra, extra_names=dict(self.extra_names), shared_extra=dict(self.shared_extra),
            source=None if self.source is None else [self.source[i] for i in idx.tolist()])

    @classmethod
    def concatenate(cls, tables: Sequence["PredictionTable"]) -> "PredictionTable":
        """One table of the rows of `tables` in order (tables of one predictor: the same extra columns)."""
        first = tables[0]
        bases = np.cumsum([0] + [len(t.stage_memory_gib) for t in tables[:-1]])
        extra = {k: ([x for t in tables for x in t.extra[k]] if isinstance(c, list)
                     else np.concatenate([t.extra[k] for t in tables])) for k, c in first.extra.items()}
        return cls(
            iter_time_s=np.concatenate([t.iter_time_s for t in tables]),
            breakdown=np.concatenate([t.breakdown for t in tables]),
            peak_memory_gib=np.concatenate([t.peak_memory_gib for t in tables]),
            stage_memory_gib=np.concatenate([t.stage_memory_gib for t in tables]),
            stage_offsets=np.concatenate([[0], *(t.stage_offsets[1:] + b for t, b in zip(tables, bases))]),
            memory_breakdown=np.concatenate([t.memory_breakdown for t in tables]),
            tflops_per_gpu=np.concatenate([t.tflops_per_gpu for t in tables]),
            mfu=np.concatenate([t.mfu for t in tables]), hidden=np.concatenate([t.hidden for t in tables]),
            extra=extra, extra_names=dict(first.extra_names), shared_extra=dict(first.shared_extra),
            source=None if first.source is None else [p for t in tables for p in t.source or []])

    def row(self, i: int) -> Prediction:
        return self.rows([i])[0]

    def rows(self, index: Sequence[int] | None = None) -> list[Prediction]:
        """The `Prediction`s of rows `index` (all rows when None), with plain Python numbers."""
        idx = np.arange(len(self)) if index is None else np.asarray(index, dtype=int)
        if self.source is not None:
            return [self.source[i] for i in idx.tolist()]
        if not len(idx):
            return []
        at, offsets = _segments(self.stage_offsets, idx)
        stages = [s.tolist() for s in np.split(self.stage_memory_gib[at], offsets[1:-1])]
        return [Prediction(iter_time_s=t, breakdown=dict(zip(TIME_PARTS, b)), peak_memory_gib=peak,
                           memory_per_stage_gib=s, memory_breakdown=dict(zip(MEMORY_PARTS, mem)),
                           tflops_per_gpu=tf, mfu=mfu, hidden_comm={k: x for k, x in zip(HIDDEN_KINDS, h) if x > 0},
                           extra=e)
                for t, b, peak, s, mem, tf, mfu, h, e in zip(
                    self.iter_time_s[idx].tolist(), self.breakdown[idx].tolist(), self.peak_memory_gib[idx].tolist(),
                    stages, self.memory_breakdown[idx].tolist(),
                    self.tflops_per_gpu[idx].tolist(), self.mfu[idx].tolist(), self.hidden[idx].tolist(),
                    self._extras(idx))]

    def _extras(self, idx: np.ndarray) -> list[dict[str, Any]]:
        extras: list[dict[str, Any]] = [dict(self.shared_extra) for _ in idx]
        for key, column in self.extra.items():
            if isinstance(column, list):
                for e, i in zip(extras, idx.tolist()):
                    if column[i] is not None:
                        e[key] = column[i]
                continue
            values = column[idx].tolist()
            names = self.extra_names.get(key)
            for e, value in zip(extras, values):
                e[key] = dict(zip(names, value)) if names else value
        return extras

    @classmethod
    def from_predictions(cls, predictions: Sequence[Prediction]) -> "PredictionTable":
        """The columns of `Prediction`s a predictor made one by one; `rows` gives those objects back."""
        def column(get) -> np.ndarray:
            return np.array([get(p) for p in predictions], dtype=float)

        def parts(get, names: tuple[str, ...]) -> np.ndarray:
            return np.array([[get(p).get(k, 0.0) for k in names] for p in predictions], dtype=float).reshape(-1, len(names))

        lengths = [len(p.memory_per_stage_gib) for p in predictions]
        return cls(
            iter_time_s=column(lambda p: p.iter_time_s), breakdown=parts(lambda p: p.breakdown, TIME_PARTS),
            peak_memory_gib=column(lambda p: p.peak_memory_gib),
            stage_memory_gib=np.array([m for p in predictions for m in p.memory_per_stage_gib], dtype=float),
            stage_offsets=np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64),
            memory_breakdown=parts(lambda p: p.memory_breakdown, MEMORY_PARTS),
            tflops_per_gpu=column(lambda p: p.tflops_per_gpu), mfu=column(lambda p: p.mfu),
            hidden=parts(lambda p: p.hidden_comm, HIDDEN_KINDS), source=list(predictions),
        )


def _segments(offsets: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions of rows `index`'s segments end to end, their offsets) in a flat array cut at `offsets`."""
    lengths = offsets[index + 1] - offsets[index]
    new = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return np.repeat(offsets[index] - new[:-1], lengths) + np.arange(new[-1]), new


def row_sums(x: np.ndarray) -> np.ndarray:
    """Each row's sum, added left to right as `sum()` adds one Prediction's parts (numpy's pairwise sum rounds
    otherwise), so a plan's total does not depend on the batch around it."""
    total = x[:, 0].copy()
    for j in range(1, x.shape[1]):
        total += x[:, j]
    return total
