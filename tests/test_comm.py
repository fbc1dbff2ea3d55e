"""Collective cost formulas (α-β, ring/tree, hierarchical) and the α-β fit of measured points."""

import numpy as np
import pytest

from predictor.costs import comm
from predictor.measure.collectives import CollectivePoint, fit_link
from predictor.spec.hardware import GB, Link

NV = Link(100 * GB, 5e-6)
IB = Link(10 * GB, 20e-6)


def test_ring_allreduce_formula_paper_eq15():
    size, n = 1e9, 8
    expect = 2 * (n - 1) / n * size / NV.bandwidth + 2 * (n - 1) * NV.latency
    assert comm.allreduce(size, comm.Group(n, 1, NV, IB)) == pytest.approx(expect)


def test_tree_wins_for_small_messages_ring_for_large():
    g = comm.Group(64, 1, NV, IB)
    small, large = 1e3, 1e9
    ring_small = 2 * 63 / 64 * small / NV.bandwidth + 2 * 63 * NV.latency
    assert comm.allreduce(small, g) == pytest.approx(6 * (NV.latency + small / NV.bandwidth))  # log-depth latency
    assert comm.allreduce(small, g) < ring_small
    assert comm.allreduce(large, g) == pytest.approx(2 * 63 / 64 * large / NV.bandwidth + 2 * 63 * NV.latency)


def test_hierarchical_allreduce_is_rs_inside_ar_across_ag_inside():
    size, g, k = 4e8, 8, 4
    grp = comm.Group(g, k, NV, IB)
    inside = (g - 1) / g * size / NV.bandwidth + (g - 1) * NV.latency
    across = comm.allreduce(size / g, comm.Group(1, k, NV, IB))
    assert comm.allreduce(size, grp) == pytest.approx(2 * inside + across)
    # crossing nodes costs more than staying inside one node of the same size
    assert comm.allreduce(size, grp) > comm.allreduce(size, comm.Group(g * k, 1, NV, IB))


def test_reduce_scatter_plus_allgather_equals_ring_allreduce():
    size, n = 3e8, 4
    grp = comm.Group(n, 1, NV, IB)
    ring = 2 * (n - 1) / n * size / NV.bandwidth + 2 * (n - 1) * NV.latency
    assert comm.reduce_scatter(size, grp) + comm.allgather(size, grp) == pytest.approx(ring)


def test_vectorised_and_trivial_groups():
    sizes = np.array([1e3, 1e6, 1e9])
    out = comm.allreduce(sizes, comm.Group(8, 2, NV, IB))
    assert out.shape == (3,) and np.all(np.diff(out) > 0)
    assert np.all(comm.allreduce(sizes, comm.Group(1, 1, NV, IB)) == 0)
    assert comm.p2p(1e9, IB) == pytest.approx(0.1 + 20e-6)


@pytest.mark.parametrize("world", [2, 8])
def test_fit_recovers_the_link_that_the_prediction_formulas_were_priced_with(world):
    # Points priced by predictor.costs.comm itself: the fitted link must reproduce them through the same
    # formulas, including the all-reduce branch (recursive doubling always wins for 2 ranks).
    truth = Link(2.5e9, 30e-6)
    group = comm.Group(world, 1, truth, truth)
    price = {"all_reduce": lambda s: comm.allreduce(s, group), "all_gather": lambda s: comm.allgather(s, group),
             "reduce_scatter": lambda s: comm.reduce_scatter(s, group), "send_recv": lambda s: comm.p2p(s, truth)}
    points = [CollectivePoint(op, size, world, float(fn(size))) for op, fn in price.items()
              for size in (1024, 65536, 1 << 22, 1 << 26)]
    link = fit_link(points)
    assert link.latency == pytest.approx(truth.latency, rel=1e-6)
    assert link.bandwidth == pytest.approx(truth.bandwidth, rel=1e-6)


def test_each_op_runs_on_its_own_measured_link_inside_the_node():
    ops = {"all_reduce": Link(1 * GB, 300e-6), "all_gather": Link(2 * GB, 150e-6),
           "reduce_scatter": Link(0.5 * GB, 200e-6), "send_recv": Link(6 * GB, 80e-6)}
    flat = comm.Group(2, 1, NV, IB, tuple(sorted(ops.items())))
    size = 4e6
    assert comm.allreduce(size, flat) == pytest.approx(300e-6 + size / (1 * GB))  # recursive doubling, 2 ranks
    assert comm.allgather(size, flat) == pytest.approx(150e-6 + size / 2 / (2 * GB))
    assert comm.reduce_scatter(size, flat) == pytest.approx(200e-6 + size / 2 / (0.5 * GB))
    assert flat.intra_for("send_recv") == ops["send_recv"] and flat.intra_for("broadcast") == NV
    # across nodes: the inside steps on the ops' own links, the node-to-node step on the network's
    hier = comm.Group(2, 4, NV, IB, tuple(sorted(ops.items())))
    across = comm.allreduce(size / 2, comm.Group(1, 4, NV, IB))
    assert comm.allreduce(size, hier) == pytest.approx(comm.reduce_scatter(size, flat) + comm.allgather(size, flat) + across)


def test_per_op_fit_recovers_each_ops_link():
    from predictor.measure.collectives import fit_op_links

    ops = {"all_reduce": Link(1.8e9, 330e-6), "all_gather": Link(1.1e9, 150e-6),
           "reduce_scatter": Link(0.46e9, 220e-6), "send_recv": Link(5.8e9, 78e-6)}
    group = comm.Group(2, 1, NV, NV, tuple(sorted(ops.items())))
    price = {"all_reduce": lambda s: comm.allreduce(s, group), "all_gather": lambda s: comm.allgather(s, group),
             "reduce_scatter": lambda s: comm.reduce_scatter(s, group), "send_recv": lambda s: comm.p2p(s, ops["send_recv"])}
    points = [CollectivePoint(op, size, 2, float(fn(size))) for op, fn in price.items() for size in (1024, 1 << 16, 1 << 22)]
    fitted = fit_op_links(points)
    assert set(fitted) == set(ops)
    for op, link in ops.items():
        assert fitted[op].latency == pytest.approx(link.latency, rel=1e-6)
        assert fitted[op].bandwidth == pytest.approx(link.bandwidth, rel=1e-6)
