"""Applying a plan's parallelism to the real models of `predictor.graph.modelzoo`, in torchtitan's order.

Small separate functions in the torchtitan style, composed by `predictor.measure.compose`:
`apply_tp` (DTensor `parallelize_module` by the roles of `predictor.graph.tp_roles`, with sequence-parallel
norms and sequence gathers before the column linears), `apply_recompute` (selective: the attention core's
ops recomputed; full: the whole block), `model_chunks` (the model cut into pp·v pipeline chunks of whole
blocks, the first with the embeddings, the last with the head), `apply_ddp` and `apply_fsdp` (data
parallelism per ZeRO stage). They run inside an initialised process group.

Fused QKV projections (GPT-2's `c_attn`, Megatron GPT's `query_key_value`) are reordered before
sharding so that each rank's output columns are its own heads' q, k and v, as Megatron lays them out:
a tp run then computes the single-process model's function, not a shuffled one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from predictor.graph.tp_roles import embedding_role, in_block, linear_role
from predictor.measure.modules import block_lists, layer_kind
from predictor.spec.workload import ModelSpec

# Attributes holding an attention module's head count; divided by tp on modules whose linears are sharded.
HEAD_ATTRS = ("num_attention_heads", "num_heads", "n_heads", "n_head", "heads")
FUSED_QKV = {"c_attn", "query_key_value"}
# What selective recomputation recomputes: the attention core (scores, softmax, context; fused or not).
ATTENTION_CORE_OPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._softmax.default, torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default,
}


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


def tp_roles(model: nn.Module, spec: ModelSpec) -> dict[str, str]:
    """The role (`predictor.graph.tp_roles`) of every linear and embedding of `model`, by module path."""
    vocab = None if spec.vision else spec.vocab
    own = spec.family_entry.roles if spec.family_entry is not None else {}
    roles = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D":
            out = module.out_features if isinstance(module, nn.Linear) else module.weight.shape[1]
            roles[path] = linear_role(path, in_block(path), out, vocab, own)
        elif isinstance(module, nn.Embedding):
            roles[path] = embedding_role(path, module.num_embeddings, spec.vocab, own)
    return roles


def _interleave_qkv(linear: nn.Linear, tp: int) -> None:
    """Rows [q | k | v] -> [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]: rank r's column shard holds its heads' q, k, v."""
    with torch.no_grad():
        for p in (linear.weight, linear.bias):
            if p is not None:
                p.copy_(p.view(3, tp, p.shape[0] // (3 * tp), *p.shape[1:]).transpose(0, 1).reshape(p.shape))


def _tied(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Parameters shared by several modules (tied embeddings and heads), as (module, attribute) lists."""
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append((module, name))
    return [o for o in owners.values() if len(o) > 1]


def _gather_sequence(mesh: Any, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook of a module that starts with column linears under sequence parallelism: its input,
    sharded along the sequence, is all-gathered (reduce-scattered in backward), as torchtitan's
    `PrepareModuleInput(Shard(1) -> Replicate())`; works for a positional or a `hidden_states` input."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    def full(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        dt = x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, [Shard(1)], run_check=False)
        return dt.redistribute(placements=[Replicate()])

    if args:
        return (full(args[0]), *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": full(kwargs["hidden_states"])}


def apply_tp(model: nn.Module, spec: ModelSpec, mesh: Any, sp: bool) -> nn.Module:
    """Megatron tensor (and with `sp` sequence) parallelism over the 1-D `mesh`, by `tp_roles`.

    Column linears split their outputs, row linears their inputs (all-reduce, or reduce-scatter along the
    sequence with sp), the word embedding and the LM head split the vocabulary, T5's position bias its
    heads. With sp the norms inside blocks run on their sequence shard (`SequenceParallel`, their weight
    gradients reduced over tp) and modules starting with column linears gather the sequence first;
    `model_chunks` scatters the embeddings' output and gathers before the head.
    """
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module,
    )

    tp = mesh.size()
    conv1d_to_linear(model)
    tied = _tied(model)
    plan: dict[str, Any] = {}
    column_parents: set[str] = set()
    for path, role in tp_roles(model, spec).items():
        module = model.get_submodule(path)
        if role == "column":
            if path.rpartition(".")[2] in FUSED_QKV:
                _interleave_qkv(module, tp)
            plan[path] = ColwiseParallel()
            column_parents.add(path.rpartition(".")[0])
        elif role == "row":
            plan[path] = RowwiseParallel(output_layouts=Shard(1) if sp else Replicate())
        elif role == "heads":
            plan[path] = ColwiseParallel()
        elif role == "vocab" and isinstance(module, nn.Embedding):
            plan[path] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        elif role == "vocab":
            plan[path] = ColwiseParallel(output_layouts=Replicate())
    if not plan:
        raise ValueError("tensor parallel: found no block linears to shard in this model")
    for path in column_parents:  # modules owning sharded linears see their local heads
        module = model.get_submodule(path)
        for attr in HEAD_ATTRS:
            value = getattr(module, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value % tp == 0:
                setattr(module, attr, value // tp)
        if type(module).__name__ == "GPT2Attention":
            module.split_size //= tp  # c_attn output splits into q, k, v of the local width
        if sp:
            module.register_forward_pre_hook(partial(_gather_sequence, mesh), with_kwargs=True)
    if sp:
        for path, module in model.named_modules():
            if in_block(path) and layer_kind(module) in ("layernorm", "rmsnorm"):
                plan[path] = SequenceParallel(use_local_output=True)  # post-LN (BERT): the norm feeds the residual
    parallelize_module(model, mesh, plan)
    for owners in tied:  # parallelize_module made a new parameter for the module it sharded: tie to that one
        first, name = next(((m, a) for m, a in owners if isinstance(getattr(m, a), DTensor)), owners[0])
        for module, attr in owners:
            setattr(module, attr, getattr(first, name))
    return model


def _attention_core_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.PREFER_RECOMPUTE if op in ATTENTION_CORE_OPS else CheckpointPolicy.MUST_SAVE


def _selective_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    # T5 adds its position bias in place into saved scores; the parity tests show the same losses with it allowed
    return create_selective_checkpoint_contexts(_attention_core_policy, allow_cache_entry_mutation=True)


def apply_recompute(model: nn.Module, mode: str) -> nn.Module:
    """Activation recomputation per block (non-reentrant `torch.utils.checkpoint`): `full` keeps only each
    block's input and recomputes the block in backward (Megatron's full recomputation); `selective` keeps
    every op's output except the attention core's, which is recomputed (torchtitan's op-level selective
    checkpointing with Megatron's choice of ops). Only each block's `forward` is replaced, so parameter
    names (tp plans) and module hooks (FSDP, DDP) are untouched, and pipeline chunks inherit it."""
    from torch.utils.checkpoint import checkpoint

    if mode == "none":
        return model
    options: dict[str, Any] = {"use_reentrant": False}
    if mode == "selective":
        options["context_fn"] = _selective_context
    for blocks in block_lists(model):
        for block in blocks:
            block.forward = partial(checkpoint, block.forward, **options)
    return model


def apply_ddp(module: nn.Module, mesh: Any, composable: bool) -> nn.Module:
    """Gradient all-reduce over the data-parallel `mesh` (ZeRO 0, and 1 with a sharded optimizer): DDP, or with
    `composable` FSDP2's `replicate` (all-reduce, no sharding), which takes DTensor parameters (tp) and several
    chunks per rank (interleaved pipelines). DDP fails its reducer's bucket rebuild there: with two DDP chunks
    on a rank, or after PyTorch's `_pre_dp_module_transform` for tp, under a pipeline schedule's micro-batches."""
    from torch.nn.parallel import DistributedDataParallel

    if composable:
        from torch.distributed._composable.replicate_with_fsdp import replicate

        return replicate(module, mesh=mesh)
    return DistributedDataParallel(module, process_group=mesh.get_group())


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


# ----------------------------------------------------------------------------- pipeline chunks


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


class Stage(nn.Module):
    """A run of the model: optional `pre` (inputs -> hidden), some blocks, optional `post` (hidden -> logits).

    `seq_mesh` (sequence parallelism): the hidden states between `pre` and `post` are sharded along the
    sequence over it: `pre`'s output is scattered, and gathered again before `post`."""

    def __init__(self, parts: nn.ModuleDict, blocks: list[nn.Module], pre: Callable | None, post: Callable | None,
                 block_kwargs: Callable[[torch.Tensor], dict] | None = None, seq_mesh: Any = None):
        super().__init__()
        self.parts = parts
        self.blocks = nn.ModuleList(blocks)
        self._pre, self._post, self._kw, self._seq_mesh = pre, post, block_kwargs or (lambda x: {}), seq_mesh

    def _reshard(self, x: torch.Tensor, src: Any, dst: Any) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(x, self._seq_mesh, [src], run_check=False).redistribute(placements=[dst]).to_local()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import Replicate, Shard

        if self._pre is not None:
            x = self._pre(self.parts, x)
            if self._seq_mesh is not None:
                x = self._reshard(x, Replicate(), Shard(1))
        kwargs = self._kw(x)
        for block in self.blocks:
            x = _first(block(x, **kwargs))
        if self._post is not None:
            if self._seq_mesh is not None:
                x = self._reshard(x, Shard(1), Replicate())
            x = self._post(self.parts, x)
        return x


def _lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


def _vocab_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Logits against a (tied, possibly vocab-sharded DTensor) embedding weight; gathered when sharded."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(weight, DTensor):
        return F.linear(x, weight)
    x = DTensor.from_local(x, weight.device_mesh, [Replicate()], run_check=False)
    return F.linear(x, weight).redistribute(placements=[Replicate()]).to_local()


@dataclass
class Layout:
    """A model as pipeline units: `pre` with its parts, the repeated blocks, `post` with its parts."""

    pre_parts: dict[str, nn.Module]
    blocks: list[nn.Module]
    post_parts: dict[str, nn.Module]
    pre: Callable
    post: Callable
    loss: Callable
    block_kwargs: Callable[[torch.Tensor], dict] | None = None
    max_chunks: int | None = None  # T5: encoder | decoder


def layout(model: nn.Module, spec: ModelSpec) -> Layout:
    """How `model` of `spec`'s family splits into pipeline units (T5: the encoder, then decoder and head, whose
    decoder ids are a fixed random row, the same for every sample, so only hidden states cross stages)."""
    fam = spec.family_entry
    kind = fam.layout if fam is not None else None
    if kind == "megatron":
        return Layout({"emb": model.embedding}, list(model.layers), {"ln": model.final_layernorm, "emb": model.embedding},
                      lambda p, ids: p["emb"](ids),
                      lambda p, x: _vocab_logits(p["ln"](x), p["emb"].word_embeddings.weight), _lm_loss)
    if kind == "hf_decoder":  # Llama's layout: embed_tokens, layers, norm, lm_head, rotary embeddings
        base = model.model
        positions = torch.arange(spec.seq_len or 1, device=base.embed_tokens.weight.device).unsqueeze(0)
        rotary = base.rotary_emb
        return Layout({"emb": base.embed_tokens}, list(base.layers), {"norm": base.norm, "head": model.lm_head},
                      lambda p, ids: p["emb"](ids), lambda p, x: p["head"](p["norm"](x)), _lm_loss,
                      block_kwargs=lambda x: {"position_embeddings": rotary(x, position_ids=positions)})
    if kind == "transformer_h":  # GPT-2's
        t = model.transformer

        def pre(p: nn.ModuleDict, ids: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
            return p["drop"](p["wte"](ids) + p["wpe"](pos))
        return Layout({"wte": t.wte, "wpe": t.wpe, "drop": t.drop}, list(t.h), {"ln_f": t.ln_f, "lm_head": model.lm_head},
                      pre, lambda p, x: p["lm_head"](p["ln_f"](x)), _lm_loss)
    if kind == "masked_lm":  # BERT's
        return Layout({"emb": model.bert.embeddings}, list(model.bert.encoder.layer), {"cls": model.cls},
                      lambda p, ids: p["emb"](input_ids=ids), lambda p, x: p["cls"](x), _lm_loss)
    if kind == "vision":
        base = model.base_model
        layers = base.layers if hasattr(base, "layers") else base.encoder.layer
        return Layout({"emb": base.embeddings}, list(layers), {"norm": base.layernorm, "head": model.classifier},
                      lambda p, px: p["emb"](px), lambda p, x: p["head"](p["norm"](x)[:, 0, :]), F.cross_entropy)
    if kind == "seq2seq":  # T5's
        dec_ids = torch.randint(0, spec.vocab or 2, (1, spec.seq_len or 1))  # one row for every sample: any mbs
        # As T5ForConditionalGeneration.forward: with tied embeddings the decoder output is scaled by
        # d_model^-0.5 before the LM head. Without it the logits are sqrt(d_model) times too large, the
        # softmax's gradient underflows into denormals, and a CPU step runs up to 11x slower (d_model 128).
        scaled = getattr(model.config, "scale_decoder_outputs", model.config.tie_word_embeddings)  # older transformers
        out_scale = model.model_dim ** -0.5 if scaled else 1.0

        def post(p: nn.ModuleDict, x: torch.Tensor) -> torch.Tensor:
            ids = dec_ids.to(x.device).expand(x.shape[0], -1)
            out = p["dec"](input_ids=ids, encoder_hidden_states=x, use_cache=False).last_hidden_state
            return p["lm_head"](out * out_scale)
        return Layout({"enc": model.encoder}, [], {"dec": model.decoder, "lm_head": model.lm_head},
                      lambda p, ids: p["enc"](input_ids=ids).last_hidden_state, post, _lm_loss, max_chunks=2)
    raise ValueError(f"pipeline parallel: no stage split for family {spec.family!r}")


def chunk_blocks(blocks: int, chunks: int) -> list[tuple[bool, range, bool]]:
    """(has pre, block indices, has post) of each of `chunks` pipeline chunks: the blocks split evenly, or,
    when only blocks + 2 divide, with the embedding and the head counted as a block each (Megatron's
    account-for-embedding/loss-in-pipeline-split)."""
    if blocks % chunks == 0:
        per = blocks // chunks
        return [(i == 0, range(i * per, (i + 1) * per), i == chunks - 1) for i in range(chunks)]
    if (blocks + 2) % chunks:
        raise ValueError(f"{chunks} pipeline chunks divide neither the {blocks} blocks nor {blocks + 2}")
    per = (blocks + 2) // chunks
    out = []
    for i in range(chunks):
        units = range(i * per, (i + 1) * per)  # unit 0 is the embedding, unit blocks + 1 the head
        out.append((0 in units, range(max(units.start - 1, 0), min(units.stop - 1, blocks)), blocks + 1 in units))
    return out


def model_chunks(model: nn.Module, spec: ModelSpec, chunks: int, seq_mesh: Any = None
                 ) -> tuple[list[Stage], Callable]:
    """`model` as `chunks` consecutive `Stage`s (one: the whole model), and the loss the last one's output takes."""
    lay = layout(model, spec)
    if lay.max_chunks is not None and chunks > lay.max_chunks:
        raise ValueError(f"pipeline parallel: {spec.family} splits into at most {lay.max_chunks} chunks, not {chunks}")
    stages = []
    for has_pre, idx, has_post in chunk_blocks(len(lay.blocks), chunks):
        parts = {**(lay.pre_parts if has_pre else {}), **(lay.post_parts if has_post else {})}
        stages.append(Stage(nn.ModuleDict(parts), [lay.blocks[i] for i in idx], lay.pre if has_pre else None,
                            lay.post if has_post else None, lay.block_kwargs, seq_mesh))
    return stages, lay.loss
