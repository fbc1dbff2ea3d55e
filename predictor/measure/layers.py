"""Per-layer forward and backward times with the real shapes of a real model.

The real small model is built on the local device; one forward pass with hooks records the
inputs every layer-graph node's module receives; each node is then timed in isolation
(warm-up, repeats, median and spread; float inputs require grad so backward includes the
input gradient as in training). Nodes are keyed by their `LayerGraph` name (the module
path of the first occurrence of a repeated block), so rows join with graph nodes. A node
whose name is not a module (a functional op the graph split out, e.g. the attention core) is
timed from its shapes by kind (`_synthetic`). Timings are cached per (module type, input
shapes, parameter shapes): configurations sharing a block shape cost nothing the second time.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from predictor.measure.modules import block_lists, layer_kind
from predictor.spec.workload import ModelSpec

_CACHE: dict[tuple, "LayerTiming"] = {}
_SYNTHETIC = ("attention", "loss")  # timed as the bare op: the module around them also runs other nodes
# Calls queued back to back per timed sample on an asynchronous device (a GPU). One call between two
# CUDA events, started from an idle GPU, includes that call's launch latency, which a training step's
# queue of kernels hides: small layers came out slower than they run inside a step. The mean over
# calls queued back to back is the layer's steady-state cost: its kernels, or the host's launch pace
# where that is the slower, as it is in a host-bound step. The CPU runs synchronously: one call.
BACK_TO_BACK = 10


@dataclass
class LayerTiming:
    fwd_s: float
    bwd_s: float
    fwd_spread: float
    bwd_spread: float
    repeats: int
    calls: int = 1  # calls averaged per timed sample (BACK_TO_BACK on a GPU)


@dataclass
class NodeRef:
    """What a timing row needs of a layer-graph node."""

    name: str
    kind: str
    group: str
    count: int
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    attrs: dict


_CORE_OWNER = {"query", "q", "q_proj", "c_attn"}  # a module owning one of these runs the attention core
_HEAD_ATTRS = ("num_attention_heads", "num_heads", "n_heads", "n_head")


def _attention_attrs(spec: ModelSpec, path: str, mod: nn.Module) -> dict[str, int]:
    heads = next((getattr(mod, a) for a in _HEAD_ATTRS if isinstance(getattr(mod, a, None), int)), spec.heads)
    causal = spec.decoder or (spec.seq2seq and path.startswith("decoder") and "SelfAttention" in path)
    return {"heads": heads, "head_dim": (spec.hidden or 0) // heads, "seq": spec.tokens, "kv_seq": spec.tokens,
            "causal": int(causal)}


def layer_nodes(model: nn.Module, spec: ModelSpec) -> list[NodeRef]:
    """The layers of `model` named like `predictor.graph.build` names them, without tracing the model.

    Leaf modules outside repeated copies (block 0 only, with the block count), one `attention`
    node per module that runs the attention core (the parent of the query projection, timed as
    scaled-dot-product attention), and the `loss`. `predictor.graph.build` takes seconds per model
    (torch.export); this takes nothing, so every configuration gets its layer rows cheaply.
    """
    skip: set[str] = set()
    count: dict[str, int] = {}
    names = {id(m): n for n, m in model.named_modules()}
    for blocks in block_lists(model):
        first = names[id(blocks[0])]
        skip.update(names[id(later)] for later in list(blocks)[1:])
        later = dict(blocks[1].named_modules()) if len(blocks) > 1 else {}
        for sub, _ in blocks[0].named_modules():  # what only block 0 has (T5's position bias) occurs once
            count[f"{first}.{sub}" if sub else first] = len(blocks) if sub in later or not sub else 1
    nodes = []
    experts: list[str] = []
    for name, mod in model.named_modules():
        if any(name == s or name.startswith(s + ".") for s in skip) or any(name.startswith(e + ".") for e in experts):
            continue
        group = "block" if name in count else "other"
        if any(child in _CORE_OWNER for child, _ in mod.named_children()):
            nodes.append(NodeRef(name, "attention", group, count.get(name, 1), (1, spec.tokens, spec.hidden or 0), (),
                                 _attention_attrs(spec, name, mod)))
        elif type(mod).__name__.endswith("Experts"):  # a MoE layer's grouped GEMMs and activation, timed whole
            experts.append(name)
            nodes.append(NodeRef(name, "experts", group, count.get(name, 1), (), (), {}))
        elif not list(mod.children()):
            nodes.append(NodeRef(name, layer_kind(mod), group, count.get(name, 1), (), (), {}))
    from predictor.graph.modelzoo import num_labels

    logits = (1, num_labels(spec)) if spec.vision else (1, spec.tokens, spec.vocab or 0)
    nodes.append(NodeRef("loss", "loss", "post", 1, logits, (), {}))
    return nodes


def graph_nodes(spec: ModelSpec) -> list[NodeRef]:
    """The layer-graph nodes of `spec` (predictor.graph.cache), as plain references."""
    from predictor.graph.cache import graph_for

    g = graph_for(spec)
    return [NodeRef(n.name, n.kind, n.group, n.count, tuple(n.in_shape), tuple(n.out_shape), dict(n.attrs))
            for n in g.nodes]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timer(device: torch.device) -> Callable[[Callable[[], Any]], float]:
    """Seconds one call takes: CUDA events on a GPU, perf_counter on the CPU."""
    if device.type == "cuda":
        def run(fn: Callable[[], Any]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return run

    def run_cpu(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return run_cpu


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    if hasattr(obj, "to_tuple"):  # HF ModelOutput
        return _tensors(obj.to_tuple())
    return []


def _prepare(obj: Any) -> Any:
    """Detached copies of captured inputs; float tensors require grad (their gradient is real work)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().clone()
        return t.requires_grad_(True) if t.is_floating_point() else t
    if isinstance(obj, tuple):
        return tuple(_prepare(o) for o in obj)
    if isinstance(obj, list):
        return [_prepare(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _prepare(v) for k, v in obj.items()}
    return obj


def _signature(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return (tuple(obj.shape), str(obj.dtype))
    if isinstance(obj, (tuple, list)):
        return tuple(_signature(o) for o in obj)
    if isinstance(obj, dict):
        return tuple(sorted((k, _signature(v)) for k, v in obj.items()))
    return obj if isinstance(obj, (int, float, bool, str, type(None))) else type(obj).__name__


def _grad_outputs(out: Any) -> list[torch.Tensor]:
    return [t for t in _tensors(out) if t.requires_grad]


def _backward(outs: list[torch.Tensor]) -> None:
    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])


def _back_to_back(fn: Callable[[], Any], timer: Callable[[Callable[[], Any]], float], calls: int) -> tuple[float, float]:
    """Per-call forward and backward seconds of `calls` calls queued back to back: the forwards alone, then
    forward-backward pairs (a backward needs its own forward), the backward being the difference."""
    def forwards() -> None:
        for _ in range(calls):
            fn()

    def pairs() -> None:
        for _ in range(calls):
            outs = _grad_outputs(fn())
            if outs:
                _backward(outs)

    t_f = timer(forwards) / calls
    return t_f, max(timer(pairs) / calls - t_f, 0.0)


def time_call(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int,
              min_total_s: float = 0.01, max_repeats: int = 6, calls: int | None = None) -> LayerTiming:
    """Forward and backward of `fn` (which runs the layer and returns its output), timed separately.

    Runs at least `repeats` times, more (up to `max_repeats`) for layers so fast that a few
    runs would last under `min_total_s`: their medians are the noisiest. Each run times `calls`
    calls back to back (default: one on the CPU, BACK_TO_BACK on a GPU) and reports their mean.
    """
    calls = calls or (1 if device.type == "cpu" else BACK_TO_BACK)
    timer = _timer(device)
    fwd: list[float] = []
    bwd: list[float] = []
    i = 0
    while True:
        _sync(device)
        if calls > 1:
            t_f, t_b = _back_to_back(fn, timer, calls)
        else:
            out: list[Any] = []
            t_f = timer(lambda: out.append(fn()))
            outs = _grad_outputs(out[0])
            t_b = timer(lambda: _backward(outs)) if outs else 0.0
        if i >= warmup:
            fwd.append(t_f)
            bwd.append(t_b)
        i += 1
        n = len(fwd)
        if n >= max_repeats or (n >= repeats and sum(fwd) + sum(bwd) >= min_total_s):
            break
    return LayerTiming(statistics.median(fwd), statistics.median(bwd), _spread(fwd), _spread(bwd), len(fwd), calls)


def _spread(xs: list[float]) -> float:
    med = statistics.median(xs)
    return (max(xs) - min(xs)) / med if med > 0 else 0.0


def _synthetic(node: NodeRef, device: torch.device, dtype: torch.dtype) -> Callable[[], Any] | None:
    """A stand-alone op of the node's kind and shapes, for nodes that are not modules."""
    shape = node.in_shape
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True) if shape else None
    if node.kind == "attention":
        heads = node.attrs.get("heads")
        head_dim = node.attrs.get("head_dim")
        seq = node.attrs.get("seq") or (shape[1] if len(shape) > 1 else None)
        kv_seq = node.attrs.get("kv_seq", seq)
        if not (heads and head_dim and seq):
            return None
        b = shape[0] if shape else 1
        q = torch.randn(b, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
        k = torch.randn(b, heads, kv_seq, head_dim, device=device, dtype=dtype, requires_grad=True)
        v = torch.randn(b, heads, kv_seq, head_dim, device=device, dtype=dtype, requires_grad=True)
        causal = bool(node.attrs.get("causal", 0))
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if x is None:
        return None
    if node.kind == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    if node.kind == "activation":
        return lambda: F.gelu(x)
    if node.kind == "dropout":
        return lambda: F.dropout(x, 0.1, training=True)
    if node.kind == "elementwise":
        y = torch.randn(shape, device=device, dtype=dtype)
        return lambda: x + y
    if node.kind == "loss" and len(shape) >= 2:
        target = torch.randint(0, shape[-1], shape[:-1], device=device)
        return lambda: F.cross_entropy(x.reshape(-1, shape[-1]).float(), target.reshape(-1))
    return None


def capture_inputs(model: nn.Module, inputs: dict, spec: ModelSpec, names: list[str]) -> dict[str, tuple]:
    """(args, kwargs) of the first call of every named module during one forward pass."""
    from predictor.graph.modelzoo import training_loss

    modules = dict(model.named_modules())
    captured: dict[str, tuple] = {}
    handles = []
    for name in names:
        if name in modules:
            def hook(mod: nn.Module, args: tuple, kwargs: dict, name: str = name) -> None:
                captured.setdefault(name, (args, kwargs))
            handles.append(modules[name].register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            training_loss(model, inputs, spec)
    finally:
        for h in handles:
            h.remove()
    return captured


def time_layers(spec: ModelSpec, batch: int, device: torch.device, nodes: list[NodeRef] | None = None,
                repeats: int = 3, warmup: int = 1, dtype: torch.dtype = torch.float32) -> list[dict]:
    """One row per layer-graph node: median forward/backward seconds at micro-batch `batch`."""
    from predictor.graph.modelzoo import build_model, example_inputs

    torch.manual_seed(0)
    model = build_model(spec, device, dtype)
    model.train()
    if nodes is None:
        nodes = layer_nodes(model, spec)
    modules = dict(model.named_modules())
    captured = capture_inputs(model, example_inputs(spec, batch, device, dtype), spec, [n.name for n in nodes])
    rows = []
    for node in nodes:
        if node.name in captured and node.kind not in _SYNTHETIC:
            module = modules[node.name]
            args, kwargs = captured[node.name]
            key = (type(module).__name__, _signature(args), _signature(kwargs),
                   tuple(tuple(p.shape) for p in module.parameters()), str(device))
            if key not in _CACHE:
                a, kw = _prepare(args), _prepare(kwargs)
                _CACHE[key] = time_call(lambda: module(*a, **kw), device, repeats, warmup)
                module.zero_grad(set_to_none=True)
            timing = _CACHE[key]
            first = next(iter(_tensors((args, kwargs))), None)
            shape = tuple(first.shape) if first is not None else node.in_shape
        else:
            shape = (batch, *node.in_shape[1:]) if node.in_shape else ()
            scaled = NodeRef(node.name, node.kind, node.group, node.count, shape, node.out_shape, node.attrs)
            key = ("synthetic", node.kind, shape, tuple(sorted(node.attrs.items())), str(device))
            if key not in _CACHE:
                fn = _synthetic(scaled, device, dtype)
                if fn is None:
                    continue  # nothing runnable carries this node's cost (e.g. a view)
                _CACHE[key] = time_call(fn, device, repeats, warmup)
            timing = _CACHE[key]
        rows.append({"node": node.name, "kind": node.kind, "group": node.group, "count": node.count,
                     "in_shape": str(list(shape)), "fwd_s": timing.fwd_s, "bwd_s": timing.bwd_s,
                     "fwd_spread": timing.fwd_spread, "bwd_spread": timing.bwd_spread, "repeats": timing.repeats,
                     "calls": timing.calls})
    return rows


def time_layers_job(job: dict, device: torch.device) -> dict:
    """Worker entry point (see dist_worker): layer rows of one configuration."""
    spec = ModelSpec.model_validate_json(job["spec_json"])
    rows = time_layers(spec, int(job["batch"]), device, repeats=int(job["repeats"]), warmup=int(job["warmup"]),
                       dtype=getattr(torch, job.get("dtype", "float32")))
    return {"status": "ok", "rows": rows}
