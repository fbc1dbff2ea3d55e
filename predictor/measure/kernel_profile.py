"""A device kernel profile measured on this machine: the sections, their provenance, the file.

A profile is one JSON file in the shipped device profiles' format (`predictor.kernels.profile`, which checks every
write and read), its collectives under the links `intra_node` (the ranks of one node) and `inter_node` (one rank per
node). Its `sources` say how each section was measured, and two more entries the provenance: `provenance` in words
(hardware, versions, date) and `machine`, the same as JSON (each node's identity, ranks per node, date), which
`kernel_profile_device` and `scaledl revalidate --kernels` read.

`sections` lists what to measure on a device class; `NodeProfiler` measures one section on this node's device
(a Ray actor per node runs it: `orchestrator.kernel_profile`); `combine` takes several nodes' answers of a section
to one (the median of each point, their spread in its source); `place` puts an answer into the profile. The
profile is rewritten atomically after every section, so a long run resumes from the sections it has (`done`).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from predictor.measure.kernel_shapes import GRIDS, attention_shapes, d_optimal, gemm_candidates, grouped_candidates

# Precisions a device class's GEMMs, grouped GEMMs and attention are measured in (fp8 where the GPU has it).
PRECISIONS = {"cpu": {"gemm": ("fp32", "bf16"), "grouped_gemm": ("fp32",), "attention": "fp32"},
              "cuda": {"gemm": ("bf16", "fp32", "fp8"), "grouped_gemm": ("bf16",), "attention": "bf16"}}
HOW = {
    "gemm": "torch.matmul of (batch, m, k) x (batch, k, n) (fp8: torch._scaled_mm per batch element, unit scales, "
            "bf16 out; fp32 without TF32, PyTorch's default), shapes chosen D-optimally (Fedorov exchange over a "
            "quadratic model of log2 batch, m, n, k)",
    "grouped_gemm": "torch._grouped_mm over groups of equal tokens (torchtitan's MoE kernel), shapes chosen "
                    "D-optimally over log2 groups, tokens per group, n, k",
    "attention": "torch.nn.functional.scaled_dot_product_attention, unmasked, FLOPs counted as FlashAttention's "
                 "benchmarks count them (4·b·h·s²·d forward, 2.5x backward)",
    "memory_bound": "device-to-device copy, read + write counted",
    "launch": "launch_s: a tiny kernel run back to back (GPU: replayed from a CUDA graph; CPU: the dispatcher); "
              "host_op_s: host time of one eager operator that autograd records",
    "collectives": "torch.distributed all-reduce, all-gather, reduce-scatter and send/recv (gloo on CPU, NCCL on "
                   "GPU), best of 5 after 2 warm-ups, as nccl-tests' bus bandwidth",
}


class KernelProfileError(ValueError):
    """A kernel profile request or file that cannot be used as given; the message says what to change."""


@dataclass(frozen=True)
class Section:
    """One thing to measure: `key` names where its answer goes (e.g. 'gemm.bf16', 'attention.flash')."""

    key: str
    kind: str
    args: dict[str, Any]


def sections(device_kind: str, gemm_budget: int = 24, grouped_budget: int = 12, seed: int = 0,
             backends: tuple[str, ...] = (), precisions: dict[str, Any] | None = None) -> list[Section]:
    """What a profile of a `device_kind` ('cpu' or 'cuda') device measures, in order (the intra- and inter-node
    collectives are run by the caller, which knows the nodes). `backends`: the attention backends this device has."""
    grid = GRIDS[device_kind]
    precs = precisions or PRECISIONS[device_kind]
    gemm = [list(s) for s in d_optimal(gemm_candidates(grid), gemm_budget, seed)]
    grouped = [list(s) for s in d_optimal(grouped_candidates(grid), grouped_budget, seed)]
    out = [Section(f"gemm.{p}", "gemm", {"precision": p, "shapes": gemm}) for p in precs["gemm"]]
    out += [Section(f"grouped_gemm.{p}", "grouped_gemm", {"precision": p, "shapes": grouped}) for p in precs["grouped_gemm"]]
    out += [Section(f"attention.{b}", "attention", {"backend": b, "precision": precs["attention"],
                                                     "shapes": [list(s) for s in attention_shapes(grid)]}) for b in backends]
    out += [Section("memory_bound", "memory_bound", {"sizes": list(grid.copy_bytes)}),
            Section("launch_s", "launch", {})]
    return out


class NodeProfiler:
    """Measures sections on this process's device: `cpu` (one thread, as one rank of a `cpu` cluster) or `cuda`."""

    def __init__(self, device_kind: str) -> None:
        import torch

        if device_kind == "cuda" and not torch.cuda.is_available():
            raise KernelProfileError("--device cuda: no CUDA GPU is visible on this node (torch.cuda.is_available() is "
                                     "False); run on a GPU node or use --device cpu")
        self.kind = device_kind
        self.device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
        if device_kind == "cpu":
            torch.set_num_threads(1)

    def attention_backends(self) -> list[str]:
        from predictor.measure.kernels import attention_backends

        return list(attention_backends(self.device))

    def identity(self) -> dict[str, Any]:
        """This node's hardware and software: what the profile's provenance records and `revalidate` compares."""
        import torch

        from predictor.measure.machine import cpu_model_name

        ident = {"cpu": cpu_model_name(), "cores": os.cpu_count(), "torch": torch.__version__}
        if self.kind == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            ident.update(gpu=props.name, gpus=torch.cuda.device_count(), memory_bytes=props.total_memory,
                         cuda=torch.version.cuda, sms=props.multi_processor_count)
        return ident

    def measure(self, section: Section) -> Any:
        """The section's answer (JSON-able); raises where this device cannot run it (the caller records why)."""
        from predictor.measure import kernels as k

        a, dev = section.args, self.device
        if section.kind == "gemm":
            return [[*s, k.gemm_rate(*s, a["precision"], dev)] for s in a["shapes"]]
        if section.kind == "grouped_gemm":
            return [[*s, k.grouped_gemm_rate(*s, a["precision"], dev)] for s in a["shapes"]]
        if section.kind == "attention":
            backend = k.attention_backends(dev)[a["backend"]]
            rates = [(s[0], s[1], *k.attention_rates(*s, a["precision"], dev, backend)) for s in a["shapes"]]
            return {"fwd": [[s, d, f] for s, d, f, _ in rates], "bwd": [[s, d, b] for s, d, _, b in rates]}
        if section.kind == "memory_bound":
            return [[2 * size, k.copy_rate(size, dev)] for size in a["sizes"]]
        if section.kind == "launch":
            return {"launch_s": k.launch_seconds(dev), "host_op_s": k.host_op_seconds(dev)}
        raise KernelProfileError(f"unknown profile section kind {section.kind!r}")

    @property
    def backend(self) -> str:
        return "nccl" if self.kind == "cuda" else "gloo"

    def collectives(self, sizes: list[int], world: int, ranks: list[int] | None = None, addr: str = "127.0.0.1",
                    port: int | None = None) -> dict[str, list[list[float]]]:
        """{op: [[bytes, bus bytes/s], ...]} of a group of `world` ranks: all of them on this node by default
        (inside the node), or this node's `ranks` of a group across nodes meeting at rank 0's `addr`:`port`
        ({} on a node without rank 0: rank 0's node reports)."""
        from predictor.measure.collectives import benchmark_collectives, bus_bandwidth

        points = benchmark_collectives(tuple(sizes), world, backend=self.backend, ranks=ranks, addr=addr, port=port,
                                       timeout_s=300.0)
        out: dict[str, list[list[float]]] = {}
        for p in points:
            out.setdefault(p.op, []).append([p.bytes, bus_bandwidth(p)])
        return out

    def rendezvous(self, addr: str = "127.0.0.1") -> tuple[str, int]:
        """`addr` (this node's address other nodes reach it at) and a port free on it: where a group across nodes
        meets (rank 0 here)."""
        from predictor.measure.collectives import free_port_on

        return addr, free_port_on(addr)

    def ranks_per_node(self, wanted: int) -> int:
        """Ranks of a collective inside this node: its GPUs on CUDA, `wanted` processes on a CPU."""
        import torch

        return torch.cuda.device_count() if self.kind == "cuda" else wanted


def _median_points(answers: list[list[list[float]]]) -> tuple[list[list[float]], float]:
    """Point-wise median of the last column over nodes (same shapes on every node), and the largest spread."""
    rates = np.array([[p[-1] for p in a] for a in answers], dtype=float)
    med = np.median(rates, axis=0)
    spread = float(np.max(rates.max(0) / np.maximum(rates.min(0), 1e-30) - 1)) if rates.size else 0.0
    return [[*p[:-1], float(r)] for p, r in zip(answers[0], med)], spread


def combine(answers: list[Any]) -> tuple[Any, float]:
    """One answer from several nodes' answers of a section (the median of each figure) and its spread over the
    nodes (max/min - 1 of the figure that varies most): a node far off says the cluster is not one device."""
    first = answers[0]
    if isinstance(first, list):
        return _median_points(answers)
    if isinstance(first, dict) and all(isinstance(v, list) for v in first.values()):
        parts = {key: _median_points([a[key] for a in answers]) for key in first}
        return {key: v for key, (v, _) in parts.items()}, max(s for _, s in parts.values())
    values = {key: [a[key] for a in answers] for key in first}
    spread = max(max(v) / max(min(v), 1e-30) - 1 for v in values.values())
    return {key: float(np.median(v)) for key, v in values.items()}, float(spread)


def device_name(identity: dict[str, Any]) -> tuple[str, str]:
    """(device, generation) a node identity names: the catalogue's name of its GPU, or 'cpu'."""
    from predictor.spec.hardware import GENERATIONS, catalogue_name

    if "gpu" not in identity:
        return "cpu", "cpu"
    try:
        name = catalogue_name(f"cuda:{identity['gpu']}")
    except KeyError:
        return re.sub(r"[^a-z0-9]+", "-", identity["gpu"].lower()).strip("-"), "unknown"
    return name, GENERATIONS.get(name, "unknown")


def new_profile(identities: list[dict[str, Any]], ranks_per_node: int) -> dict[str, Any]:
    """An empty profile of a cluster of nodes with these identities, with its provenance."""
    first = identities[0]
    name, gen = device_name(first)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    hardware = first.get("gpu") or first["cpu"]
    versions = f"torch {first['torch']}" + (f", CUDA {first['cuda']}" if first.get("cuda") else "")
    machine = {"nodes": identities, "ranks_per_node": ranks_per_node, "at": when}
    return {"device": name, "generation": gen,
            "sources": {"provenance": f"measured by `scaledl profile --kernels` on {len(identities)} node(s) of "
                                      f"{hardware} ({ranks_per_node} rank(s) per node), {versions}, {when}",
                        "machine": json.dumps(machine)},
            "gemm": {}, "grouped_gemm": {}, "attention": {}, "collectives": {}, "missing": {}}


def machine(profile: dict[str, Any]) -> dict[str, Any]:
    """The measured machine a profile records ({} for a profile from published figures)."""
    text = profile.get("sources", {}).get("machine")
    return json.loads(text) if text else {}


def place(profile: dict[str, Any], section: str, answer: Any, source: str) -> None:
    """Put a section's answer where the format keeps it and record how it was measured."""
    head, _, tail = section.partition(".")
    keys = [section]
    if head in ("gemm", "grouped_gemm"):
        profile.setdefault(head, {})[tail] = {"points": answer}
    elif head in ("attention", "collectives"):
        profile.setdefault(head, {})[tail] = answer
    elif head == "memory_bound":
        profile["memory_bound"] = {"points": answer}
    elif head == "launch_s":
        profile.update(answer)
        keys = list(answer)
    else:
        raise KernelProfileError(f"unknown profile section {section!r}")
    for key in keys:
        profile["sources"][key] = source
        profile.setdefault("missing", {}).pop(key, None)


def source_of(kind: str, nodes: int, spread: float) -> str:
    text = HOW[kind]
    return text if nodes < 2 else f"{text}; median over {nodes} nodes (largest spread between nodes {100 * spread:.0f} %)"


def done(profile: dict[str, Any]) -> set[str]:
    """The sections a (partial) profile already has an answer or a reason for."""
    return (set(profile["sources"]) | set(profile.get("missing", {}))) - {"provenance", "machine"}


def write(profile: dict[str, Any], path: str | Path) -> None:
    """Check the profile against the format and write it atomically (a reader sees the old file or the new one)."""
    from predictor.kernels.profile import parse_profile, write_profile

    write_profile(parse_profile(profile, str(path)), path)


def read(path: str | Path) -> dict[str, Any]:
    """A profile file as its JSON object, checked against the format."""
    from predictor.kernels.profile import parse_profile, profile_json

    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise KernelProfileError(f"{path}: not a readable kernel profile ({type(err).__name__}: {err})") from None
    return profile_json(parse_profile(raw, str(path)))


OnSection = Callable[[str, int, int], None]


class Nodes(Protocol):
    """The nodes a profile is measured on: `call` runs a `NodeProfiler` method on every node (all at once where
    they are remote) and returns their answers in node order; `call_each` runs it with each node's own arguments."""

    def call(self, method: str, *args: Any) -> list[Any]: ...

    def call_each(self, method: str, args: list[tuple]) -> list[Any]: ...


class ThisNode:
    """This process as the one node of a profile (no Ray): what `bench/cuda_profile.py` measures with."""

    def __init__(self, device_kind: str) -> None:
        self.profiler = NodeProfiler(device_kind)

    def call(self, method: str, *args: Any) -> list[Any]:
        return [run_method(self.profiler, method, *args)]

    def call_each(self, method: str, args: list[tuple]) -> list[Any]:
        return [run_method(self.profiler, method, *a) for a in args]


def run_method(profiler: NodeProfiler, method: str, *args: Any) -> Any:
    """`profiler.method(*args)`; a section's measurement answers (True, figures) or (False, why this device cannot
    run it: fp8 on a GPU without it is a result, not a failure)."""
    if method != "measure":
        return getattr(profiler, method)(*args)
    try:
        return True, profiler.measure(*args)
    except Exception as err:  # noqa: BLE001 - see above
        return False, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]


def starting_profile(path: Path, resume: bool, identities: list[dict[str, Any]], ranks: int) -> dict[str, Any]:
    """The profile to fill: the file at `path` when resuming one measured on the same hardware, else a new one."""
    if not path.exists():
        return new_profile(identities, ranks)
    if not resume:
        raise KernelProfileError(f"{path} exists; pass --resume to complete it, or choose another --kernels path")
    profile = read(path)
    before = [{k: n.get(k) for k in ("cpu", "gpu", "torch")} for n in machine(profile).get("nodes", [])]
    now = [{k: n.get(k) for k in ("cpu", "gpu", "torch")} for n in identities]
    if before[:1] != now[:1]:
        raise KernelProfileError(f"--resume: {path} was measured on {before[:1]}, this cluster is {now[:1]}; "
                                 f"write a new profile (another --kernels path)")
    return profile


def measure_profile(nodes: Nodes, device_kind: str, path: str | Path, resume: bool = False, gemm_shapes: int = 24,
                    grouped_shapes: int = 12, procs: int = 2, seed: int = 0,
                    on_section: OnSection | None = None) -> dict[str, Any]:
    """Measure every section of a profile on `nodes` into `path`, writing it after each section; with `resume`,
    only the sections the file lacks."""
    path = Path(path)
    identities = nodes.call("identity")
    ranks = nodes.call("ranks_per_node", procs)[0]
    profile = starting_profile(path, resume, identities, ranks)
    todo = sections(device_kind, gemm_shapes, grouped_shapes, seed, tuple(nodes.call("attention_backends")[0]))
    steps = [s.key for s in todo] + ["collectives.intra_node", "collectives.inter_node"]
    finished = done(profile)

    def step(key: str, measure: Callable[[], None]) -> None:
        if key not in finished:
            measure()
            write(profile, path)
        if on_section:
            on_section(key, steps.index(key) + 1, len(steps))

    def section_of(section: Section) -> None:
        answers = nodes.call("measure", section)
        failed = [why for ok, why in answers if not ok]
        if failed:
            profile["missing"][section.key] = failed[0]
        else:
            value, spread = combine([answer for _, answer in answers])
            place(profile, section.key, value, source_of(section.kind, len(answers), spread))

    def intra_node() -> None:
        if ranks < 2:
            profile["missing"]["collectives.intra_node"] = "one GPU per node: no link inside a node to measure"
            return
        value, spread = combine(nodes.call("collectives", sizes, ranks))
        place(profile, "collectives.intra_node", value,
              source_of("collectives", len(identities), spread) + f"; {ranks} ranks inside a node")

    def inter_node() -> None:
        if len(identities) < 2:
            profile["missing"]["collectives.inter_node"] = "one node: no link between nodes to measure"
            return
        addr, port = nodes.call("rendezvous")[0]
        world = len(identities)
        answers = nodes.call_each("collectives", [(sizes, world, [i], addr, port) for i in range(world)])
        place(profile, "collectives.inter_node", answers[0], HOW["collectives"] + f"; one rank on each of {world} nodes")

    sizes = list(GRIDS[device_kind].collective_bytes)
    for section in todo:
        step(section.key, lambda section=section: section_of(section))
    step("collectives.intra_node", intra_node)
    step("collectives.inter_node", inter_node)
    return profile


@dataclass(frozen=True)
class Recheck:
    """One section re-measured: the fresh figure over the stored one at each re-measured point."""

    section: str
    ratios: list[float]

    @property
    def deviation(self) -> float:
        """The median |fresh / stored - 1| over the section's points."""
        return float(np.median(np.abs(np.asarray(self.ratios) - 1.0)))


def recheck_sections(profile: dict[str, Any], per_section: int = 4, seed: int = 0) -> list[tuple[Section, list]]:
    """(section to measure again, the stored points it re-measures) for every measured section of a profile: up to
    `per_section` of its points, the smallest and largest shapes always among them (where a device drifts, a
    throttled clock shows on the largest, a slower host on the smallest), and launch and host costs."""
    rng = np.random.default_rng(seed)

    def pick(points: list) -> list:
        if len(points) <= per_section:
            return points
        work = [float(np.prod(p[:-1])) for p in points]
        ends = {int(np.argmin(work)), int(np.argmax(work))}
        rest = [i for i in rng.permutation(len(points)) if i not in ends][:per_section - len(ends)]
        return [points[i] for i in sorted(ends | set(rest))]

    out: list[tuple[Section, list]] = []
    for kind in ("gemm", "grouped_gemm"):
        for precision, table in profile.get(kind, {}).items():
            stored = pick(table.get("points", []))
            if stored:
                shapes = [[int(v) for v in p[:-1]] for p in stored]
                out.append((Section(f"{kind}.{precision}", kind, {"precision": precision, "shapes": shapes}), stored))
    for backend, passes in profile.get("attention", {}).items():
        stored = pick(passes.get("fwd", []))
        if stored:
            grid = GRIDS["cpu" if profile["device"] == "cpu" else "cuda"]
            shapes = [[int(s), int(d), grid.attention_heads, max(1, grid.attention_tokens // int(s))] for s, d, _ in stored]
            precision = PRECISIONS["cpu" if profile["device"] == "cpu" else "cuda"]["attention"]
            out.append((Section(f"attention.{backend}", "attention",
                                {"backend": backend, "precision": precision, "shapes": shapes}), stored))
    stored = pick(profile.get("memory_bound", {}).get("points", []))
    if stored:
        out.append((Section("memory_bound", "memory_bound", {"sizes": [int(b) // 2 for b, _ in stored]}), stored))
    if "launch_s" in profile and "host_op_s" in profile:
        out.append((Section("launch_s", "launch", {}), [profile["launch_s"], profile["host_op_s"]]))
    return out


def recheck(nodes: Nodes, profile: dict[str, Any], per_section: int = 4, seed: int = 0) -> list[Recheck]:
    """Measure a sample of the profile's points again on `nodes` and compare: fresh over stored per point (a rate's
    ratio; for launch and host costs the stored over the fresh seconds, so above 1 is faster there too)."""
    out = []
    for section, stored in recheck_sections(profile, per_section, seed):
        answers = nodes.call("measure", section)
        fresh_answers = [answer for ok, answer in answers if ok]
        if not fresh_answers:
            continue
        fresh, _ = combine(fresh_answers)
        if section.kind == "launch":
            ratios = [stored[0] / fresh["launch_s"], stored[1] / fresh["host_op_s"]]
        elif section.kind == "attention":
            ratios = [f[-1] / s[-1] for f, s in zip(fresh["fwd"], stored)]
        else:
            ratios = [f[-1] / s[-1] for f, s in zip(fresh, stored)]
        out.append(Recheck(section.key, ratios))
    return out
