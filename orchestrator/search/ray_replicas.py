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

import random
from dataclasses import dataclass
from typing import Any, Sequence

import ray
from ray.exceptions import RayActorError

from orchestrator.search.replica import MAX_CHUNK, Answers, Replica, ReplicaLoadError, Sent, chunked
from predictor.graph.layer_graph import LayerGraph
from predictor.models.base import Predictor
from predictor.plan import Plan
from predictor.spec.workload import WorkloadSpec
from search_spaces.plan_list import PlanList


def _root_cause(err: Exception) -> str:
    """The last `SomeError: message` line of a remote traceback (Ray wraps the replica's own error)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.split(":", 1)[0].endswith(("Error", "Exception"))]
    return errors[-1] if errors else lines[-1] if lines else type(err).__name__


class PredictorReplica(Replica):
    """A replica as a Ray actor (`ray::PredictorReplica` in process lists): its info says on which node and GPUs it
    runs."""

    def info(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), **super().info(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


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
        `sizes` as for `Replica`."""
        resources = ray.cluster_resources()
        gpus = resources.get("GPU", 0.0)
        if count is None:
            count = max(1, min(8, int(resources.get("CPU", 1))))
        opts: dict[str, Any] = {"num_gpus": gpu_fraction, "num_cpus": 0} if gpus > 0 else {"num_cpus": cpu_fraction}
        actor = ray.remote(PredictorReplica).options(max_restarts=max_restarts, max_task_retries=2, **opts)
        # Arguments by value, not ray.put refs: a restarted actor needs them again (ray-project/ray#53727).
        return cls([actor.remote(predictor, spec, graph, list(sizes)) for _ in range(count)], chunk)

    def ready(self) -> list[dict[str, Any]]:
        """Wait until every replica has loaded its predictor; their `info()`. ReplicaLoadError if one could not."""
        try:
            return ray.get([r.info.remote() for r in self.replicas])
        except RayActorError as err:
            raise ReplicaLoadError(_root_cause(err)) from None

    def submit(self, plans: Sequence[Plan]) -> "Sent":
        """Send `plans` to the replicas (at least two chunks each, so one's answer travels while the next is
        predicted; starting at a random replica, so concurrent callers spread) without waiting; `gather` answers."""
        starts, chunks = chunked(plans, max(self.chunk, min(MAX_CHUNK, -(-len(plans) // (2 * len(self.replicas))))))
        first = random.randrange(len(self.replicas))
        owners = [(first + i) % len(self.replicas) for i in range(len(chunks))]
        return Sent(starts, chunks, owners, [self.replicas[r].predict.remote(c) for c, r in zip(chunks, owners)])

    def arrive(self, sent: Sent, seconds: float) -> bool:
        """Wait up to `seconds` (> 0) for every chunk of `sent` to be answered (or to fail); whether they were."""
        ready, _ = ray.wait(sent.refs, num_returns=len(sent.refs), timeout=seconds)
        return len(ready) == len(sent.refs)

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
