"""`scaledl profile --kernels`: a device kernel profile of the connected Ray cluster, one actor per node.

Each node's actor measures every section on its own device (`predictor.measure.kernel_profile.NodeProfiler`: the
GEMM and grouped-GEMM shapes chosen D-optimally, attention, the memory-bound copy, launch and host costs, the
collectives among its own GPUs or CPU processes); the driver keeps the median of the nodes' figures and their
spread. The collectives across nodes run one rank per node's actor. The profile file is rewritten atomically
after every section, so an interrupted run given `resume` measures only what it lacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.validation.placement import connect_ray
from predictor.measure import kernel_profile as kp
from predictor.measure.kernel_shapes import GRIDS

OnSection = Callable[[str, int, int], None]


@ray.remote(max_restarts=0)
class NodeActor:
    """One node's measurements: the `NodeProfiler` of the GPU or CPU this actor was placed on."""

    def __init__(self, device_kind: str) -> None:
        self.profiler = kp.NodeProfiler(device_kind)

    def identity(self) -> dict[str, Any]:
        return self.profiler.identity()

    def backends(self) -> list[str]:
        return self.profiler.attention_backends()

    def ranks_per_node(self, wanted: int) -> int:
        return self.profiler.ranks_per_node(wanted)

    def measure(self, section: kp.Section) -> tuple[bool, Any]:
        """(True, answer) or (False, why this device cannot run it)."""
        try:
            return True, self.profiler.measure(section)
        except Exception as err:  # noqa: BLE001 - a kernel this device lacks (fp8 on an older GPU) is a result
            return False, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]

    def collectives(self, sizes: list[int], world: int, ranks: list[int] | None = None, addr: str = "127.0.0.1",
                    port: int | None = None) -> dict[str, list[list[float]]]:
        return self.profiler.collectives(sizes, world, ranks, addr, port)

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a port free on it: where a group across nodes meets (rank 0 here)."""
        from predictor.measure.collectives import free_port_on

        addr = ray.util.get_node_ip_address()
        return addr, free_port_on(addr)


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


def starting_profile(path: Path, resume: bool, identities: list[dict[str, Any]], ranks: int) -> dict[str, Any]:
    """The profile to fill: the file at `path` when resuming one measured on the same hardware, else a new one."""
    if not path.exists():
        return kp.new_profile(identities, ranks)
    if not resume:
        raise kp.KernelProfileError(f"{path} exists; pass --resume to complete it, or choose another --kernels path")
    profile = kp.read(path)
    before = [{k: n.get(k) for k in ("cpu", "gpu", "torch")} for n in kp.machine(profile).get("nodes", [])]
    now = [{k: n.get(k) for k in ("cpu", "gpu", "torch")} for n in identities]
    if before[:1] != now[:1]:
        raise kp.KernelProfileError(f"--resume: {path} was measured on {before[:1]}, this cluster is {now[:1]}; "
                                    f"write a new profile (another --kernels path)")
    return profile


def profile_cluster(device_kind: str, path: str | Path, resume: bool = False, address: str | None = None,
                    gemm_shapes: int = 24, grouped_shapes: int = 12, procs: int = 2, seed: int = 0,
                    on_section: OnSection | None = None) -> dict[str, Any]:
    """Measure the kernel profile of the cluster at `address` (a local Ray without one) into `path`."""
    path = Path(path)
    connect_ray(address)
    actors = node_actors(device_kind)
    try:
        identities = ray.get([a.identity.remote() for a in actors])
        ranks = ray.get(actors[0].ranks_per_node.remote(procs))
        profile = starting_profile(path, resume, identities, ranks)
        todo = kp.sections(device_kind, gemm_shapes, grouped_shapes, seed, tuple(ray.get(actors[0].backends.remote())))
        steps = [s.key for s in todo] + ["collectives.intra_node", "collectives.inter_node"]
        finished = kp.done(profile)
        for i, section in enumerate(todo):
            if section.key not in finished:
                answers = ray.get([a.measure.remote(section) for a in actors])
                failed = [why for ok, why in answers if not ok]
                if failed:
                    profile["missing"][section.key] = failed[0]
                else:
                    value, spread = kp.combine([answer for _, answer in answers])
                    kp.place(profile, section.key, value, kp.source_of(section.kind, len(actors), spread))
                kp.write(profile, path)
            if on_section:
                on_section(section.key, i + 1, len(steps))
        sizes = list(GRIDS[device_kind].collective_bytes)
        if "collectives.intra_node" not in finished:
            if ranks < 2:
                profile["missing"]["collectives.intra_node"] = "one GPU per node: no link inside a node to measure"
            else:
                value, spread = kp.combine(ray.get([a.collectives.remote(sizes, ranks) for a in actors]))
                kp.place(profile, "collectives.intra_node", value,
                         kp.source_of("collectives", len(actors), spread) + f"; {ranks} ranks inside a node")
            kp.write(profile, path)
        if on_section:
            on_section("collectives.intra_node", len(steps) - 1, len(steps))
        if "collectives.inter_node" not in finished:
            if len(actors) < 2:
                profile["missing"]["collectives.inter_node"] = "one node: no link between nodes to measure"
            else:
                addr, port = ray.get(actors[0].rendezvous.remote())
                answers = ray.get([a.collectives.remote(sizes, len(actors), [i], addr, port) for i, a in enumerate(actors)])
                kp.place(profile, "collectives.inter_node", answers[0],
                         kp.HOW["collectives"] + f"; one rank on each of {len(actors)} nodes")
            kp.write(profile, path)
        if on_section:
            on_section("collectives.inter_node", len(steps), len(steps))
        return profile
    finally:
        for actor in actors:
            ray.kill(actor)
