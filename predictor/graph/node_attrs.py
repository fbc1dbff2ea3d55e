"""What one node is: its kind, its tensor-parallel role, the structural attributes predictors read off it, and the
eager operators it runs."""

from __future__ import annotations

import math
import re
from typing import Mapping

from torch import nn

from predictor.graph.tp_roles import embedding_role, linear_role
from predictor.graph.tracing import Op, strip_call
from predictor.spec.workload import ModelSpec

_NORM_RMS = re.compile(r"rmsnorm|t5layernorm|llamarmsnorm", re.I)
_ACTIVATION_NAMES = re.compile(
    r"(gelu|relu|silu|swish|tanh|sigmoid|mish|elu|quickgelu|activation|identity)$", re.I)


def kind_of(mod: nn.Module | None, is_attention: bool, is_loss: bool) -> str:
    """The node's `LayerNode.kind`, from its module's class (`LAYER_KINDS`, plus "experts" and "router")."""
    if is_loss:
        return "loss"
    if is_attention:
        return "ssm" if mod is not None and is_ssm(mod) else "attention"
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


def is_ssm(mod: nn.Module) -> bool:
    """A state-space or linear-attention mixer (Mamba, Mamba-2, Gated DeltaNet): its decay `A_log` is a parameter
    of its own. Its scan's matmuls and einsums look like an attention core's to the tracer; it is priced apart."""
    return any(name == "A_log" for name, _ in mod.named_parameters(recurse=False))


def _ssm_attrs(mod: nn.Module, spec: ModelSpec) -> dict[str, int]:
    """Heads, head width, state size and scan chunk of a mixer, read off the module."""
    heads = int(mod.A_log.numel())
    def first(names: tuple[str, ...], default: int) -> int:
        return next((int(getattr(mod, a)) for a in names if isinstance(getattr(mod, a, None), int)), default)

    head_dim = first(("head_dim", "head_v_dim"), int(spec.hidden or 0) // max(heads, 1))
    state = first(("ssm_state_size", "head_k_dim", "d_state"), head_dim)
    chunk = getattr(mod, "chunk_size", 64)
    return {"heads": heads, "head_dim": head_dim, "state": state, "chunk": int(chunk) if isinstance(chunk, int) else 64}


def _linear_dims(mod: nn.Module) -> tuple[int, int]:
    if isinstance(mod, nn.Linear):
        return mod.in_features, mod.out_features
    w = getattr(mod, "weight", None)  # transformers Conv1D: weight (in, out)
    return (int(w.shape[0]), int(w.shape[1])) if w is not None else (0, 0)


def _attention_attrs(mod: nn.Module | None, ops: list[Op], spec: ModelSpec) -> dict[str, int]:
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


def node_attrs(kind: str, mod: nn.Module | None, ops: list[Op], spec: ModelSpec,
               in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> dict[str, int]:
    """The structural features a predictor reads off a node of `kind` (`LayerNode.attrs`)."""
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
    elif kind == "ssm" and mod is not None:
        attrs.update(_ssm_attrs(mod, spec), seq=int(seq))
    elif kind == "experts" and mod is not None:  # down_proj: (E, h, f), or (E, f, h) where stored transposed
        shape = mod.down_proj.shape
        if hasattr(mod, "is_transposed"):
            ffn = int(shape[1] if mod.is_transposed else shape[2])
        else:  # a module of its own (Llama 4's): the dimension that is not the hidden size
            ffn = int(shape[1] if shape[2] == spec.hidden else shape[2])
        attrs.update(experts=int(shape[0]), d_in=int(spec.hidden or 0), d_ffn=ffn)
    elif kind in ("layernorm", "rmsnorm", "activation", "dropout", "softmax", "other", "embedding", "loss"):
        if out_shape:
            attrs["d"] = int(out_shape[-1])
        attrs["seq"] = int(seq)
    if kind == "dropout" and mod is not None:
        attrs["p_x1000"] = int(round(1000 * float(getattr(mod, "p", 0.0))))
    return attrs


def op_counts(ops: list[Op], no_dropout: bool) -> dict[str, tuple[int, float]]:
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


def tp_role(kind: str, path: str, group: str, mod: nn.Module | None, spec: ModelSpec, prev_role: str,
            d_out: int) -> str:
    """How tensor parallelism shards the node (`TPRole`); `prev_role` is the role of the node just before it."""
    in_block = group in ("block", "enc", "dec")
    if kind == "embedding":  # roles of linears and embeddings: predictor.graph.tp_roles, shared with the runner
        return embedding_role(strip_call(path), mod.num_embeddings, spec.vocab, _roles(spec)) \
            if isinstance(mod, nn.Embedding) \
            else "replicated"
    if kind == "linear":
        return linear_role(strip_call(path), in_block, d_out, None if spec.vision else spec.vocab, _roles(spec))
    if kind in ("attention", "ssm"):
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


def _roles(spec: ModelSpec) -> Mapping[str, str]:
    fam = spec.family_entry
    return fam.roles if fam is not None else {}
