"""The blocks of an `hf_config:` decoder, told apart from the modules themselves: a hybrid stack (Mamba and
attention layers, dense and MoE MLPs, chunked, sliding-window and NoPE attention) is traced with one block of each
kind, each counted for the blocks of its kind.

The whole model is built on the meta device (no memory, any size) and each block's signature read: its modules'
classes, parameter shapes and the settings they hold (an attention's window or type, a rope switch). The traced
model keeps the shortest prefix of the stack that holds every kind: its config is the user's with the layer count
cut to that prefix and every per-layer list cut with it, and its blocks must have the signatures of the full
model's first ones, else the whole stack is traced.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch import nn

from predictor.graph.blocks import BlockList
from predictor.graph.modelzoo import build_model
from predictor.spec.workload import ModelSpec

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_ID_WORDS = ("idx", "index", "layer_id", "layer_number")  # per-block numbering, not a kind


def signature(block: nn.Module) -> tuple:
    """What makes two blocks the same kind: their modules' classes, parameter shapes and scalar settings."""
    out = []
    for name, mod in block.named_modules():
        settings = tuple(sorted((k, v) for k, v in vars(mod).items() if not k.startswith("_")
                                and isinstance(v, (str, bool, int, float, type(None)))
                                and not any(w in k for w in _ID_WORDS) and k != "training"))
        shapes = tuple((n, tuple(p.shape)) for n, p in mod.named_parameters(recurse=False))
        out.append((name, type(mod).__name__, shapes, settings))
    return tuple(out)


def block_stack(module: nn.Module, layers: int) -> tuple[str, nn.ModuleList]:
    """The ModuleList of the decoder's `layers` blocks (the one holding most parameters)."""
    found = [(sum(p.numel() for p in m.parameters()), name, m) for name, m in module.named_modules()
             if isinstance(m, nn.ModuleList) and len(m) == layers and name]
    if not found:
        raise ValueError(f"no list of {layers} blocks in the model")
    _, name, stack = max(found, key=lambda t: t[0])
    return name, stack


def hybrid_plan(model: ModelSpec) -> tuple[ModelSpec, list[int] | None]:
    """(the spec to trace, the full model's block count each of its blocks stands for; None where no list of
    `layers` blocks is found: the model is traced whole, as one block)."""
    layers = model.layers or 0
    full = build_model(model, device="meta")
    try:
        _, stack = block_stack(full, layers)
    except ValueError:
        return model, None
    kinds = [signature(b) for b in stack]
    first = {}
    for i, k in enumerate(kinds):
        first.setdefault(k, i)
    prefix = max(first.values()) + 1
    if prefix == layers:
        return model, [1] * layers
    reduced = model.model_copy(update={"layers": prefix, "hf_config": _cut_config(full.config, model.hf_config or {},
                                                                                   layers, prefix)})
    try:  # a list the cut took for a per-layer one (as long as the stack by chance) can break the config
        _, small = block_stack(build_model(reduced, device="meta"), prefix)
    except Exception:  # noqa: BLE001 - any failure of the cut config: trace the whole stack instead
        return model, [1] * layers
    if [signature(b) for b in small] != kinds[:prefix]:
        return model, [1] * layers
    total, seen = Counter(kinds), Counter(kinds[:prefix])
    counts = [total[k] - seen[k] + 1 if first[k] == i else 1 for i, k in enumerate(kinds[:prefix])]
    return reduced, counts


def _cut_config(config: Any, given: dict[str, Any], layers: int, prefix: int) -> dict[str, Any]:
    """The user's config with its layer count `prefix` and each per-layer list of the built config cut to it."""
    out = dict(given)
    for key in _LAYER_KEYS:
        if key in out or getattr(config, key, None) == layers:
            out[key] = prefix
    for key, value in vars(config).items():
        per_layer = isinstance(value, list) or (isinstance(value, str) and "pattern" in key)  # M-M*- strings
        if per_layer and len(value) == layers and not key.startswith("_"):
            out[key] = value[:prefix]
    return out


def hybrid_lists(module: nn.Module, counts: list[int] | None) -> list[BlockList]:
    """The traced model's blocks, each counted for the full model's blocks of its kind ([]: traced whole)."""
    if counts is None:
        return []
    path, _ = block_stack(module, len(counts))
    return [BlockList(path, c, "block", index=i) for i, c in enumerate(counts)]
