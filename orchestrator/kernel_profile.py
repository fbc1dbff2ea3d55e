"""`scaledl profile --kernels`: a device kernel profile of the connected Ray cluster, one actor per node.

Each node's actor measures every section on its own device (`predictor.measure.kernel_profile.NodeProfiler`: the
GEMM and grouped-GEMM shapes chosen D-optimally, attention, the memory-bound copy, launch and host costs, the
collectives among its own GPUs or CPU processes); `predictor.measure.kernel_profile.measure_profile` keeps the median
of the nodes' figures and their spread, and runs the collectives across nodes with one rank per node's actor. The
profile file is rewritten atomically after every section, so an interrupted run given `resume` measures only what
it lacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.ray_cluster.connect import connect_ray
from predictor.measure import kernel_profile as kp


@ray.remote(max_restarts=0)
class NodeActor:
    """One node's measurements: the `NodeProfiler` of the GPU or CPU this actor was placed on."""

    def __init__(self, device_kind: str) -> None:
        self.profiler = kp.NodeProfiler(device_kind)

    def run(self, method: str, *args: Any) -> Any:
        if method == "rendezvous":  # the address Ray reaches this node at
            args = (ray.util.get_node_ip_address(),)
        return kp.run_method(self.profiler, method, *args)


class RayNodes:
    """The cluster's nodes as `kp.Nodes`: every call goes to all node actors at once."""

    def __init__(self, actors: list[Any]) -> None:
        self.actors = actors

    def call(self, method: str, *args: Any) -> list[Any]:
        return ray.get([a.run.remote(method, *args) for a in self.actors])

    def call_each(self, method: str, args: list[tuple]) -> list[Any]:
        return ray.get([a.run.remote(method, *each) for a, each in zip(self.actors, args)])


def node_actors(device_kind: str) -> list[Any]:
    """One actor pinned to each alive node that has the device (every node for cpu, GPU nodes for cuda), holding
    all of that node's GPUs so its collectives see them; refuses a cluster without one."""
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if device_kind == "cuda":
        nodes = [n for n in nodes if n["Resources"].get("GPU", 0) >= 1]
        if not nodes:
            raise kp.KernelProfileError("--device cuda: the Ray cluster has no GPU node (no node declares a GPU "
                                        "resource); run on a GPU cluster (--address) or use --device cpu")
    actors = []
    for node in sorted(nodes, key=lambda n: n["NodeID"]):
        gpus = int(node["Resources"].get("GPU", 0)) if device_kind == "cuda" else 0
        cpus = min(1.0, node["Resources"].get("CPU", 0.0))
        strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        actors.append(NodeActor.options(num_cpus=cpus, num_gpus=gpus, scheduling_strategy=strategy).remote(device_kind))
    return actors


def profile_cluster(device_kind: str, path: str | Path, resume: bool = False, address: str | None = None,
                    gemm_shapes: int = 24, grouped_shapes: int = 12, procs: int = 2, seed: int = 0,
                    on_section: kp.OnSection | None = None) -> dict[str, Any]:
    """Measure the kernel profile of the cluster at `address` (a local Ray without one) into `path`."""
    connect_ray(address)
    actors = node_actors(device_kind)
    try:
        return kp.measure_profile(RayNodes(actors), device_kind, path, resume, gemm_shapes, grouped_shapes, procs,
                                  seed, on_section)
    finally:
        for actor in actors:
            ray.kill(actor)


def recheck_cluster(path: str | Path, address: str | None = None, per_section: int = 4,
                    seed: int = 0) -> tuple[list[kp.Recheck], list[str], str]:
    """A sample of the profile at `path` measured again on the cluster at `address`, what of the hardware and
    software it records differs now (a new driver, torch or GPU model is reason enough to measure it again), and
    the device kind (cpu or cuda) it was measured on."""
    profile = kp.read(path)
    kind = "cpu" if profile["device"] == "cpu" else "cuda"
    connect_ray(address)
    actors = node_actors(kind)
    try:
        nodes = RayNodes(actors)
        now = nodes.call("identity")
        before = kp.machine(profile).get("nodes", [])
        changed = [f"{key}: {before[0].get(key)} -> {now[0].get(key)}" for key in ("cpu", "gpu", "torch", "cuda")
                   if before and before[0].get(key) != now[0].get(key)]
        if before and len(before) != len(now):
            changed.append(f"nodes: {len(before)} -> {len(now)}")
        return kp.recheck(nodes, profile, per_section, seed), changed, kind
    finally:
        for actor in actors:
            ray.kill(actor)
