"""Model → `LayerGraph`: one node per layer of the real model, traced on the meta device.

How a graph is built (`build_graph`):

1. A *reduced* copy of the model with ONE transformer block per block list (one encoder and one
   decoder block for T5) is built on `torch.device("meta")` (`predictor.modelzoo`), so a 96-layer
   175B model costs one block's work; each node of that block gets `count` = number of blocks.
2. Structure: `torch.export.export(model, (), kwargs, strict=False)`; every aten op carries
   `meta["nn_module_stack"]`, whose innermost entry (with its `@k` call index) says which module
   call ran it. Calls of *leaf layers* (Linear, Embedding, norms, activations, dropout, conv) are
   nodes; a module that runs the attention core itself (SDPA / matmul / softmax outside any child
   Linear) is one `attention` node; ops of other composite modules (residual adds, the SwiGLU
   product, reshapes) fold into the node that ran just before them; what the top module runs after
   its last layer is the `loss` node. Data flow between ops gives the edges (elements passed) and
   each node's input/output shapes.
3. Costs: one instrumented training step (forward + backward) of the reduced model under
   `FakeTensorMode` on meta. FLOPs per op use `FlopCounterMode`'s own formula registry; forward ops
   are attributed to the module call running, backward ops to the module call that created the
   autograd node executing them (by autograd sequence number), which `FlopCounterMode`'s per-module
   view cannot do reliably. Elements saved for backward are measured with
   `torch.autograd.graph.saved_tensors_hooks` (each saved storage counted once, parameters excluded).

All figures are per sample (micro-batch 1). FLOPs are what `FlopCounterMode` counts: matmuls,
convolutions and attention; element-wise work (norms, activations, the loss) counts 0 FLOPs, so the
graph's total agrees with `FlopCounterMode` on the full model.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch._dynamo  # noqa: F401  torch.export's machinery: a one-off import cost (seconds), paid at import
import torch.export
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from predictor.layer_graph import LayerGraph, LayerNode
from predictor.modelzoo import build_model, example_inputs, module_args, output_loss, user_model_errors
from predictor.tp_roles import embedding_role, linear_role
from predictor.workload import ModelSpec

_ATTN_OPS = {
    "scaled_dot_product_attention", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math", "softmax", "_softmax", "bmm", "matmul", "baddbmm", "einsum",
}
_NORM_RMS = re.compile(r"rmsnorm|t5layernorm|llamarmsnorm", re.I)
_ACTIVATION_NAMES = re.compile(
    r"(gelu|relu|silu|swish|tanh|sigmoid|mish|elu|quickgelu|activation|identity)$", re.I)


def build_graph(model: ModelSpec) -> LayerGraph:
    """The layer graph of `model` at micro-batch 1 (see the module docstring for the method)."""
    if model.is_moe and (0 < model.dense_layers < (model.layers or 0) or model.mtp_layers):
        return _mixed_moe_graph(model)
    blocks = _block_counts(model)
    reduced = _reduced_spec(model) if blocks else model
    module = build_model(reduced, device="meta")
    with user_model_errors(model, _tracing(model)):
        lists = _block_lists(module, blocks)
        first_only = _first_block_only(model, lists) if lists else set()
        inputs = example_inputs(reduced, 1, device="meta")
        args, kwargs = module_args(reduced, inputs)

        if model.module is not None:
            lists = _user_block_list(module)
        trace = _export_structure(module, args, kwargs)
        costs = _measure_costs(module, reduced, inputs)
    return _assemble(model, module, trace, costs, lists, first_only)


def _mixed_moe_graph(model: ModelSpec) -> LayerGraph:
    """A mixture of experts with leading dense layers (DeepSeek-V3's first 3) or multi-token prediction: the
    dense block and the MoE block are traced apart, each counted for its layers, the dense block's nodes first.
    The MTP module is counted as one more MoE block and one more output layer and loss per depth (its
    embedding is shared; its small h x 2h projection and two norms are left out). A pipeline spreads both
    kinds of block evenly over its stages (Megatron-Core places the dense ones on the first stage)."""
    moe = build_graph(model.model_copy(update={"dense_layers": 0, "mtp_layers": 0,
                                               "layers": model.layers - model.dense_layers + model.mtp_layers}))
    pre = [n for n in moe.nodes if n.group == "pre"]
    blocks = [n for n in moe.nodes if n.group == "block"]
    post = [replace(n, count=n.count * (1 + model.mtp_layers)) for n in moe.nodes if n.group == "post"]
    dense: list[LayerNode] = []
    dense_edges: list[tuple[int, int, float]] = []
    if model.dense_layers:
        g = build_graph(model.model_copy(update={"layers": model.dense_layers, "mtp_layers": 0}))
        idx = [i for i, n in enumerate(g.nodes) if n.group == "block"]
        dense = [replace(g.nodes[i], name=f"dense:{g.nodes[i].name}") for i in idx]
        where = {i: len(pre) + j for j, i in enumerate(idx)}
        dense_edges = [(where[a], where[b], e) for a, b, e in g.edges if a in where and b in where]
    shift = len(dense)
    edges = [(a + shift * (a >= len(pre)), b + shift * (b >= len(pre)), e) for a, b, e in moe.edges]
    return LayerGraph(family=moe.family, nodes=[*pre, *dense, *blocks, *post], edges=sorted(edges + dense_edges),
                      tokens=moe.tokens, num_blocks=model.layers + model.mtp_layers)


def _tracing(model: ModelSpec) -> str:
    """What a failing trace was doing, told to the user: a `module:` model's forward is fed the spec's inputs."""
    if model.module is None:
        return "tracing the model's forward"
    shapes = ", ".join(f"{i.dtype} {i.shape}" for i in model.inputs or [])
    return f"tracing its forward on model.inputs ({shapes}, each after a batch dimension)"


# --------------------------------------------------------------------------------------------
# Repeated blocks
# --------------------------------------------------------------------------------------------


def _block_counts(model: ModelSpec) -> list[int]:
    """Blocks per block list of the full model ([] for `module:` models, traced whole)."""
    if model.module is not None:
        return []
    layers = model.layers or 0
    if model.family == "t5":
        dec = model.decoder_layers if model.decoder_layers is not None else layers
        return [layers, dec]
    return [layers]


_HF_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def _reduced_spec(model: ModelSpec) -> ModelSpec:
    """The same model with one block per block list (one encoder and one decoder block for T5)."""
    update: dict[str, Any] = {"layers": 1}
    if model.family == "t5":
        update["decoder_layers"] = 1
    if model.hf_config is not None:
        cfg = dict(model.hf_config)
        for key in _HF_LAYER_KEYS:
            if key in cfg:
                cfg[key] = 1
        if model.family == "t5":
            cfg["num_decoder_layers"] = 1
            cfg.setdefault("num_layers", 1)
        update["hf_config"] = cfg
    return model.model_copy(update=update)


@dataclass
class _BlockList:
    path: str  # e.g. "model.layers" (module path of the ModuleList)
    count: int  # blocks in the full model
    group: str  # "block", or "enc"/"dec" for an encoder-decoder
    traced_whole: bool = False  # a user module's blocks: all traced, each node counted once

    @property
    def prefix(self) -> str:
        return self.path if self.traced_whole else f"{self.path}.0"

    @property
    def stack(self) -> str:
        """Path of the module holding the list ('' for the top module), e.g. 'encoder'."""
        return self.path.rpartition(".")[0]


def _block_lists(module: nn.Module, counts: list[int]) -> list[_BlockList]:
    """The ModuleLists of blocks in the reduced model, in registration order, with their full counts."""
    if not counts:
        return []
    found = [name for name, m in module.named_modules() if isinstance(m, nn.ModuleList) and len(m) == 1
             and len(list(m[0].children())) > 0]
    if len(found) != len(counts):
        raise ValueError(f"expected {len(counts)} list(s) of transformer blocks, found {found or 'none'}")
    groups = ["enc", "dec"] if len(found) == 2 else ["block"]
    return [_BlockList(path, n, g) for path, n, g in zip(found, counts, groups)]


def _user_block_list(module: nn.Module) -> list[_BlockList]:
    """A `module:` model's blocks: its longest ModuleList/Sequential of same-class modules (traced whole).

    Each block is then its own group of nodes with count 1; nodes before are `pre`, after are `post`.
    """
    best: tuple[int, str] | None = None
    for name, m in module.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2 and name:
            kinds = {type(c) for c in m.children()}
            if len(kinds) == 1 and list(next(iter(m.children())).children()):
                if best is None or len(m) > best[0]:
                    best = (len(m), name)
    if best is None:
        return []
    return [_BlockList(best[1], best[0], "block", traced_whole=True)]


def _first_block_only(model: ModelSpec, lists: list[_BlockList]) -> set[str]:
    """Module paths (in block 0) that the later blocks lack (T5's relative position bias): count 1."""
    if not any(b.count >= 2 for b in lists) or (model.family == "gpt" and model.hf_config is None):
        return set()  # our GPT's blocks are identical by construction
    update: dict[str, Any] = {"layers": 2}
    if model.family == "t5":
        update["decoder_layers"] = 2
    spec2 = _reduced_spec(model).model_copy(update=update)
    if spec2.hf_config is not None:
        cfg = dict(spec2.hf_config)
        for key in (*_HF_LAYER_KEYS, "num_decoder_layers"):
            if key in cfg:
                cfg[key] = 2
        spec2 = spec2.model_copy(update={"hf_config": cfg})
    two = build_model(spec2, device="meta")
    names = {n for n, _ in two.named_modules()}
    only: set[str] = set()
    for b in lists:
        for name in names:
            if name.startswith(b.prefix + "."):
                rest = name[len(b.prefix):]
                if f"{b.path}.1{rest}" not in names:
                    only.add(name)
    return only


# --------------------------------------------------------------------------------------------
# Structure: torch.export
# --------------------------------------------------------------------------------------------


class _LossWrapper(nn.Module):
    """Exports the training step's forward (model + loss); the model sits at attribute `model`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return output_loss(self.model(*args, **kwargs))


@dataclass
class _Op:
    call: str  # module call key: module path, plus "@k" for its k-th repeated call ('' = top module)
    target: str  # aten op name without namespace/overload, e.g. "linear"
    inputs: list[tuple[int | None, str, tuple[int, ...]]]  # (producer op index or None, placeholder kind, shape)
    shape: tuple[int, ...] | None  # first output's shape
    numel: int


@dataclass
class _Trace:
    ops: list[_Op]


def _shape(val: Any) -> tuple[int, ...] | None:
    if isinstance(val, torch.Tensor):
        return tuple(int(d) for d in val.shape)
    if isinstance(val, (tuple, list)) and val and isinstance(val[0], torch.Tensor):
        return tuple(int(d) for d in val[0].shape)
    return None


def _numel(val: Any) -> int:
    if isinstance(val, torch.Tensor):
        return int(val.numel())
    if isinstance(val, (tuple, list)):
        return sum(_numel(v) for v in val)
    return 0


def _export_structure(module: nn.Module, args: tuple, kwargs: dict) -> _Trace:
    ep = torch.export.export(_LossWrapper(module), args, kwargs, strict=False)
    sig = ep.graph_signature
    user_inputs = set(sig.user_inputs)
    index: dict[str, int] = {}
    ops: list[_Op] = []
    placeholders: dict[str, tuple[str, tuple[int, ...]]] = {}
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            kind = "input" if node.name in user_inputs else "param"
            placeholders[node.name] = (kind, _shape(node.meta.get("val")) or ())
            continue
        if node.op != "call_function":
            continue
        target = getattr(node.target, "__name__", str(node.target))
        target = target.split(".")[0] if "." in target else target
        ins: list[tuple[int | None, str, tuple[int, ...]]] = []
        flat, _ = tree_flatten((node.args, node.kwargs))
        for a in flat:
            if isinstance(a, torch.fx.Node):
                if a.name in index:
                    ins.append((index[a.name], "op", _shape(a.meta.get("val")) or ()))
                elif a.name in placeholders:
                    kind, shape = placeholders[a.name]
                    ins.append((None, kind, shape))
        val = node.meta.get("val")
        index[node.name] = len(ops)
        ops.append(_Op(_export_call_key(node.meta.get("nn_module_stack")), target, ins, _shape(val), _numel(val)))
    return _Trace(ops)


def _export_call_key(stack: dict[str, Any] | None) -> str:
    """'' for the top module, else the module path relative to the model, with '@k' for repeated calls."""
    if not stack:
        return ""
    key, (path, _cls) = list(stack.items())[-1]
    path = str(path)
    if path == "model":
        path = ""
    elif path.startswith("model."):
        path = path[len("model."):]
    else:
        return ""
    m = re.search(r"@(\d+)$", str(key))
    if m and path:
        path = f"{path}@{m.group(1)}"
    return path


# --------------------------------------------------------------------------------------------
# Costs: one instrumented training step under FakeTensorMode
# --------------------------------------------------------------------------------------------


@dataclass
class _Costs:
    """Figures per (module call key, calls begun so far); `entered` lists the call keys in order."""

    fwd: dict[tuple[str, int], float] = field(default_factory=dict)
    bwd: dict[tuple[str, int], float] = field(default_factory=dict)
    act: dict[tuple[str, int], float] = field(default_factory=dict)
    act_mask: dict[tuple[str, int], float] = field(default_factory=dict)
    entered: list[str] = field(default_factory=list)
    total_fwd: float = 0.0
    total_bwd: float = 0.0


_SKIP_DISPATCH = None


def _skip_ops() -> set:
    global _SKIP_DISPATCH
    if _SKIP_DISPATCH is None:
        a = torch.ops.aten
        _SKIP_DISPATCH = {a.sym_is_contiguous.default, a.is_contiguous.default, a.is_contiguous.memory_format,
                          a.is_strides_like_format.default, a.is_non_overlapping_and_dense.default, a.size.default,
                          a.sym_size.default, a.stride.default, a.sym_stride.default, a.storage_offset.default,
                          a.sym_storage_offset.default, a.numel.default, a.sym_numel.default, a.dim.default,
                          torch.ops.prim.layout.default}
    return _SKIP_DISPATCH


class _Recorder:
    """Module-call tracking, autograd-node → call mapping, FLOPs per call and saved-tensor accounting."""

    def __init__(self, model: nn.Module):
        self.names = {}
        for name, m in model.named_modules():
            self.names.setdefault(id(m), name)
        self.stack: list[str] = [""]
        self.entered: list[str] = []  # every module call key, in the order the calls began
        self.calls: dict[str, int] = {}
        self.phase = "fwd"
        self.seq_hi: list[int] = []
        self.seq_call: list[str] = []
        self.costs = _Costs()
        self.saved_seen: set[int] = set()
        self.keepalive: list[torch.Tensor] = []
        from torch.utils.flop_counter import FlopCounterMode

        self.registry = FlopCounterMode(display=False).flop_registry

    # module calls
    def pre_hook(self, module: nn.Module, _args: Any) -> None:
        name = self.names.get(id(module))
        if name is None:
            self.stack.append(self.stack[-1])
            return
        k = self.calls.get(name, 0)
        self.calls[name] = k + 1
        key = f"{name}@{k}" if k and name else name
        self.stack.append(key)
        self.entered.append(key)

    def where(self) -> tuple[str, int]:
        """The running module call and how many calls had begun: places ops of composite modules."""
        return self.stack[-1], len(self.entered)

    def post_hook(self, module: nn.Module, _args: Any, _out: Any) -> None:
        if len(self.stack) > 1:
            self.stack.pop()

    # autograd nodes created by each torch-level call
    def note_outputs(self, out: Any) -> None:
        best = -1
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                best = max(best, t.grad_fn._sequence_nr())
        if best < 0:
            return
        if self.seq_hi and best <= self.seq_hi[-1]:
            return
        self.seq_hi.append(best)
        self.seq_call.append(self.where())

    def call_of_backward(self) -> tuple[str, int]:
        node = torch._C._current_autograd_node()
        if node is None:
            return "", -1
        seq = node._sequence_nr()
        i = bisect.bisect_left(self.seq_hi, seq)
        return self.seq_call[i] if i < len(self.seq_call) else ("", -1)

    def add_flops(self, func: Any, out: Any, args: Any, kwargs: Any) -> None:
        packet = func._overloadpacket
        if packet not in self.registry:
            return
        flops = float(self.registry[packet](*args, **kwargs, out_val=out))
        if not flops:
            return
        if self.phase == "fwd":
            key = self.where()
            self.costs.fwd[key] = self.costs.fwd.get(key, 0.0) + flops
            self.costs.total_fwd += flops
        else:
            key = self.call_of_backward()
            self.costs.bwd[key] = self.costs.bwd.get(key, 0.0) + flops
            self.costs.total_bwd += flops

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if base.is_leaf and base.requires_grad:  # a parameter (or its view)
            return t
        if id(base) not in self.saved_seen:
            self.saved_seen.add(id(base))
            self.keepalive.append(base)
            key = self.where()
            n = float(base.numel())
            self.costs.act[key] = self.costs.act.get(key, 0.0) + n
            if base.dtype in (torch.bool, torch.uint8):
                self.costs.act_mask[key] = self.costs.act_mask.get(key, 0.0) + n
        return t


class _FnMode(TorchFunctionMode):
    def __init__(self, rec: _Recorder):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.rec.phase == "fwd":
            self.rec.note_outputs(out)
        return out


class _FlopMode(TorchDispatchMode):
    """FlopCounterMode's dispatch logic (same registry, same decompositions), attributing per module call."""

    def __init__(self, rec: _Recorder):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _skip_ops():
            return NotImplemented
        if func not in self.rec.registry and func is not torch.ops.prim.device.default:
            with self:
                r = func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r
        out = func(*args, **kwargs)
        self.rec.add_flops(func, out, args, kwargs)
        return out


def _measure_costs(module: nn.Module, spec: ModelSpec, inputs: dict[str, Any]) -> _Costs:
    from torch._subclasses.fake_tensor import FakeTensorMode

    rec = _Recorder(module)
    h1 = nn.modules.module.register_module_forward_pre_hook(rec.pre_hook)
    h2 = nn.modules.module.register_module_forward_hook(rec.post_hook, always_call=True)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            fake_inputs = {k: (torch.empty_like(v) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
            args, kwargs = module_args(spec, fake_inputs)
            with _FlopMode(rec):
                with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t), _FnMode(rec):
                    loss = output_loss(module(*args, **kwargs))
                h1.remove()
                h2.remove()
                rec.phase = "bwd"
                loss.backward()
    finally:
        h1.remove()
        h2.remove()
    for p in module.parameters():
        p.grad = None
    rec.costs.entered = rec.entered
    return rec.costs


# --------------------------------------------------------------------------------------------
# Assembly
# --------------------------------------------------------------------------------------------


def _strip_call(key: str) -> str:
    return key.split("@")[0]


def _kind_of(mod: nn.Module | None, path: str, is_attention: bool, is_loss: bool) -> str:
    if is_loss:
        return "loss"
    if is_attention:
        return "attention"
    if mod is None:
        return "other"
    cls = type(mod).__name__
    if cls.endswith("Experts"):
        return "experts"
    if cls.endswith("Router"):
        return "router"
    if isinstance(mod, nn.Embedding):
        return "embedding"
    if isinstance(mod, nn.Linear) or cls == "Conv1D":
        return "linear"
    if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return "conv"
    if isinstance(mod, nn.LayerNorm):
        return "layernorm"
    if _NORM_RMS.search(cls) or isinstance(mod, getattr(nn, "RMSNorm", ())):
        return "rmsnorm"
    if isinstance(mod, nn.modules.dropout._DropoutNd):
        return "dropout"
    if isinstance(mod, nn.Softmax):
        return "softmax"
    if cls.endswith("Loss"):
        return "loss"
    if mod.__class__.__module__.startswith(("torch.nn.modules.activation", "transformers.activations")) \
            or _ACTIVATION_NAMES.search(cls):
        return "activation"
    if "embed" in cls.lower():
        return "embedding"
    return "other"


def _linear_dims(mod: nn.Module) -> tuple[int, int]:
    if isinstance(mod, nn.Linear):
        return mod.in_features, mod.out_features
    w = getattr(mod, "weight", None)  # transformers Conv1D: weight (in, out)
    return (int(w.shape[0]), int(w.shape[1])) if w is not None else (0, 0)


def _attention_attrs(mod: nn.Module | None, ops: list[_Op], spec: ModelSpec) -> dict[str, int]:
    attrs: dict[str, int] = {}
    for op in ops:
        if op.target in ("scaled_dot_product_attention", "matmul", "bmm", "einsum") and len(op.inputs) >= 2:
            q, k = op.inputs[0][2], op.inputs[1][2]
            if len(q) == 4 and len(k) == 4:
                attrs["heads"], attrs["seq"], attrs["head_dim"] = q[1], q[2], q[3]
                if op.target == "scaled_dot_product_attention":
                    attrs["kv_heads"], attrs["kv_seq"] = k[1], k[2]
                else:  # q @ k^T: k is (b, heads, head_dim, kv_seq)
                    attrs["kv_seq"] = k[3]
                break
    if mod is not None:
        for name in ("num_heads", "num_attention_heads", "n_heads", "n_head"):
            v = getattr(mod, name, None) or getattr(getattr(mod, "config", None), name, None)
            if isinstance(v, int) and "heads" not in attrs:
                attrs["heads"] = v
        groups = getattr(mod, "num_key_value_groups", None)
        if isinstance(groups, int) and groups > 0 and "heads" in attrs:
            attrs["kv_heads"] = attrs["heads"] // groups
        attrs["causal"] = int(bool(getattr(mod, "is_causal", False)) or type(mod).__name__ == "SelfAttention")
    if "heads" in attrs:
        attrs.setdefault("kv_heads", spec.kv_heads or attrs["heads"])
    return attrs


def _tp_role(kind: str, path: str, group: str, mod: nn.Module | None, spec: ModelSpec, prev_role: str,
             d_out: int) -> str:
    in_block = group in ("block", "enc", "dec")
    if kind == "embedding":  # roles of linears and embeddings: predictor.tp_roles, shared with the runner
        return embedding_role(_strip_call(path), mod.num_embeddings, spec.vocab) if isinstance(mod, nn.Embedding) \
            else "replicated"
    if kind == "linear":
        return linear_role(_strip_call(path), in_block, d_out, spec.vocab if spec.family not in ("vit", "deit") else None)
    if kind == "attention":
        return "heads"
    if kind == "experts" or (kind == "activation" and prev_role == "experts"):
        return "experts"
    if kind == "router":
        return "tokens"
    if kind == "loss":
        return "vocab" if prev_role == "vocab" else "replicated"
    if kind in ("activation", "dropout") and in_block and prev_role == "column":
        return "column"  # works on the column-parallel FFN output (Megatron shards it too)
    return "replicated"


def _assemble(spec: ModelSpec, module: nn.Module, trace: _Trace, costs: _Costs,
              lists: list[_BlockList], first_only: set[str]) -> LayerGraph:
    mods = dict(module.named_modules())
    ops = trace.ops

    def mod_of(key: str) -> nn.Module | None:
        return mods.get(_strip_call(key))

    # 1. Which module calls are nodes.
    direct_targets: dict[str, set[str]] = {}
    for op in ops:
        direct_targets.setdefault(op.call, set()).add(op.target)
    node_calls: dict[str, tuple[bool, bool]] = {}  # call -> (is_attention, is_loss)
    for call, targets in direct_targets.items():
        if call == "":
            continue
        mod = mod_of(call)
        leaf = mod is not None and not list(mod.children())
        if mod is None:
            continue
        if leaf:
            node_calls[call] = (False, type(mod).__name__.endswith("Loss"))
        elif type(mod).__name__.endswith("Experts"):  # grouped GEMMs (bmm), not an attention core
            node_calls[call] = (False, False)
        elif targets & _ATTN_OPS:
            node_calls[call] = (True, False)
        elif any(True for _ in mod.named_parameters(recurse=False)):
            node_calls[call] = (False, False)

    _cores: set[str] = set()

    def core_seen(call: str) -> set[str]:
        seen_now = set(_cores)
        _cores.add(call)
        return seen_now

    # 2. Assign every op to a node (fold other ops into the preceding node; the top module's tail is the loss).
    last_node_op = max((i for i, op in enumerate(ops) if op.call in node_calls), default=-1)
    op_node_call: list[str] = []
    prev: str | None = None
    pending: list[int] = []
    for i, op in enumerate(ops):
        if op.call in node_calls:
            owner = op.call
        elif i > last_node_op:
            owner = "loss"
        elif prev is not None:
            owner = prev
        else:
            owner = ""  # before any node: resolved to the next node below
            pending.append(i)
        op_node_call.append(owner)
        if owner not in ("", "loss"):
            prev = owner
            for j in pending:
                op_node_call[j] = owner
            pending.clear()
    if "loss" in op_node_call:
        node_calls["loss"] = (False, True)

    # Index arithmetic outside layers that reads no activation (position ids, masks, T5's relative
    # position buckets) belongs to the layer that consumes it, not to the composite module running it.
    const = _constant_ops(ops)
    consumers: dict[int, list[int]] = {}
    for j, op in enumerate(ops):
        for src, _k, _s in op.inputs:
            if src is not None:
                consumers.setdefault(src, []).append(j)
    for i in range(len(ops) - 1, -1, -1):
        if const[i] and ops[i].call not in node_calls or (const[i] and node_calls[ops[i].call][0]):
            users = consumers.get(i, [])
            direct = [j for j in users if not const[j]] or users  # prefer a layer reading it directly
            if direct and op_node_call[direct[0]]:
                op_node_call[i] = op_node_call[direct[0]]

    # Execution order: a node's first op, an attention node's first attention-core op (after q, k, v).
    start: dict[str, int] = {}
    for i, owner in enumerate(op_node_call):
        if owner and owner not in start and not const[i]:
            start[owner] = i
    for i, owner in enumerate(op_node_call):
        if owner and owner not in start:
            start[owner] = i
    for i, op in enumerate(ops):
        if node_calls.get(op.call, (False, False))[0] and op.target in _ATTN_OPS and op.call not in core_seen(op.call):
            start[op.call] = i
    order = _topological(start, ops, op_node_call, const)
    pos = {c: i for i, c in enumerate(order)}

    # Figures measured at run time go to their call's node; those of composite modules (residual
    # adds, the SwiGLU product) to the node that last began before them, like their ops above; the
    # top module's figures after the last call are the loss's.
    def node_of_call(where: tuple[str, int]) -> str:
        key, n = where
        if key in pos:
            return key
        path = _strip_call(key)
        while path:  # inside a composite child of a node
            path = path.rpartition(".")[0]
            if path in pos:
                return path
        if key == "" and n >= len(costs.entered) and "loss" in pos:
            return "loss"
        for k in reversed(costs.entered[:max(n, 0)]):
            if k in pos:
                return k
        return order[0]

    fold: dict[str, str] = {}  # call -> the node its first op went to
    for op, owner in zip(ops, op_node_call):
        if owner:
            fold.setdefault(op.call, owner)

    # 3. Groups and counts.
    def block_of(call: str) -> _BlockList | None:
        p = _strip_call(call)
        for b in lists:
            if p == b.prefix or p.startswith(b.prefix + "."):
                return b
        return None

    block_pos = [pos[c] for c in order if block_of(c)]
    first_block, last_block = (min(block_pos), max(block_pos)) if block_pos else (len(order), -1)

    def group_count(call: str) -> tuple[str, int]:
        b = block_of(call)
        if b is not None:
            return b.group, (1 if b.traced_whole or _strip_call(call) in first_only else b.count)
        i = pos[call]
        if not lists or i < first_block:
            return ("pre" if lists else "block"), 1
        if i > last_block:
            return "post", 1
        p = _strip_call(call)
        for b in reversed(lists):  # between encoder and decoder blocks
            if b.stack and (p == b.stack or p.startswith(b.stack + ".")):
                return b.group, 1
        return lists[0].group, 1

    # 4. Per-node figures.
    node_ops: dict[str, list[int]] = {c: [] for c in order}
    for i, owner in enumerate(op_node_call):
        if owner:
            node_ops[owner].append(i)
    owner_of_op = {i: pos[o] for i, o in enumerate(op_node_call) if o}

    fwd = {c: 0.0 for c in order}
    bwd = {c: 0.0 for c in order}
    act = {c: 0.0 for c in order}
    mask = {c: 0.0 for c in order}
    for src, dst in ((costs.fwd, fwd), (costs.bwd, bwd), (costs.act, act), (costs.act_mask, mask)):
        for key, v in src.items():
            dst[node_of_call(key)] += v

    params = _assign_params(module, order, node_calls, mod_of, fold)

    nodes: list[LayerNode] = []
    roles: list[str] = []
    for c in order:
        idx = node_ops[c]
        is_attn, is_loss = node_calls.get(c, (False, c == "loss"))
        mod = None if c == "loss" else mod_of(c)
        kind = _kind_of(mod, c, is_attn, is_loss)
        if kind == "other" and direct_targets.get(c, set()) & {"linear", "mm", "addmm", "matmul"}:
            kind = "linear"  # a parameterless projection, e.g. GPT's logits against the tied embedding
        group, count = group_count(c) if c != "loss" else ("post" if lists else "block", 1)
        own = [i for i in idx if ops[i].call == c] or idx
        in_shape = _in_shape(ops, own, owner_of_op, pos[c])
        out_i = _out_op(ops, own, owner_of_op, pos[c])
        out_shape = ops[out_i].shape or () if out_i is not None else ()
        out_elems = float(ops[out_i].numel) if out_i is not None else 0.0
        its_ops = [ops[i] for i in idx]
        attrs = _attrs(kind, mod, its_ops, spec, in_shape, out_shape)
        if mask[c]:
            attrs["act_mask_elems"] = int(mask[c])
        role = _tp_role(kind, c, group, mod, spec, roles[-1] if roles else "replicated", attrs.get("d_out", 0))
        roles.append(role)
        nodes.append(LayerNode(
            name=c if c else "model", kind=kind, group=group, count=count, in_shape=in_shape, out_shape=out_shape,
            fwd_flops=fwd[c], bwd_flops=bwd[c], params=params.get(c, 0), act_elems=act[c], out_elems=out_elems,
            tp=role, attrs=attrs, ops=_op_counts(its_ops, attrs.get("p_x1000") == 0)))

    # Parameters of modules that never ran (none in the supported families) still count.
    unplaced = params.get(None, 0)  # type: ignore[call-overload]
    if unplaced:
        nodes.append(LayerNode("unused_parameters", "other", "post" if lists else "block", 1, (), (), 0.0, 0.0,
                               unplaced, 0.0, 0.0, "replicated", {}))

    edges = _edges(ops, owner_of_op, const)
    tokens = spec.tokens
    num_blocks = sum(b.count for b in lists) if lists else 1
    family = spec.family if spec.module is None else "module"
    return LayerGraph(family=str(family), nodes=nodes, edges=edges, tokens=tokens, num_blocks=num_blocks)


def _constant_ops(ops: list[_Op]) -> list[bool]:
    """Ops that depend on no activation, model input or parameter (arange, masks, index arithmetic)."""
    const: list[bool] = []
    for op in ops:
        const.append(all(src is not None and const[src] for src, _k, _s in op.inputs))
    return const


def _topological(start: dict[str, int], ops: list[_Op], owner: list[str], const: list[bool]) -> list[str]:
    """Nodes by their start op, moved after every node they take data from (T5's bias before its attention)."""
    import heapq

    deps: dict[str, set[str]] = {c: set() for c in start}
    for op, dst in zip(ops, owner):
        if not dst:
            continue
        for src_op, _k, _s in op.inputs:
            if src_op is not None and not const[src_op] and owner[src_op] and owner[src_op] != dst:
                deps[dst].add(owner[src_op])
    users: dict[str, set[str]] = {c: set() for c in start}
    for c, ds in deps.items():
        for d in ds:
            users[d].add(c)
    waiting = {c: len(ds) for c, ds in deps.items()}
    heap = [(start[c], c) for c, n in waiting.items() if n == 0]
    heapq.heapify(heap)
    order: list[str] = []
    while len(order) < len(start):
        if not heap:  # a cycle (should not happen): release the earliest waiting node
            c = min((c for c in start if c not in set(order)), key=lambda c: start[c])
            waiting[c] = 0
            heapq.heappush(heap, (start[c], c))
        _, c = heapq.heappop(heap)
        if c in order:
            continue
        order.append(c)
        for u in users[c]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(heap, (start[u], u))
    return order


def _assign_params(module: nn.Module, order: list[str], node_calls: dict, mod_of: Any,
                   fold: dict[str, str]) -> dict[Any, int]:
    """Each unique parameter once, to the first node whose module owns it (tied weights: the embedding)."""
    path_to_node: dict[str, str] = {}
    for c in order:
        path_to_node.setdefault(_strip_call(c), c)
    owners: dict[int, list[str]] = {}
    sizes: dict[int, int] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name.rpartition(".")[0])
        sizes[id(p)] = p.numel()
    out: dict[Any, int] = {}
    for pid, paths in owners.items():
        target = None
        for path in paths:
            if path in path_to_node:
                target = path_to_node[path]
                break
        if target is None:
            for path in paths:
                if path in fold and fold[path] in order:
                    target = fold[path]
                    break
        if target is None:
            for path in paths:  # nearest ancestor that is a node
                p = path
                while p and target is None:
                    p = p.rpartition(".")[0]
                    target = path_to_node.get(p)
                if target is not None:
                    break
        out[target] = out.get(target, 0) + sizes[pid]
    return out


def _in_shape(ops: list[_Op], idx: list[int], owner_of_op: dict[int, int], me: int) -> tuple[int, ...]:
    """Shape of the first activation entering the node from outside (another node or a model input)."""
    for i in idx:
        for src, kind, shape in ops[i].inputs:
            if src is not None and owner_of_op.get(src) != me:
                return shape
    for i in idx:
        for src, kind, shape in ops[i].inputs:
            if kind == "input":
                return shape
    for i in idx:
        for src, kind, shape in ops[i].inputs:
            if kind != "param":
                return shape
    return ()


def _out_op(ops: list[_Op], idx: list[int], owner_of_op: dict[int, int], me: int) -> int | None:
    """The node's output: the last of its own ops with a tensor result."""
    if not idx:
        return None
    shaped = [i for i in idx if ops[i].shape is not None]
    return shaped[-1] if shaped else None


def _edges(ops: list[_Op], owner_of_op: dict[int, int], const: list[bool]) -> list[tuple[int, int, float]]:
    """(src node, dst node, elements) for every activation one node hands another, summed per pair.

    Index arithmetic (positions, masks: `_constant_ops`) is not an activation and makes no edge."""
    acc: dict[tuple[int, int], float] = {}
    seen: set[tuple[int, int]] = set()
    for j, op in enumerate(ops):
        dst = owner_of_op.get(j)
        if dst is None:
            continue
        for src_op, _k, _s in op.inputs:
            if src_op is None or const[src_op]:
                continue
            src = owner_of_op.get(src_op)
            if src is None or src == dst or (src_op, dst) in seen:
                continue
            seen.add((src_op, dst))
            acc[(src, dst)] = acc.get((src, dst), 0.0) + float(ops[src_op].numel)
    return sorted((s, d, e) for (s, d), e in acc.items())


def _op_counts(ops: list[_Op], no_dropout: bool) -> dict[str, tuple[int, float]]:
    """aten op -> (calls, elements its inputs and first output hold), over a node's forward ops.
    A dropout of p = 0 returns its input untouched: it is counted as `dropout(p=0)`, a free op, so
    it is not priced like a real one."""
    out: dict[str, tuple[int, float]] = {}
    for op in ops:
        target = "dropout(p=0)" if no_dropout and op.target == "dropout" else op.target
        elems = float(op.numel) + sum(float(math.prod(shape)) for _src, _kind, shape in op.inputs)
        calls, total = out.get(target, (0, 0.0))
        out[target] = (calls + 1, total + elems)
    return out


def _attrs(kind: str, mod: nn.Module | None, ops: list[_Op], spec: ModelSpec,
           in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> dict[str, int]:
    seq = in_shape[-2] if len(in_shape) == 3 else (out_shape[-2] if len(out_shape) == 3 else 1)
    attrs: dict[str, int] = {}
    if kind == "linear" and mod is not None:
        d_in, d_out = _linear_dims(mod)
        attrs.update(d_in=d_in, d_out=d_out, bias=int(getattr(mod, "bias", None) is not None), seq=int(seq))
        if not any(True for _ in mod.parameters()) and in_shape and out_shape:  # GPT's tied logits
            attrs.update(d_in=in_shape[-1], d_out=out_shape[-1], bias=0)
    elif kind == "embedding" and isinstance(mod, nn.Embedding):
        attrs.update(num_embeddings=mod.num_embeddings, d_out=mod.embedding_dim, seq=int(seq))
    elif kind == "conv" and mod is not None:
        attrs.update(in_channels=mod.in_channels, out_channels=mod.out_channels,
                     kernel=int(mod.kernel_size[0]), stride=int(mod.stride[0]))
    elif kind == "attention":
        attrs.update(_attention_attrs(mod, ops, spec))
    elif kind == "experts" and mod is not None:  # down_proj: (E, h, f), or (E, f, h) where stored transposed
        shape = mod.down_proj.shape
        ffn = int(shape[1] if getattr(mod, "is_transposed", False) else shape[2])
        attrs.update(experts=int(shape[0]), d_in=int(spec.hidden or 0), d_ffn=ffn)
    elif kind in ("layernorm", "rmsnorm", "activation", "dropout", "softmax", "other", "embedding", "loss"):
        if out_shape:
            attrs["d"] = int(out_shape[-1])
        attrs["seq"] = int(seq)
    if kind == "dropout" and mod is not None:
        attrs["p_x1000"] = int(round(1000 * float(getattr(mod, "p", 0.0))))
    return attrs
