"""Ray nodes on this machine (`ray.cluster_utils.Cluster`), so that plans placing ranks across nodes, and the
loss of a node, can be run without a cluster: the validation tests and benchmarks start theirs here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster


@contextmanager
def local_cluster(*nodes: dict[str, Any]) -> Iterator[Cluster]:
    """One raylet per entry of `nodes` (its `ray start` arguments, e.g. `{"num_cpus": 1}`; the first is the head),
    this process connected to them until the block ends. The raylets share this machine's cores, whatever
    CPUs they declare."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args=nodes[0])
    try:
        for args in nodes[1:]:
            cluster.add_node(**args)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        yield cluster
    finally:
        ray.shutdown()  # nothing to do when ray.init was not reached
        cluster.shutdown()
