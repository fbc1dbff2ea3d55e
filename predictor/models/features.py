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
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Sequence

import numpy as np

from predictor.costs.parallel import BYTES, shard_nodes
from predictor.graph.cache import graph_for
from predictor.graph.layer_graph import LAYER_KINDS, LayerGraph
from predictor.models.records import LayerKey, LayerObs
from predictor.plan import RECOMPUTE_MODES, SCHEDULES, TERM_OF_PART, Plan
from predictor.spec.hardware import Device
from predictor.spec.workload import WorkloadSpec

GROUPS = ("pre", "block", "enc", "dec", "post")
TP_ROLES = ("column", "row", "heads", "vocab", "replicated")
# The correction factors' time terms: the paper's α (compute) and β (dp comm), plus this project's;
# "overhead" is per-operator dispatch (framework) time, which no part of the analytical model carries.
TERMS: tuple[str, ...] = ("compute", "dp_comm", "tp_comm", "pp", "optimizer", "overhead")
DISPATCH_S = 20e-6  # reference cost of one eager operator call (the factor learns the real one)
# Devices whose operators run in the dispatching thread, so dispatch time adds to the iteration.
# On GPUs the host enqueues kernels asynchronously ahead of the device; what is left of launch
# cost is in the analytical per-kernel launch term.
SYNCHRONOUS_DEVICES = ("cpu",)
assert set(TERM_OF_PART.values()) <= set(TERMS), "every time part's correction term must be a term"


_GRAPHS: dict[str, LayerGraph] = {}


def graph_of(spec: WorkloadSpec) -> LayerGraph:
    """The layer graph of a spec's model, built once per distinct model.

    Building traces the model (seconds), and a dataset has hundreds of distinct small models.
    The graph builder stores a repeated block once with `count` = its repeats, so models that
    differ only in depth share one graph up to those counts: a depth-1 graph is built (and kept
    on disk by `predictor.graph.cache`) and restamped with this model's depth.
    Which nodes repeat is learned per family by comparing its depth-1 and depth-2 graphs (T5's
    relative attention bias, for one, sits in block 0 only).
    """
    model = spec.model
    key = model.model_dump_json()
    if key not in _GRAPHS:
        if model.family is None or model.hf_config is not None or model.module is not None:
            _GRAPHS[key] = graph_for(model)
        else:
            _GRAPHS[key] = _with_depth(graph_for(_at_depth(model, 1)), model, _repeated_names(model))
    return _GRAPHS[key]


def _at_depth(model: Any, depth: int) -> Any:
    return model.model_copy(update={"layers": depth, "decoder_layers": depth if model.seq2seq else None})


_REPEATED: dict[str, frozenset[str]] = {}


def _repeated_names(model: Any) -> frozenset[str]:
    if model.family not in _REPEATED:
        one, two = graph_for(_at_depth(model, 1)), graph_for(_at_depth(model, 2))
        _REPEATED[model.family] = frozenset(a.name for a, b in zip(one.nodes, two.nodes) if b.count == 2 * a.count)
    return _REPEATED[model.family]


def _with_depth(graph: LayerGraph, model: Any, repeated: frozenset[str]) -> LayerGraph:
    """A depth-1 graph with `model`'s block counts (t5: encoder and decoder separately)."""
    dec = model.decoder_layers if model.decoder_layers is not None else model.layers
    depth = {"block": model.layers, "enc": model.layers, "dec": dec}
    nodes = [replace(n, count=n.count * depth[n.group]) if n.name in repeated else n for n in graph.nodes]
    return replace(graph, nodes=nodes, num_blocks=model.num_blocks)


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
    layers: list[LayerObs] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)


def overhead_seconds(graph: LayerGraph, plan: Plan, spec: WorkloadSpec) -> float:
    """Reference dispatch time of one iteration on one rank: 3 operator calls per layer occurrence
    (forward, 2 backward) per micro-batch on an average stage, and 2 optimizer calls per layer
    with parameters; 0 on asynchronous (GPU) devices."""
    if spec.cluster.device not in SYNCHRONOUS_DEVICES:
        return 0.0
    global_batch = spec.training.global_batch
    layers = sum(n.count for n in graph.nodes) / plan.pp
    with_params = sum(n.count for n in graph.nodes if n.params) / plan.pp
    return DISPATCH_S * (3 * layers * plan.microbatches(global_batch) + 2 * with_params)


def layer_matrix(graph: LayerGraph, key: LayerKey, device: Device, attr_keys: Sequence[str],
                 index: Sequence[int]) -> np.ndarray:
    """Eq. 7 features of nodes `index` at `key`: h_hp ‖ h_dev ‖ h_struct ‖ h_cm, per micro-batch on one tp rank.

    Sharding comes from `predictor.costs.parallel.shard_nodes` (the same the analytical model uses).
    """
    sh = shard_nodes(graph, key.share, key.heads)
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

NODE_DIM = len(LAYER_KINDS) + len(GROUPS) + len(TP_ROLES) + 5
EDGE_DIM = 2


def _shares(values: np.ndarray) -> np.ndarray:
    total = float(values.sum())
    return values / total if total > 0 else np.zeros_like(values)


def node_matrix(graph: LayerGraph, layer_s: np.ndarray) -> np.ndarray:
    """Node features v_i: kind, position, sharding role, and its shares of the FLOPs, parameters,
    activations and predicted time (`layer_s`: fwd+bwd seconds of all its occurrences per micro-batch).

    Shares, not absolute sizes: the corrections must carry from the small models they are trained
    on to larger ones (175B from 1B on A100, an unseen architecture on CPU).
    """
    counts = np.asarray([n.count for n in graph.nodes], dtype=float)
    one_hot = np.asarray([[float(n.kind == k) for k in LAYER_KINDS] + [float(n.group == g) for g in GROUPS]
                          + [float(n.tp == r) for r in TP_ROLES] for n in graph.nodes])
    flops = counts * np.asarray([n.fwd_flops + n.bwd_flops for n in graph.nodes])
    params = counts * np.asarray([n.params for n in graph.nodes], dtype=float)
    act = counts * np.asarray([n.act_elems for n in graph.nodes])
    dense = np.stack([np.log(counts) / 5, _shares(flops), _shares(params), _shares(act),
                      _shares(np.asarray(layer_s, dtype=float))], axis=1)
    return np.concatenate([one_hot, dense], axis=1).astype(np.float32)


def edge_tensors(graph: LayerGraph) -> tuple[np.ndarray, np.ndarray]:
    """Edges both ways with (relative size, direction): data flows forward, gradients flow back."""
    if not graph.edges:
        return np.zeros((2, 0), dtype=np.int64), np.zeros((0, EDGE_DIM), dtype=np.float32)
    src, dst, elems = (np.asarray(c) for c in zip(*graph.edges))
    index = np.concatenate([np.stack([src, dst]), np.stack([dst, src])], axis=1).astype(np.int64)
    elems = np.maximum(np.asarray(elems, dtype=float), 1.0)
    size = np.log(elems / np.median(elems)) / 5
    attr = np.concatenate([np.stack([size, np.ones_like(size)], 1), np.stack([size, -np.ones_like(size)], 1)])
    return index, attr.astype(np.float32)


# ---------------------------------------------------------------- global view Z

GLOBAL_DIM = 12 + len(TERMS) + 4 + 3 + 3 + 2 + 3
# Bump when a feature's meaning changes without its width changing: checkpoints record the version
# they were trained with and refuse to load under another (their inputs would be misread silently).
FEATURE_VERSION = 1


def feature_signature() -> dict[str, Any]:
    """What a checkpoint's learned parts assume about the features: checked when it is loaded."""
    return {"version": FEATURE_VERSION, "node_dim": NODE_DIM, "edge_dim": EDGE_DIM, "global_dim": GLOBAL_DIM,
            "terms": list(TERMS), "layer_kinds": list(LAYER_KINDS)}


def global_matrix(spec: WorkloadSpec, plans: Sequence[Plan], device: Device, terms: np.ndarray) -> np.ndarray:
    """Z per plan (rows): micro-batching, plan degrees, device and links, and each time term's share.

    Degrees enter saturating ((n-1)/n, bubble fraction) and no absolute model or cluster size
    enters at all, so a correction learned on 2-8 ranks stays bounded on 512. `device` carries
    the cluster's link overrides and device profile (`predictor.spec.resolver.resolve`). Vectorised: a search asks
    thousands of plans at once.
    """
    def col(attr: str) -> np.ndarray:
        return np.asarray([getattr(p, attr) for p in plans], dtype=float)

    dp, tp, pp, mbs, v = col("dp"), col("tp"), col("pp"), col("mbs"), col("v")
    m = np.maximum(spec.training.global_batch // (dp * mbs), 1)
    n = len(plans)
    total = terms.sum(1, keepdims=True)
    shares = np.divide(terms, total, out=np.zeros_like(terms, dtype=float), where=total > 0)
    dev = [math.log(device.flops(spec.training.precision)) / 10, math.log(device.mem_bandwidth) / 10,
           math.log(device.intra_node.bandwidth) / 10, math.log(device.inter_node.bandwidth) / 10]
    one_hots = [[float(p.zero == z) for z in range(4)] + [float(p.recompute == r) for r in RECOMPUTE_MODES]
                + [float(p.schedule == s) for s in SCHEDULES] for p in plans]
    settings = [float(spec.training.optimizer == o) for o in ("adam", "sgd")]
    settings += [float(spec.training.precision == p) for p in ("fp32", "fp16", "bf16")]
    return np.concatenate([
        np.stack([np.log(mbs), np.log(m), (dp - 1) / dp, np.log2(tp), (pp - 1) / pp, (pp - 1) / (v * m), np.log(v),
                  col("sp")], axis=1),
        np.tile(dev, (n, 1)), shares, np.asarray(one_hots).reshape(n, 10), np.tile(settings, (n, 1)),
    ], axis=1)
