"""Connecting this process to a Ray cluster, and what the connected cluster holds."""

from __future__ import annotations

import ray

from orchestrator.ray_cluster.lifecycle import init_ray


def connect_ray(address: str | None = None) -> None:
    """Join the Ray cluster at `address`, or start a local one; a no-op when already connected."""
    if ray.is_initialized():
        return
    if address:
        init_ray(address=address, configure_logging=False, log_to_driver=False)
    else:
        init_ray(include_dashboard=False, configure_logging=False, log_to_driver=False)


def default_device() -> str | None:
    """'cpu' on a cluster without GPUs; None when it has GPUs (their model must be named by the user)."""
    return "cpu" if not any(n.get("GPU", 0) for n in cluster_nodes()) else None


def cluster_nodes() -> list[dict[str, float]]:
    """Total resources of each alive node of the connected Ray cluster."""
    return [dict(n["Resources"]) for n in ray.nodes() if n["Alive"]]
