"""The model's structure: its training-step forward exported with `torch.export`, as a flat list of aten ops,
each with the module call that ran it (from `meta["nn_module_stack"]`) and where its inputs come from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo  # noqa: F401  torch.export's machinery: a one-off import cost (seconds), paid at import
import torch.export
from torch import nn
from torch.utils._pytree import tree_flatten

from predictor.graph.modelzoo import output_loss


class _LossWrapper(nn.Module):
    """Exports the training step's forward (model + loss); the model sits at attribute `model`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return output_loss(self.model(*args, **kwargs))


@dataclass
class Op:
    """One aten op of the exported forward."""

    call: str  # module call key: module path, plus "@k" for its k-th repeated call ('' = top module)
    target: str  # aten op name without namespace/overload, e.g. "linear"
    inputs: list[tuple[int | None, str, tuple[int, ...]]]  # (producer op index or None, placeholder kind, shape)
    shape: tuple[int, ...] | None  # first output's shape
    numel: int


def strip_call(key: str) -> str:
    """The module path of a module call key (without its '@k' call index)."""
    return key.split("@")[0]


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


def export_ops(module: nn.Module, args: tuple, kwargs: dict) -> list[Op]:
    """The ops of one forward of `module` plus its loss, in execution order."""
    exported = torch.export.export(_LossWrapper(module), args, kwargs, strict=False)
    sig = exported.graph_signature
    user_inputs = set(sig.user_inputs)
    index: dict[str, int] = {}
    ops: list[Op] = []
    placeholders: dict[str, tuple[str, tuple[int, ...]]] = {}
    for node in exported.graph.nodes:
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
        ops.append(Op(_export_call_key(node.meta.get("nn_module_stack")), target, ins, _shape(val), _numel(val)))
    return ops


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
