"""Fixtures shared by the test modules: the local Ray cluster that validation runs place their ranks on, and this
machine's measured CPU profile."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def cpus_per_node() -> int:
    """CPUs each raylet of `two_nodes` declares; a module whose runs need more defines a fixture of this name."""
    return 1


@pytest.fixture(scope="module")
def two_nodes(cpus_per_node: int) -> Iterator[Any]:
    """Two raylets on this machine, this process connected: a `ray.cluster_utils.Cluster`, one per test module
    (a module's runs see the resources it declares, not those another module's runs left behind)."""
    pytest.importorskip("ray")
    from orchestrator.local_cluster import local_cluster

    with local_cluster({"num_cpus": cpus_per_node}, {"num_cpus": cpus_per_node}) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def measured_cpu_profile() -> Path:
    """This machine's measured CPU profile in the user's cache (`$SCALEDL_CACHE`), measured on first use (about 45 s)
    as `device: cpu` is: the session's one measurement, which tests copy into their own cache instead of measuring
    again."""
    from predictor.measure import device as measure_device

    measure_device.measured_cpu()
    return measure_device.cache_dir() / measure_device.CACHE_FILE
