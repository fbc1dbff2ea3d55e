"""A predictor replica without Ray: one loaded predictor and one workload (spec + graph, at one or several cluster
sizes) answering batches of plans, and the answers' columnar form.

`orchestrator.search.ray_replicas` runs replicas as Ray actors (`PredictorReplica`); `LocalPool` runs one here, in
the driver, for a search too small to repay starting Ray (a plan search whose candidates a core prices in about the
time Ray takes to start). Both pools answer `submit` / `arrive` / `gather` alike, so the search loop
(`orchestrator.search.run`) does not know which it has.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from predictor.costs.prediction_table import PredictionTable
from predictor.graph.layer_graph import LayerGraph
from predictor.models.base import Predictor
from predictor.plan import Plan
from predictor.spec.workload import WorkloadSpec
from search_spaces.plan_list import PlanList

# The most plans in one replica call: a vectorised predictor's arrays of a bigger batch outgrow the CPU's caches
# (the analytical one predicts 8,192 plans at a time about twice as fast per plan as 20,000), and a dead replica's
# retried call stays short.
MAX_CHUNK = 8192


def join_tables(tables: Sequence[PredictionTable]) -> PredictionTable:
    """The rows of `tables` in order, as one table. Empty tables are left out (one made of no Predictions lacks a
    vectorised predictor's extra columns, which `PredictionTable.concatenate` takes from the first)."""
    rows = [t for t in tables if len(t)] or list(tables[:1])
    if not rows:
        return PredictionTable.from_predictions([])
    return rows[0] if len(rows) == 1 else PredictionTable.concatenate(rows)


@dataclass
class Answers:
    """A batch of plans answered: `table` row k predicts the plan at position `rows[k]` of the batch (ascending),
    and `errors` says why predicting each other position failed. Columns, not one object per plan: shipping
    Predictions between processes costs more than predicting them."""

    table: PredictionTable
    rows: np.ndarray
    errors: dict[int, str] = field(default_factory=dict)

    @classmethod
    def merge(cls, parts: Sequence[tuple[int, "Answers"]]) -> "Answers":
        """One answer of (offset in the whole batch, answer of the positions from there) parts, positions ascending."""
        rows = np.concatenate([a.rows + offset for offset, a in parts])
        errors = dict(sorted((offset + i, e) for offset, a in parts for i, e in a.errors.items()))
        table = join_tables([a.table for _, a in parts])
        order = np.argsort(rows, kind="stable")
        if np.any(order != np.arange(len(order))):
            table, rows = table.take(order), rows[order]
        return cls(table, rows, errors)


class ReplicaLoadError(Exception):
    """A replica could not load its predictor; the message is the root cause, in one line."""


class Replica:
    """One loaded predictor answering batches of plans of one workload (the Ray actor `PredictorReplica` is one)."""

    def __init__(self, predictor: "str | Predictor", spec: WorkloadSpec, graph: LayerGraph,
                 sizes: Sequence[WorkloadSpec] = ()) -> None:
        """`predictor`: a registry name or checkpoint path (loaded here, once per replica), or a ready
        Predictor object (shipped pickled, e.g. a library user's own model). `sizes`: the same workload on
        other cluster sizes; each plan is predicted on the one with its GPU count."""
        from predictor.models.registry import load_predictor, measured_accuracy  # heavy (torch): only when one loads

        from predictor.spec.resolver import resolve

        resolved = resolve(spec)
        self.spec, self.graph = spec, graph
        self.specs = {s.cluster.gpus: s for s in (*sizes, spec)}
        if isinstance(predictor, str):
            self.predictor, self.label = load_predictor(predictor, spec.cluster.device, resolved.device.model)
        else:
            self.predictor, self.label = predictor, predictor.name
        self.accuracy = measured_accuracy(self.predictor, spec.cluster.device, resolved.framework.name)
        self.calls = 0

    def info(self) -> dict[str, Any]:
        """What this replica serves and where (for reports)."""
        return {"pid": os.getpid(), "predictor": self.label, "accuracy": self.accuracy, "calls": self.calls}

    def predict(self, plans: Sequence[Plan]) -> Answers:
        """The batch's answers, each plan on the cluster size its degrees multiply to (one batched call per size)."""
        self.calls += 1
        plans = PlanList.of(plans)
        gpus = plans.gpus()
        sizes = np.unique(gpus)
        if len(sizes) == 1:
            return self._predict(self.specs.get(int(sizes[0]), self.spec), list(plans))
        parts = []
        for size in sizes.tolist():
            rows = np.flatnonzero(gpus == size)
            answers = self._predict(self.specs.get(size, self.spec), list(plans.take(rows)))
            parts.append((0, Answers(answers.table, rows[answers.rows],
                                     {int(rows[i]): e for i, e in answers.errors.items()})))
        return Answers.merge(parts)

    def _predict(self, spec: WorkloadSpec, plans: list[Plan]) -> Answers:
        """If the batch call fails, plans are retried one by one so one bad plan costs only its own answer
        (an error), not the batch."""
        try:
            return Answers(self.predictor.predict_table(spec, self.graph, plans), np.arange(len(plans)))
        except Exception:  # noqa: BLE001 - isolate the failing plan(s) below
            tables, rows, errors = [], [], {}
            for i, plan in enumerate(plans):
                try:
                    tables.append(self.predictor.predict_table(spec, self.graph, [plan]))
                    rows.append(i)
                except Exception as err:  # noqa: BLE001 - recorded per plan, never crashes the search
                    errors[i] = f"prediction failed: {type(err).__name__}: {err}"
            return Answers(join_tables(tables), np.asarray(rows, dtype=int), errors)


@dataclass
class Sent:
    """Chunks of plans sent to the replicas: where each starts in the batch, its plans, its replica and its answer
    (a Ray reference; None for a `LocalPool`, which answers when gathered)."""

    starts: list[int]
    chunks: list[PlanList]
    owners: list[int]
    refs: list[Any]


def chunked(plans: Sequence[Plan], size: int) -> tuple[list[int], list[PlanList]]:
    """`plans` in chunks of `size`: where each starts, and its plans."""
    plans = PlanList.of(plans)
    starts = list(range(0, len(plans), size))
    return starts, [plans[i:i + size] for i in starts]


class LocalPool:
    """One replica in this process, answering as the Ray pool does: a chunk at a time (`MAX_CHUNK` plans) when its
    batch is gathered, so a search's budget and Ctrl-C act between batches."""

    def __init__(self, predictor: "str | Predictor", spec: WorkloadSpec, graph: LayerGraph,
                 sizes: Sequence[WorkloadSpec] = ()) -> None:
        """The replica loaded now; ReplicaLoadError if its predictor could not be."""
        try:
            self.replica = Replica(predictor, spec, graph, sizes)
        except Exception as err:  # noqa: BLE001 - any failure to load is said in one line, as a Ray replica's is
            raise ReplicaLoadError(f"{type(err).__name__}: {err}") from err

    def ready(self) -> list[dict[str, Any]]:
        return [self.replica.info()]

    def submit(self, plans: Sequence[Plan]) -> Sent:
        starts, chunks = chunked(plans, MAX_CHUNK)
        return Sent(starts, chunks, [0] * len(chunks), [None] * len(chunks))

    def arrive(self, sent: Sent, seconds: float) -> bool:
        """Answers come when gathered, here: nothing to wait for."""
        return True

    def gather(self, sent: Sent) -> Answers:
        return Answers.merge([(start, self.replica.predict(chunk)) for start, chunk in zip(sent.starts, sent.chunks)])

    def predict(self, plans: Sequence[Plan]) -> Answers:
        return self.gather(self.submit(plans))

    def shutdown(self) -> None:
        """Nothing runs apart from the driver."""
