"""Applying a plan's parallelism to the real (HuggingFace) models of `predictor.modelzoo`.

Small separate functions in the torchtitan style: `apply_tp` (DTensor Colwise/Rowwise on the
block linears, Megatron's layout), `apply_fsdp` (`fully_shard` per block, then the root),
`apply_ddp`, `apply_full_recompute` (activation checkpointing per block), and `pipeline_stage` (the model cut into two halves of its blocks, the first
with the embeddings, the last with the head and the loss). They run inside an initialised
process group (see `predictor.measure.dist_worker`).

Tensor parallelism only shards what Megatron shards: Q/K/V and FC1 by output columns, the
attention output and FC2 by input rows; attention modules are told their local head count.
GPT-2's fused QKV `Conv1D` is first turned into an equivalent `nn.Linear` (DTensor styles
only take Linear/Embedding). With random weights the split of the fused QKV across ranks
does not matter for cost, which is all that is measured here.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from predictor.workload import ModelSpec

# Last path component of block linears, by Megatron role. BERT names both its attention
# output and its FC2 "output.dense" and its FC1 "intermediate.dense".
COLUMN = {"query", "key", "value", "q", "k", "v", "q_proj", "k_proj", "v_proj", "c_attn", "c_fc", "wi", "fc1"}
ROW = {"o", "o_proj", "c_proj", "wo", "fc2"}
HEAD_ATTRS = ("num_attention_heads", "num_heads", "n_heads", "n_head")
_IN_BLOCK = re.compile(r"\.\d+\.")


def _role(path: str) -> str | None:
    if not _IN_BLOCK.search(path):
        return None
    leaf = path.rsplit(".", 1)[-1]
    if leaf in COLUMN or path.endswith("intermediate.dense"):
        return "column"
    if leaf in ROW or path.endswith("output.dense"):
        return "row"
    return None


def conv1d_to_linear(model: nn.Module) -> nn.Module:
    """Replace HF GPT-2 `Conv1D` (weight stored transposed) by the equivalent `nn.Linear`."""
    for name, child in list(model.named_children()):
        if type(child).__name__ == "Conv1D":
            nx, nf = child.weight.shape
            lin = nn.Linear(nx, nf, device=child.weight.device, dtype=child.weight.dtype)
            with torch.no_grad():
                lin.weight.copy_(child.weight.t())
                lin.bias.copy_(child.bias)
            setattr(model, name, lin)
        else:
            conv1d_to_linear(child)
    return model


def apply_tp(model: nn.Module, mesh: Any) -> nn.Module:
    """Megatron tensor parallelism over `mesh` (1-D) with DTensor `parallelize_module`."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = mesh.size()
    conv1d_to_linear(model)
    plan: dict[str, Any] = {}
    for path, module in model.named_modules():
        role = _role(path)
        if isinstance(module, nn.Linear) and role:
            plan[path] = ColwiseParallel() if role == "column" else RowwiseParallel()
        elif isinstance(module, nn.Embedding) and path.endswith("relative_attention_bias"):
            plan[path] = ColwiseParallel()  # T5's per-head position bias: local heads only
    if not plan:
        raise ValueError("tensor parallel: found no block linears to shard in this model")
    for path, module in model.named_modules():  # modules owning sharded linears see local heads
        if not any(p.startswith(path + ".") for p in plan) or not _IN_BLOCK.search(path + "."):
            continue
        for attr in HEAD_ATTRS:
            value = getattr(module, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value % tp == 0:
                setattr(module, attr, value // tp)
        if type(module).__name__ == "GPT2Attention":
            module.split_size //= tp  # c_attn output splits into q, k, v of the local width
    return parallelize_module(model, mesh, plan)


def block_lists(model: nn.Module) -> list[nn.ModuleList]:
    """The ModuleLists of repeated transformer blocks (two for T5: encoder and decoder)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) and
             len({type(c) for c in m}) == 1 and sum(p.numel() for p in m.parameters()) > 0]
    top = max(sum(p.numel() for p in m.parameters()) for m in lists)
    return [m for m in lists if sum(p.numel() for p in m.parameters()) * 4 >= top]


def apply_fsdp(model: nn.Module, mesh: Any, reshard_after_forward: bool = True) -> nn.Module:
    """FSDP2 sharding, each block a unit and the rest falling to the root: ZeRO-3 (parameters gathered
    again for the backward pass), or with `reshard_after_forward=False` ZeRO-2 (SHARD_GRAD_OP: gathered
    once per step and kept through the backward pass; gradients reduce-scattered, Adam states sharded)."""
    from torch.distributed.fsdp import fully_shard

    for blocks in block_lists(model):
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def apply_full_recompute(model: nn.Module) -> nn.Module:
    """Megatron's full recomputation: each block keeps only its input and recomputes its activations
    in the backward pass (non-reentrant `torch.utils.checkpoint`). Applied before any sharding: it
    replaces only each block's `forward`, so parameter names (tensor parallel plans) and module
    hooks (FSDP, DDP) are untouched, and pipeline stages built from the blocks inherit it."""
    from functools import partial

    from torch.utils.checkpoint import checkpoint

    for blocks in block_lists(model):
        for block in blocks:
            block.forward = partial(checkpoint, block.forward, use_reentrant=False)
    return model


def apply_ddp(model: nn.Module) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)


# ----------------------------------------------------------------------------- pipeline stages


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


class Stage(nn.Module):
    """One pipeline stage: optional `pre` (inputs -> hidden), some blocks, optional `post` (hidden -> logits)."""

    def __init__(self, parts: nn.ModuleDict, blocks: list[nn.Module], pre: Callable | None, post: Callable | None,
                 block_kwargs: Callable[[torch.Tensor], dict] | None = None):
        super().__init__()
        self.parts = parts
        self.blocks = nn.ModuleList(blocks)
        self._pre, self._post, self._kw = pre, post, block_kwargs or (lambda x: {})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._pre is not None:
            x = self._pre(self.parts, x)
        kwargs = self._kw(x)
        for block in self.blocks:
            x = _first(block(x, **kwargs))
        if self._post is not None:
            x = self._post(self.parts, x)
        return x


def _lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


def pipeline_stage(model: nn.Module, spec: ModelSpec, stage: int, mbs: int) -> tuple[nn.Module, Callable]:
    """Stage `stage` (0 or 1) of a 2-stage split of `model`, and the loss the last stage applies.

    The first stage takes the model's main input (ids or pixels), the last returns logits;
    T5 is cut between encoder and decoder (its decoder ids are a fixed random buffer of the
    micro-batch's shape, so only hidden states cross the stage boundary).
    """
    fam = spec.family
    if fam == "gpt2":
        t = model.transformer
        half = len(t.h) // 2
        def pre(p, ids):
            pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
            return p["drop"](p["wte"](ids) + p["wpe"](pos))
        def post(p, x):
            return p["lm_head"](p["ln_f"](x))
        parts = (nn.ModuleDict({"wte": t.wte, "wpe": t.wpe, "drop": t.drop}) if stage == 0 else
                 nn.ModuleDict({"ln_f": t.ln_f, "lm_head": model.lm_head}))
        blocks = list(t.h)[:half] if stage == 0 else list(t.h)[half:]
        return Stage(parts, blocks, pre if stage == 0 else None, post if stage == 1 else None), _lm_loss
    if fam == "bert":
        enc = model.bert.encoder.layer
        half = len(enc) // 2
        parts = nn.ModuleDict({"emb": model.bert.embeddings}) if stage == 0 else nn.ModuleDict({"cls": model.cls})
        return Stage(parts, list(enc)[:half] if stage == 0 else list(enc)[half:],
                     (lambda p, ids: p["emb"](input_ids=ids)) if stage == 0 else None,
                     (lambda p, x: p["cls"](x)) if stage == 1 else None), _lm_loss
    if fam in ("vit", "deit"):
        base = getattr(model, fam)
        layers = base.layers if hasattr(base, "layers") else base.encoder.layer
        half = len(layers) // 2
        parts = (nn.ModuleDict({"emb": base.embeddings}) if stage == 0 else
                 nn.ModuleDict({"norm": base.layernorm, "head": model.classifier}))
        return Stage(parts, list(layers)[:half] if stage == 0 else list(layers)[half:],
                     (lambda p, px: p["emb"](px)) if stage == 0 else None,
                     (lambda p, x: p["head"](p["norm"](x)[:, 0, :])) if stage == 1 else None), F.cross_entropy
    if fam == "t5":
        if stage == 0:
            enc = model.encoder
            return Stage(nn.ModuleDict({"enc": enc}), [], lambda p, ids: p["enc"](input_ids=ids).last_hidden_state,
                         None), _lm_loss
        dec_ids = torch.randint(0, spec.vocab or 2, (mbs, spec.seq_len or 1))
        # As T5ForConditionalGeneration.forward: with tied embeddings the decoder output is scaled by
        # d_model^-0.5 before the LM head. Without it the logits are sqrt(d_model) times too large, the
        # softmax's gradient underflows into denormals, and a CPU step runs up to 11x slower (d_model 128).
        scaled = getattr(model.config, "scale_decoder_outputs", model.config.tie_word_embeddings)  # older transformers
        out_scale = model.model_dim ** -0.5 if scaled else 1.0

        def post(p, x):
            out = p["dec"](input_ids=dec_ids[: x.shape[0]], encoder_hidden_states=x, use_cache=False).last_hidden_state
            return p["lm_head"](out * out_scale)
        return Stage(nn.ModuleDict({"dec": model.decoder, "lm_head": model.lm_head}), [], None, post), _lm_loss
    raise ValueError(f"pipeline parallel: no stage split for family {fam!r}")
