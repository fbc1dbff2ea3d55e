"""Predictor replicas: Ray actors that each hold a loaded predictor and one workload (spec + graph), at one or
several cluster sizes (the graph does not depend on the cluster; a plan's degrees name its size).

Loading a predictor (a checkpoint, a GNN) and building a layer graph are the slow parts, so
they happen once per replica, and every call is a batch of plans. Where the cluster has
GPUs a replica asks for a fraction of one (several replicas share a GPU); otherwise a
fraction of a CPU. A replica that dies is restarted by Ray (`max_restarts`) and Ray retries
its in-flight batch (`max_task_retries`); if the retries are exhausted too, the pool sends the
batch to another replica, so a search survives a crash or a lost node.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import ray
from ray.exceptions import RayActorError

from predictor.layer_graph import LayerGraph
from predictor.models.base import Predictor
from predictor.plan import Plan
from predictor.prediction_table import PredictionTable
from predictor.workload import WorkloadSpec
from search_spaces.plan_list import PlanList


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


class PredictorReplica:
    """One loaded predictor answering batches of plans of one workload."""

    def __init__(self, predictor: "str | Predictor", spec: WorkloadSpec, graph: LayerGraph,
                 sizes: Sequence[WorkloadSpec] = ()) -> None:
        """`predictor`: a registry name or checkpoint path (loaded here, once per replica), or a ready
        Predictor object (shipped pickled, e.g. a library user's own model). `sizes`: the same workload on
        other cluster sizes; each plan is predicted on the one with its GPU count."""
        from predictor.models.registry import load_predictor, measured_accuracy  # heavy (torch): only in the actor

        from predictor.resolver import resolve

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
        """Where this replica runs and what it serves (for reports and placement tests)."""
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "pid": os.getpid(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "predictor": self.label, "accuracy": self.accuracy, "calls": self.calls}

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
    """Chunks of plans sent to the replicas: where each starts in the batch, its plans, its replica and its answer."""

    starts: list[int]
    chunks: list[PlanList]
    owners: list[int]
    refs: list[Any]


# The most plans in one replica call: a vectorised predictor's arrays of a bigger batch outgrow the CPU's caches
# (the analytical one predicts 8,192 plans at a time about twice as fast per plan as 20,000), and a dead replica's
# retried call stays short.
MAX_CHUNK = 8192


@dataclass
class ReplicaPool:
    """Actor handles plus the batching policy; picklable, so Tune trials carry it to their workers."""

    replicas: list[Any]
    chunk: int = 256  # the fewest plans in one replica call

    @classmethod
    def start(cls, predictor: "str | Predictor", spec: WorkloadSpec, graph: LayerGraph, count: int | None = None,
              gpu_fraction: float = 0.25, cpu_fraction: float = 0.5, max_restarts: int = 3,
              chunk: int = 256, sizes: Sequence[WorkloadSpec] = ()) -> "ReplicaPool":
        """Start `count` replicas (default: one per CPU of the cluster, at most 8), on GPUs when there are any;
        `sizes` as for `PredictorReplica`."""
        resources = ray.cluster_resources()
        gpus = resources.get("GPU", 0.0)
        if count is None:
            count = max(1, min(8, int(resources.get("CPU", 1))))
        opts: dict[str, Any] = {"num_gpus": gpu_fraction, "num_cpus": 0} if gpus > 0 else {"num_cpus": cpu_fraction}
        actor = ray.remote(PredictorReplica).options(max_restarts=max_restarts, max_task_retries=2, **opts)
        # Arguments by value, not ray.put refs: a restarted actor needs them again (ray-project/ray#53727).
        return cls([actor.remote(predictor, spec, graph, list(sizes)) for _ in range(count)], chunk)

    def ready(self) -> list[dict[str, Any]]:
        """Wait until every replica has loaded its predictor; their `info()`."""
        return ray.get([r.info.remote() for r in self.replicas])

    def submit(self, plans: Sequence[Plan]) -> "Sent":
        """Send `plans` to the replicas (at least two chunks each, so one's answer travels while the next is
        predicted; starting at a random replica, so concurrent callers spread) without waiting; `gather` answers."""
        size = max(self.chunk, min(MAX_CHUNK, -(-len(plans) // (2 * len(self.replicas)))))
        starts = list(range(0, len(plans), size))
        plans = PlanList.of(plans)
        chunks = [plans[i:i + size] for i in starts]
        first = random.randrange(len(self.replicas))
        owners = [(first + i) % len(self.replicas) for i in range(len(chunks))]
        return Sent(starts, chunks, owners, [self.replicas[r].predict.remote(c) for c, r in zip(chunks, owners)])

    def gather(self, sent: "Sent") -> Answers:
        """The answers of a `submit`, in order; a chunk whose replica died for good is re-sent to the next replica."""
        return Answers.merge([(start, self._get(ref, chunk, owner))
                              for start, chunk, owner, ref in zip(sent.starts, sent.chunks, sent.owners, sent.refs)])

    def predict(self, plans: Sequence[Plan]) -> Answers:
        """`plans` answered by the replicas (`submit`, then `gather`)."""
        return self.gather(self.submit(plans))

    def _get(self, ref: Any, chunk: PlanList, owner: int) -> Answers:
        tries = len(self.replicas)
        while True:
            try:
                return ray.get(ref)
            except RayActorError:
                tries -= 1
                if tries == 0:
                    raise
                owner = (owner + 1) % len(self.replicas)
                ref = self.replicas[owner].predict.remote(chunk)

    def shutdown(self) -> None:
        for r in self.replicas:
            ray.kill(r, no_restart=True)
