"""The tensor-parallel role of every module, one table for the graph, the sharding model and the runner.

Megatron's layout: a *column* linear splits its output features over the tp ranks (Q/K/V, FC1, LLaMA's
gate_proj/up_proj, an expert's w1/w3), a *row* linear its input features and all-reduces its output
(the attention output, FC2, LLaMA's down_proj, an expert's w2), a *vocab* module splits the vocabulary
(the word embedding and the LM head), a *heads* embedding its per-head columns (T5's position bias),
everything else is *replicated* (norms, a MoE router, position embeddings, classifier heads). `predictor.graph.build` stamps these roles on the layer graph, whose sharding
`predictor.costs.parallel` prices, and `predictor.measure.parallelize` shards the real model by the same
table, so a validated tp run shards what its prediction assumed.

Roles are decided by the last component of a module's path (and its parent for BERT/ViT's `dense`).
"""

from __future__ import annotations

import re
from typing import Mapping

# Block linears by their last path component. Grouped-query attention changes only k/v's widths.
COLUMN: frozenset[str] = frozenset({
    "query_key_value", "c_attn", "q_proj", "k_proj", "v_proj", "qkv_proj", "qkv",  # attention inputs
    "query", "key", "value", "q", "k", "v",
    "dense_h_to_4h", "c_fc", "fc1", "fc_in", "wi", "wi_0", "wi_1", "linear_fc1",  # MLP input
    "gate_proj", "up_proj", "gate_up_proj",  # LLaMA's gated MLP (SwiGLU)
    "w1", "w3",  # MoE experts (Mixtral) and torchtitan's feed-forward names
    "q_b_proj", "kv_b_proj",  # multi-head latent attention's up-projections (DeepSeek-V3; down-projections replicated)
    "in_proj", "in_proj_qkvz", "in_proj_ba", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",  # SSM mixers'
})
ROW: frozenset[str] = frozenset({
    "c_proj", "o_proj", "o", "out_proj", "dense_4h_to_h", "fc2", "fc_out", "wo", "linear_proj", "linear_fc2",
    "down_proj", "w2",
})
# Replicated on purpose: a MoE router scores every expert on every rank (Mixtral's `gate`, torchtitan's `router`).
ROUTER: frozenset[str] = frozenset({"gate", "router"})
VOCAB_EMBEDDING: frozenset[str] = frozenset({"word_embeddings", "wte", "embed_tokens", "shared", "tok_embeddings"})
# Embeddings with one column per attention head (T5's relative position bias): split with the heads.
HEAD_EMBEDDING: frozenset[str] = frozenset({"relative_attention_bias"})
ROLES: tuple[str, ...] = ("column", "row", "heads", "vocab", "replicated")
_IN_BLOCK = re.compile(r"\.\d+\.")  # a path inside a repeated block: `...layers.3.mlp...`


def in_block(path: str) -> bool:
    """Whether a module path lies inside a repeated block (a ModuleList index in the path)."""
    return bool(_IN_BLOCK.search(path + "."))


def linear_role(path: str, inside_block: bool, out_features: int, vocab: int | None,
                own: Mapping[str, str] | None = None) -> str:
    """Role of a linear layer at `path`: column/row inside blocks, vocab for a head over the vocabulary
    (`vocab`: the model's vocabulary size, None for a vision model whose classes are no vocabulary); `own`: the
    roles of module names of the model's family (`predictor.spec.families.Family.roles`), read first."""
    rest, _, leaf = path.rpartition(".")
    if own and leaf in own:
        return own[leaf]
    if not inside_block:  # the LM head (logits over the vocabulary) is vocab parallel; other heads replicated
        return "vocab" if vocab and out_features == vocab else "replicated"
    if leaf in COLUMN:
        return "column"
    if leaf in ROW:
        return "row"
    if leaf == "dense":  # BERT/ViT: attention.output.dense and output.dense (row), intermediate.dense (column)
        return "column" if rest.rpartition(".")[2] == "intermediate" else "row"
    return "replicated"


def embedding_role(path: str, num_embeddings: int, vocab: int | None, own: Mapping[str, str] | None = None) -> str:
    """Role of an embedding: vocab parallel for the word embedding, split by heads for a per-head position
    bias, replicated for positions and token types; `own` as for `linear_role`."""
    leaf = path.rpartition(".")[2]
    if own and leaf in own:
        return own[leaf]
    if leaf in HEAD_EMBEDDING:
        return "heads"
    return "vocab" if leaf in VOCAB_EMBEDDING or (vocab is not None and num_embeddings == vocab) else "replicated"
