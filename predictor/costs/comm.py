"""Collective and point-to-point costs on a hierarchical (intra-node / inter-node) topology.

α-β model (Thakur, Rabenseifner & Gropp 2005; the ScaleDL paper Eq. 15): a ring step costs the
link latency α plus bytes / bandwidth. Bandwidths are a link's *bus* bandwidth (NCCL busBw), so
the (n-1)/n factors below are the algorithm's, not the link's. A catalogue link prices its ring steps
from its generation's bus-bandwidth curve instead (`predictor.costs.collective_curve`: NCCL's protocols up
to the cited plateau), and its flat all-reduce is the ring NCCL runs inside a node. A group of n ranks that spans
nodes has `n_intra` ranks per node and `n_inter = n / n_intra` nodes; a collective over it is
run hierarchically (reduce-scatter inside the node, the collective across nodes on 1/n_intra of
the data, all-gather inside), as NCCL does for multi-node rings/trees. All functions take
numpy arrays or floats of bytes and return seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictor.costs import collective_curve as curve
from predictor.spec.hardware import Link


@dataclass(frozen=True)
class Group:
    """A communication group: ranks per node and number of nodes, with the links it uses."""

    n_intra: int
    n_inter: int
    intra: Link
    inter: Link
    intra_ops: tuple[tuple[str, Link], ...] = ()  # a measured device: each collective's own α-β inside the node

    @property
    def size(self) -> int:
        return self.n_intra * self.n_inter

    def intra_for(self, op: str) -> Link:
        """The intra-node link `op` runs on: the α-β fitted to that op alone where it was measured (gloo's
        all-reduce, all-gather, reduce-scatter and send/recv run different algorithms), else the node's."""
        return dict(self.intra_ops).get(op, self.intra)


def _ring_allreduce(size, n: int, link: Link):
    if n <= 1:
        return np.zeros_like(np.asarray(size, dtype=float))
    return curve.seconds(2 * (n - 1) / n * np.asarray(size, dtype=float), 2 * (n - 1), link, "all_reduce")


def _tree_allreduce(size, n: int, link: Link):
    """Latency-optimal all-reduce (recursive doubling, Thakur et al. 2005): ceil(log2 n)·(α + S/B).

    It beats the ring for small messages, where NCCL also switches away from rings.
    """
    if n <= 1:
        return np.zeros_like(np.asarray(size, dtype=float))
    return np.ceil(np.log2(n)) * (link.latency + np.asarray(size, dtype=float) / link.bandwidth)


def tree_beats_ring(size, n: int, link: Link):
    """Whether recursive doubling is the cheaper flat all-reduce of `size` bytes over n ranks (the branch
    `allreduce` prices; the α-β fit of measured points follows it)."""
    return _tree_allreduce(size, n, link) < _ring_allreduce(size, n, link)


def _ring_half(size, n: int, link: Link, op: str):
    """Reduce-scatter or all-gather (`op`) of `size` bytes (the full buffer) over a ring of n ranks."""
    if n <= 1:
        return np.zeros_like(np.asarray(size, dtype=float))
    return curve.seconds((n - 1) / n * np.asarray(size, dtype=float), n - 1, link, op)


def allreduce(size, group: Group):
    """All-reduce of `size` bytes: at each level the faster of ring and recursive doubling (NCCL picks per size),
    the ring over a link with a catalogue curve, whose protocols already price small messages."""
    g, k = group.n_intra, group.n_inter

    def flat(s, n, link):
        if curve.has_curve(link):
            return _ring_allreduce(s, n, link)
        return np.minimum(_ring_allreduce(s, n, link), _tree_allreduce(s, n, link))

    if k == 1:
        return flat(size, g, group.intra_for("all_reduce"))
    if g == 1:
        return flat(size, k, group.inter)
    size = np.asarray(size, dtype=float)
    inside = (_ring_half(size, g, group.intra_for("reduce_scatter"), "reduce_scatter")
              + _ring_half(size, g, group.intra_for("all_gather"), "all_gather"))
    return inside + flat(size / g, k, group.inter)


def _half_collective(size, group: Group, op: str):
    """Reduce-scatter or all-gather (`op`) of a `size`-byte buffer: a ring over the node's g ranks on the
    op's intra-node link; across nodes each node's g NICs carry (k-1)/k of 1/g of the data between them."""
    g, k = group.n_intra, group.n_inter
    size = np.asarray(size, dtype=float)
    return _ring_half(size, g, group.intra_for(op), op) + _ring_half(size / g, k, group.inter, op)


def reduce_scatter(size, group: Group):
    """Reduce-scatter of a `size`-byte buffer (each rank ends with size/n)."""
    return _half_collective(size, group, "reduce_scatter")


def allgather(size, group: Group):
    """All-gather producing a `size`-byte buffer on every rank; same volume as reduce-scatter."""
    return _half_collective(size, group, "all_gather")


def p2p(size, link: Link):
    """One send/recv of `size` bytes over `link`."""
    return curve.seconds(size, 1, link, "send_recv")
