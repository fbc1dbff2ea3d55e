"""Seconds of a collective over a catalogue link from its generation's public bus-bandwidth curve.

NCCL prices each call as latency + bytes / bandwidth for each of its protocols and runs the cheapest
(src/graph/tuning.cc): LL for small messages (a fraction of a microsecond per ring step, a quarter or a third
of the bus bandwidth), LL128 where that NCCL enables it, Simple for large ones (the full bus bandwidth after
several microseconds per step). With the plateau each link generation reaches per collective (nccl-tests
results, NCCL's link model and maintainers' figures: `collective_curves` in predictor/data/device_facts.json),
this is bus bandwidth against message size: latency-bound for small messages, rising in log size to the
cited plateau. `bus_bytes` is what nccl-tests' busbw counts (all-reduce 2(n-1)/n of the buffer, reduce-scatter,
all-gather and all-to-all (n-1)/n, send/recv the message), `steps` the ring steps NCCL's latency counts. A link
without a generation in the catalogue (measured, overridden by a cluster spec, Volta) keeps its α-β figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from predictor.spec.hardware import GB, Link, device_facts

PROTOCOLS = ("LL", "LL128", "Simple")
GATHERS = ("all_gather", "reduce_scatter")  # LL keeps a third of the bus bandwidth for these inside a node


@dataclass(frozen=True)
class Protocol:
    """One NCCL protocol's cost of a call: base latency, latency per ring step (s) and bus bandwidth (bytes/s)."""

    name: str
    base_s: float
    step_s: float
    bandwidth: float


@cache
def protocols(generation: str, op: str) -> tuple[Protocol, ...]:
    """The protocols NCCL runs `op` with over a link of `generation`; () where the catalogue has no plateau for it.
    Simple reaches the collective's own plateau (NVLS all-reduce above the ring's); LL and LL128 run the ring."""
    entries = device_facts()["collective_curves"]
    model = next(e["protocols"] for e in entries if "protocols" in e)
    plateau = {e["collective"]: e["busbw_gbps"] * GB for e in entries if e.get("link") == generation}
    if "*" not in plateau:
        return ()
    kind = "nvlink" if generation.startswith("nvlink") else "net"
    share = model["bandwidth_share"]
    out = []
    for name in PROTOCOLS:
        if name == "LL128" and generation not in model["ll128_links"]:
            continue
        if name == "Simple":
            bandwidth = plateau.get(op, plateau["*"])
        else:
            fraction = share["LL_gather"] if name == "LL" and kind == "nvlink" and op in GATHERS else share[name]
            bandwidth = plateau["*"] * fraction
        out.append(Protocol(name, model["base_latency_us"][name] * 1e-6, model["step_latency_us"][kind][name] * 1e-6,
                            bandwidth))
    return tuple(out)


def seconds(bus_bytes, steps: int, link: Link, op: str):
    """Seconds of `op` moving `bus_bytes` (array or float) in `steps` ring steps over `link`: the cheapest protocol
    on the generation's curve, else the α-β time (steps·latency + bytes / bandwidth)."""
    size = np.asarray(bus_bytes, dtype=float)
    protos = protocols(link.generation, op) if link.generation else ()
    if not protos:
        return size / link.bandwidth + steps * link.latency
    best = protos[0].base_s + steps * protos[0].step_s + size / protos[0].bandwidth
    for p in protos[1:]:
        best = np.minimum(best, p.base_s + steps * p.step_s + size / p.bandwidth)
    return best


def has_curve(link: Link) -> bool:
    """Whether collectives over `link` are priced from a catalogue curve (NCCL's ring protocols) rather than α-β."""
    return bool(link.generation and protocols(link.generation, "all_reduce"))
