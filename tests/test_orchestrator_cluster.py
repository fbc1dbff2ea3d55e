"""Multi-node behaviour on one machine: a `ray.cluster_utils.Cluster` of three raylets, two declaring a GPU."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
# Three raylets and a node removed: slow. test_orchestrator checks a lost replica and the search's answer fast.
pytestmark = pytest.mark.slow

from orchestrator.ray_cluster.local import local_cluster  # noqa: E402
from orchestrator.search.ray_replicas import ReplicaPool  # noqa: E402
from orchestrator.search.run import run_search  # noqa: E402
from orchestrator.search.types import SearchOptions  # noqa: E402
from tests.gpt3_search import CAPACITY, GRAPH, PLANS, SPEC, best_direct, best_found  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    gpu_node = {"num_cpus": 1, "num_gpus": 1}
    with local_cluster({"num_cpus": 2, "num_gpus": 0}, gpu_node, gpu_node) as c:
        yield c, list(c.worker_nodes)


def test_replicas_land_on_gpu_nodes_and_get_a_gpu(cluster) -> None:
    c, gpu_nodes = cluster
    pool = ReplicaPool.start("analytical", SPEC, GRAPH, count=3)
    infos = pool.ready()
    assert {i["node_id"] for i in infos} <= {n.node_id for n in gpu_nodes}
    assert all(i["gpu_ids"] for i in infos)  # each holds a (fractional) GPU of its node
    pool.shutdown()


def test_losing_a_node_mid_search_keeps_the_result(cluster, tmp_path) -> None:
    c, gpu_nodes = cluster
    pool = ReplicaPool.start("analytical", SPEC, GRAPH, count=2)
    victim_id = pool.ready()[0]["node_id"]
    removed = []

    def drop_node(n: int, best: float) -> None:
        if not removed:  # after the first batch, the node of replica 0 goes away
            node = next(g for g in gpu_nodes if g.node_id == victim_id)
            c.remove_node(node)
            removed.append(node)

    result = run_search(PLANS, pool, tmp_path, CAPACITY, SearchOptions(batch_size=150, concurrency=2), key="n",
                        on_batch=drop_node)
    assert removed and result.stats["complete"]
    assert best_found(result) == best_direct()
    survivors = {i["node_id"] for i in pool.ready()}
    assert victim_id not in survivors  # the replica was restarted on the remaining GPU node
