"""The bus-bandwidth curves collectives are priced from (predictor.costs.collective_curve, device_facts.json)."""

import numpy as np
import pytest

from predictor.costs import collective_curve as curve, comm
from predictor.spec.hardware import DEVICES, GB, Link, device_facts

SIZES = np.logspace(0, 11, 45)  # 1 B to 100 GB of bus bytes
OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "send_recv")
LINKS = {d.intra_node.generation: d.intra_node for d in DEVICES.values() if d} | \
        {d.inter_node.generation: d.inter_node for d in DEVICES.values() if d}
CURVED = {g: link for g, link in LINKS.items() if curve.has_curve(link)}


def bus_bandwidth(bus_bytes, steps: int, link: Link, op: str):
    """Bus bandwidth (bytes/s) `op` reaches at `bus_bytes`: what nccl-tests reports as busbw."""
    return np.asarray(bus_bytes, dtype=float) / curve.seconds(bus_bytes, steps, link, op)


def _plateau(generation: str, op: str) -> float:
    entries = {e["collective"]: e["busbw_gbps"] for e in device_facts()["collective_curves"] if e.get("link") == generation}
    return entries.get(op, entries["*"]) * GB


def test_every_nvlink_and_infiniband_generation_of_the_catalogue_has_a_curve():
    assert set(CURVED) == {"nvlink3", "nvlink4", "nvlink5", "ib-hdr", "ib-ndr", "ib-xdr"}


@pytest.mark.parametrize("generation", sorted(CURVED))
@pytest.mark.parametrize("op", OPS)
def test_bus_bandwidth_rises_with_size_to_the_cited_plateau(generation, op):
    busbw = bus_bandwidth(SIZES, 7, CURVED[generation], op)
    assert np.all(np.diff(busbw) >= 0)
    assert busbw[-1] == pytest.approx(_plateau(generation, op), rel=0.01)  # 100 GB: the plateau nccl-tests reaches
    assert np.all(busbw <= _plateau(generation, op) * (1 + 1e-9))


@pytest.mark.parametrize("generation", sorted(CURVED))
def test_small_messages_are_latency_bound(generation):
    link = CURVED[generation]
    t = curve.seconds(np.array([1.0, 1024.0]), 14, link, "all_reduce")
    assert t[1] == pytest.approx(t[0], rel=0.05)  # 1 B and 1 KB cost the same: the protocol's latency
    fastest = min(p.base_s + 14 * p.step_s for p in curve.protocols(generation, "all_reduce"))
    assert t[0] == pytest.approx(fastest, rel=1e-3)
    assert 2e-6 < t[0] < 50e-6  # microseconds, as nccl-tests' small-message times


def test_generations_differ_and_nodes_are_slower_than_nvlink():
    big = 1e10
    nvlink = [bus_bandwidth(big, 7, CURVED[g], "all_gather") for g in ("nvlink3", "nvlink4", "nvlink5")]
    ib = [bus_bandwidth(big, 7, CURVED[g], "all_gather") for g in ("ib-hdr", "ib-ndr", "ib-xdr")]
    assert nvlink == sorted(nvlink) and len(set(nvlink)) == 3 and ib == sorted(ib) and len(set(ib)) == 3
    assert max(ib) < min(nvlink)
    # NVLink SHARP lifts Hopper's and Blackwell's all-reduce above their ring; Ampere has none
    for g in ("nvlink4", "nvlink5"):
        assert bus_bandwidth(big, 14, CURVED[g], "all_reduce") > bus_bandwidth(big, 7, CURVED[g], "all_gather")
    assert bus_bandwidth(big, 14, CURVED["nvlink3"], "all_reduce") == pytest.approx(
        bus_bandwidth(big, 7, CURVED["nvlink3"], "all_gather"), rel=1e-3)


def test_collectives_over_catalogue_links_price_from_the_curve_others_keep_alpha_beta():
    h100 = DEVICES["h100"]
    group = comm.Group(8, 1, h100.intra_node, h100.inter_node)
    size = np.array([1e4, 1e6, 1e8, 1e10])
    assert np.allclose(comm.allreduce(size, group), curve.seconds(2 * 7 / 8 * size, 14, h100.intra_node, "all_reduce"))
    assert np.allclose(comm.allgather(size, group), curve.seconds(7 / 8 * size, 7, h100.intra_node, "all_gather"))
    assert np.allclose(comm.p2p(size, h100.inter_node), curve.seconds(size, 1, h100.inter_node, "send_recv"))
    # algorithm bandwidth: all-reduce moves 2(n-1)/n of the buffer per rank on the bus, all-gather (n-1)/n
    assert float(comm.allreduce(1e10, group)) > float(comm.allgather(1e10, group))
    override = Link(100 * GB, 5e-6)  # a cluster spec's own link: α-β, no curve
    assert not curve.has_curve(override)
    assert comm.p2p(1e6, override) == pytest.approx(1e6 / override.bandwidth + override.latency)
