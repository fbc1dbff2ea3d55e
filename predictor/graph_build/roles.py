"""The tensor-parallel role of a node: linears and embeddings by `predictor.tp_roles` (one table for the
graph, the sharding model and the runner), the other kinds by what they work on."""

from __future__ import annotations

from typing import Mapping

from torch import nn

from predictor.graph_build.tracing import strip_call
from predictor.tp_roles import embedding_role, linear_role
from predictor.workload import ModelSpec


def tp_role(kind: str, path: str, group: str, mod: nn.Module | None, spec: ModelSpec, prev_role: str,
            d_out: int) -> str:
    """How tensor parallelism shards the node (`TPRole`); `prev_role` is the role of the node just before it."""
    in_block = group in ("block", "enc", "dec")
    if kind == "embedding":  # roles of linears and embeddings: predictor.tp_roles, shared with the runner
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
