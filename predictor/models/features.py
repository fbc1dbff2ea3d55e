"""Features of the learned predictors, built from a workload, its layer graph and a plan.

Three views, as in the ScaleDL paper:
- per layer (Eq. 7): h_hp ‖ h_dev ‖ h_struct ‖ h_cm of one layer under a plan's micro-batch and
  tensor-parallel sharding, for the per-kind regressors;
- per graph (Eq. 3): node and edge tensors of the layer graph for the GNN;
- global Z (Eq. 14): the plan, training settings and device figures of one (workload, plan).

Everything is log-scaled: times, FLOPs and bytes span six orders of magnitude over the models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from predictor.hardware import Device
from predictor.layer_graph import LAYER_KINDS, LayerGraph
from predictor.parallel import shard_nodes
from predictor.plan import RECOMPUTE_MODES, SCHEDULES, Plan
from predictor.prediction import TIME_PARTS
from predictor.workload import WorkloadSpec

if TYPE_CHECKING:  # pragma: no cover
    from predictor.models.layerwise import LayerObs

BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
GROUPS = ("pre", "block", "enc", "dec", "post")
TP_ROLES = ("column", "row", "heads", "vocab", "replicated")
# The correction factors' time terms: the paper's α (compute) and β (dp comm), plus this project's.
TERMS: tuple[str, ...] = ("compute", "dp_comm", "tp_comm", "pp", "optimizer")
TERM_OF_PART = {"compute": "compute", "dp_comm": "dp_comm", "tp_comm": "tp_comm",
                 "pp_bubble": "pp", "pp_p2p": "pp", "optimizer": "optimizer"}
assert set(TERM_OF_PART) == set(TIME_PARTS), "every time part must map to a correction term"


_GRAPHS: dict[str, LayerGraph] = {}


def graph_of(spec: WorkloadSpec) -> LayerGraph:
    """The layer graph of a spec's model, built once per distinct model (building traces the model)."""
    key = spec.model.model_dump_json()
    if key not in _GRAPHS:
        from predictor.graph import graph_for

        _GRAPHS[key] = graph_for(spec.model)
    return _GRAPHS[key]


@dataclass(frozen=True)
class Sample:
    """One measured training iteration: what ran and how long it took (and its peak memory)."""

    spec: WorkloadSpec
    plan: Plan
    iter_time_s: float
    peak_memory_gib: float | None = None
    model: str = ""  # architecture label the evaluation splits by (t5, gpt2, ...)
    config_id: str = ""


def by_workload(samples: Sequence[Sample]) -> Iterator[tuple[WorkloadSpec, LayerGraph, list[int]]]:
    """Sample indices grouped by workload, so each group shares one graph and one batched prediction."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.spec.model_dump_json(), []).append(i)
    for idx in groups.values():
        spec = samples[idx[0]].spec
        yield spec, graph_of(spec), idx


@dataclass
class TrainingData:
    """What the learned predictors fit on: measured iterations, measured layers, where they came from."""

    samples: list[Sample]
    layers: list["LayerObs"] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LayerKey:
    """What a layer's time depends on under a plan: micro-batch, tensor sharding, precision, device."""

    mbs: int
    tp: int
    sp: bool
    precision: str
    device: str
    heads: int | None = None  # the model's heads (how the attention core shards)


def layer_key(spec: WorkloadSpec, plan: Plan) -> LayerKey:
    return LayerKey(plan.mbs, plan.tp, plan.sp and plan.tp > 1, spec.training.precision, spec.cluster.device,
                    spec.model.heads)


def terms_from_breakdown(breakdown: dict[str, float]) -> np.ndarray:
    """Group a Prediction's TIME_PARTS seconds into the TERMS the correction factors scale."""
    out = np.zeros(len(TERMS))
    for part, seconds in breakdown.items():
        out[TERMS.index(TERM_OF_PART[part])] += seconds
    return out


def _log(x: float) -> float:
    return math.log1p(max(float(x), 0.0))


def layer_matrix(graph: LayerGraph, key: LayerKey, device: Device, attr_keys: Sequence[str],
                 index: Sequence[int]) -> np.ndarray:
    """Eq. 7 features of nodes `index` at `key`: h_hp ‖ h_dev ‖ h_struct ‖ h_cm, per micro-batch on one tp rank.

    Sharding comes from `predictor.parallel.shard_nodes` (the same the analytical model uses).
    """
    sh = shard_nodes(graph, key.tp, key.sp, key.heads)
    idx = np.asarray(index, dtype=int)
    b, mb = BYTES[key.precision], key.mbs
    n = len(idx)

    def col(values) -> np.ndarray:
        return np.log1p(np.maximum(np.broadcast_to(np.asarray(values, dtype=float), (n,)), 0.0))

    attrs = [[graph.nodes[i].attrs.get(a, 0) for i in idx] for a in attr_keys]
    cols = [
        col(mb), col(graph.tokens),  # h_hp
        col(device.flops(key.precision)), col(device.mem_bandwidth),  # h_dev
        *(col(a) for a in attrs), col(key.tp), col(sh.gemm_m[idx] * mb), col(sh.gemm_n[idx]),  # h_struct
        col(sh.gemm_k[idx]), col(sh.gemm_batch[idx]),
        col(sh.fwd_flops[idx] * mb), col(sh.bwd_flops[idx] * mb), col(sh.params[idx] * b),  # h_cm
        col(sh.act_elems[idx] * mb * b), col(sh.io_elems[idx] * mb * b),
    ]
    return np.stack(cols, axis=1)


# ---------------------------------------------------------------- graph view (GNN)

NODE_DIM = len(LAYER_KINDS) + len(GROUPS) + len(TP_ROLES) + 7
EDGE_DIM = 2


def node_matrix(graph: LayerGraph, layer_s: np.ndarray) -> np.ndarray:
    """Node features v_i: kind, position and sharding role, FLOPs, sizes, and the predicted layer time.

    `layer_s` is each node's predicted fwd+bwd seconds per micro-batch under the plan (all counts).
    """
    total = float(np.sum(layer_s)) or 1.0
    rows = []
    for node, t in zip(graph.nodes, layer_s):
        one_hot = [float(node.kind == k) for k in LAYER_KINDS] + [float(node.group == g) for g in GROUPS]
        one_hot += [float(node.tp == r) for r in TP_ROLES]
        rows.append(one_hot + [
            math.log(node.count), _log(node.fwd_flops) / 10, _log(node.bwd_flops) / 10, _log(node.params) / 10,
            _log(node.act_elems) / 10, math.log(max(t, 1e-12)) / 10, float(t) / total,
        ])
    return np.asarray(rows, dtype=np.float32)


def edge_tensors(graph: LayerGraph) -> tuple[np.ndarray, np.ndarray]:
    """Edges both ways with (log elements, direction): data flows forward, gradients flow back."""
    if not graph.edges:
        return np.zeros((2, 0), dtype=np.int64), np.zeros((0, EDGE_DIM), dtype=np.float32)
    src, dst, elems = (np.asarray(c) for c in zip(*graph.edges))
    index = np.concatenate([np.stack([src, dst]), np.stack([dst, src])], axis=1).astype(np.int64)
    size = np.log1p(np.asarray(elems, dtype=float)) / 10
    attr = np.concatenate([np.stack([size, np.ones_like(size)], 1), np.stack([size, -np.ones_like(size)], 1)])
    return index, attr.astype(np.float32)


# ---------------------------------------------------------------- global view Z

GLOBAL_DIM = 24 + 4 + 3 + 3 + 2 + 3


def global_row(spec: WorkloadSpec, graph: LayerGraph, plan: Plan, device: Device, terms: np.ndarray) -> list[float]:
    """Z: training settings, plan degrees, device and links, model size, and each term's share of the time.

    `device` carries the cluster's link overrides (`get_device(name, cluster)`).
    """
    gb = spec.training.global_batch
    m = plan.microbatches(gb)
    total = float(terms.sum()) or 1.0
    row = [
        math.log(gb), math.log(plan.mbs), math.log(max(m, 1)), math.log2(plan.dp), math.log2(plan.tp),
        math.log2(plan.pp), math.log(plan.v), float(plan.sp),
        math.log(device.flops(spec.training.precision)) / 10, math.log(device.mem_bandwidth) / 10,
        math.log(device.intra_node.bandwidth) / 10, math.log(device.inter_node.bandwidth) / 10, math.log(spec.cluster.nodes), math.log(spec.cluster.gpus_per_node),
        _log(graph.params) / 10, math.log(max(graph.tokens, 1)), _log(graph.fwd_flops) / 10, math.log(graph.num_blocks),
        math.log(max(total, 1e-9)),
        *(terms / total),
    ]
    row += [float(plan.zero == z) for z in range(4)]
    row += [float(plan.recompute == r) for r in RECOMPUTE_MODES]
    row += [float(plan.schedule == s) for s in SCHEDULES]
    row += [float(spec.training.optimizer == o) for o in ("adam", "sgd")]
    row += [float(spec.training.precision == p) for p in ("fp32", "fp16", "bf16")]
    return row
