"""A local two-node Ray cluster for tests that place ranks across nodes (validation runs)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest


def two_node_cluster(cpus_per_node: int) -> Iterator[Any]:
    """Yield a `ray.cluster_utils.Cluster` of two raylets of `cpus_per_node` CPUs this process is connected to;
    shut down after. Meant as the body of a module-scoped fixture."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus_per_node})
    c.add_node(num_cpus=cpus_per_node)
    ray.init(address=c.address, log_to_driver=False, configure_logging=False)
    yield c
    ray.shutdown()
    c.shutdown()
