"""What a device's eager operators cost, learned from its layer timings: the base of non-GEMM layers.

The analytical model prices a layer that is not a matrix product by its input and output bytes at
the device's bandwidth. Eager PyTorch runs such a layer as a chain of operators: BERT's GELU is one,
GPT-2's tanh GELU eight, T5's RMSNorm seven, each with its own call cost and per-element work. So
the roofline's error depends on the architecture (on the CPU dataset GPT-2's GELU takes 7x its
roofline, BERT's 3x), and a regressor correcting the roofline from the other architectures cannot
know it. Here each operator type gets a cost per call and per element, fitted by non-negative least
squares on the relative error over the layer timings of every non-GEMM layer, and a layer costs the
sum of its operators. An operator type that never ran in training is left out of that sum (most
are views and index arithmetic; pricing a layer half by operators and half by the roofline would
mix two bases under one correction); a layer none of whose operators ran keeps its analytical time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from predictor.costs.parallel import shard_nodes
from predictor.graph.layer_graph import LayerGraph, LayerNode
from predictor.plan.share import RankShare


@dataclass(frozen=True)
class OpRow:
    """One timed non-GEMM layer: its node (whose `ops` it ran) at micro-batch `mbs`, seconds per occurrence."""

    node: LayerNode
    mbs: int
    fwd_s: float
    bwd_s: float


@dataclass
class OpCosts:
    """Seconds per call and per element of each operator type, forward and backward (the backward
    priced on the forward's operators: autograd runs one backward per forward op)."""

    ops: list[str]
    fwd: np.ndarray  # (2 · len(ops),): per call of each op, then per element of each op
    bwd: np.ndarray

    @classmethod
    def fit(cls, rows: list[OpRow]) -> "OpCosts | None":
        """None without rows that name their operators (graphs built before nodes recorded them)."""
        rows = [r for r in rows if r.node.ops and r.fwd_s > 0]
        if not rows:
            return None
        ops = sorted({op for r in rows for op in r.node.ops})
        x = np.stack([_vector(r.node.ops, ops, r.mbs) for r in rows])
        scale = np.where(x.max(0) > 0, x.max(0), 1.0)  # columns to one range: nnls is scale-sensitive

        def relative_fit(y: np.ndarray) -> np.ndarray:
            y = np.maximum(y, 1e-9)
            return nnls(x / scale / y[:, None], np.ones(len(y)), maxiter=50 * x.shape[1])[0] / scale

        return cls(ops, relative_fit(np.asarray([r.fwd_s for r in rows])),
                   relative_fit(np.asarray([r.bwd_s for r in rows])))

    def apply(self, graph: LayerGraph, tp: int, sp: bool, heads: int | None, mbs: int, base: np.ndarray) -> np.ndarray:
        """`base` (n, 2) with each non-GEMM node priced by its operators seen in training.
        Under tensor parallelism a node's elements shrink as its inputs and outputs do on one rank."""
        sharded = shard_nodes(graph, RankShare.split({"tp": tp}, sp), heads)
        whole = shard_nodes(graph, RankShare(), heads)
        out = base.copy()
        for i, node in enumerate(graph.nodes):
            if sharded.gemm_m[i] > 0 or not node.ops:
                continue
            share = sharded.io_elems[i] / whole.io_elems[i] if whole.io_elems[i] > 0 else 1.0
            v = _vector(node.ops, self.ops, mbs * share)
            fwd, bwd = float(v @ self.fwd), float(v @ self.bwd)
            if fwd > 0:
                out[i] = (fwd, max(bwd, 1e-9))
        return out


def is_gemm(graph: LayerGraph, index: int, heads: int | None) -> bool:
    """Whether node `index` is a matrix product (priced by the roofline, not by its operators)."""
    return bool(shard_nodes(graph, RankShare(), heads).gemm_m[index] > 0)


def _vector(node_ops: dict[str, tuple[int, float]], ops: list[str], elems_scale: float) -> np.ndarray:
    calls = [node_ops[o][0] if o in node_ops else 0 for o in ops]
    elems = [node_ops[o][1] * elems_scale if o in node_ops else 0.0 for o in ops]
    return np.asarray(calls + elems, dtype=float)
