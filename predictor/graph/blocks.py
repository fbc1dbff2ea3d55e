"""The repeated transformer blocks: which module lists hold them, how many the full model has, and the
reduced model with one block per list that is traced in their stead (a 96-layer model costs one block)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from predictor.graph.modelzoo import build_model
from predictor.spec.workload import ModelSpec

_HF_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def block_counts(model: ModelSpec) -> list[int]:
    """Blocks per block list of the full model ([] for `module:` models, traced whole)."""
    if model.module is not None:
        return []
    layers = model.layers or 0
    if model.seq2seq:
        dec = model.decoder_layers if model.decoder_layers is not None else layers
        return [layers, dec]
    return [layers]


def reduced_spec(model: ModelSpec) -> ModelSpec:
    """The same model with one block per block list (one encoder and one decoder block for T5)."""
    update: dict[str, Any] = {"layers": 1}
    if model.seq2seq:
        update["decoder_layers"] = 1
    if model.hf_config is not None:
        cfg = dict(model.hf_config)
        for key in _HF_LAYER_KEYS:
            if key in cfg:
                cfg[key] = 1
        if model.seq2seq:
            cfg["num_decoder_layers"] = 1
            cfg.setdefault("num_layers", 1)
        update["hf_config"] = cfg
    return model.model_copy(update=update)


@dataclass
class BlockList:
    """One list of repeated blocks of the traced model, with the number of blocks it stands for."""

    path: str  # e.g. "model.layers" (module path of the ModuleList)
    count: int  # blocks in the full model
    group: str  # "block", or "enc"/"dec" for an encoder-decoder
    traced_whole: bool = False  # a user module's blocks: all traced, each node counted once
    index: int = 0  # the traced block of the list this entry stands for (a hybrid traces one of each kind)

    @property
    def prefix(self) -> str:
        return self.path if self.traced_whole else f"{self.path}.{self.index}"

    @property
    def stack(self) -> str:
        """Path of the module holding the list ('' for the top module), e.g. 'encoder'."""
        return self.path.rpartition(".")[0]


def block_lists(module: nn.Module, counts: list[int]) -> list[BlockList]:
    """The ModuleLists of blocks in the reduced model, in registration order, with their full counts."""
    if not counts:
        return []
    found = [name for name, m in module.named_modules() if isinstance(m, nn.ModuleList) and len(m) == 1
             and len(list(m[0].children())) > 0]
    if len(found) != len(counts):
        raise ValueError(f"expected {len(counts)} list(s) of transformer blocks, found {found or 'none'}")
    groups = ["enc", "dec"] if len(found) == 2 else ["block"]
    return [BlockList(path, n, g) for path, n, g in zip(found, counts, groups)]


def user_block_list(module: nn.Module) -> list[BlockList]:
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
    return [BlockList(best[1], best[0], "block", traced_whole=True)]


def first_block_only(model: ModelSpec, lists: list[BlockList]) -> set[str]:
    """Module paths (in block 0) that the later blocks lack (T5's relative position bias): count 1."""
    fam = model.family_entry
    if not any(b.count >= 2 for b in lists) or (model.hf_config is None and fam is not None and fam.config is None):
        return set()  # our GPT's blocks are identical by construction
    update: dict[str, Any] = {"layers": 2}
    if model.seq2seq:
        update["decoder_layers"] = 2
    spec2 = reduced_spec(model).model_copy(update=update)
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
