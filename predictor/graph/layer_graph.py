"""The layer graph: the model as one node per layer, the unit every predictor works on.

Built once per workload (see `predictor.graph.cache.graph_for`) at micro-batch 1: FLOPs and
element counts are per sample, and a plan scales them by its micro-batch and shards them
by its tensor-parallel degree. Repeated transformer blocks are stored once with
`count` = number of repeats, so a 96-layer model is as cheap to predict as a 1-layer one.
Element counts, not bytes: the precision is applied by the consumer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

LAYER_KINDS: tuple[str, ...] = (
    "embedding", "linear", "attention", "layernorm", "rmsnorm", "activation", "softmax",
    "conv", "dropout", "elementwise", "loss", "other",
)
# A mixture of experts' nodes are also of kind "experts" (routed experts as grouped GEMMs) or "router". They stay
# out of LAYER_KINDS, the learned predictor's one-hot vocabulary, so its shipped checkpoints keep their features
# (a MoE node encodes as no known kind there; the analytical model prices both).
# Where a node sits in a pipeline: pre on the first stage, post on the last, blocks split over stages.
Group = Literal["pre", "block", "enc", "dec", "post"]
# How Megatron-style tensor parallelism shards a node:
#   column: output features split (QKV, FC1); row: input features split, all-reduce after (proj, FC2);
#   heads: attention core split by heads; vocab: vocab-parallel embedding / logits;
#   replicated: every tp rank computes it whole (layernorm, dropout unless sequence parallel);
#   tokens: the MoE router, on its rank's share of the tokens (MoE with tp runs sequence parallel), weights whole;
#   experts: routed experts (grouped GEMMs) on the tokens dispatched to the rank, weights split by expert parallelism.
TPRole = Literal["column", "row", "heads", "vocab", "replicated", "tokens", "experts"]


@dataclass
class LayerNode:
    name: str  # module path of its first occurrence, e.g. "transformer.h.0.attn.c_attn"
    kind: str  # one of LAYER_KINDS
    group: Group
    count: int  # occurrences in the model (a repeated block's layers: the number of blocks)
    in_shape: tuple[int, ...]  # first input, batch dimension 1 included
    out_shape: tuple[int, ...]
    fwd_flops: float  # per sample
    bwd_flops: float  # per sample (input and weight gradients)
    params: int  # parameters of one occurrence
    act_elems: float  # elements saved for backward per sample
    out_elems: float  # elements of the output per sample
    tp: TPRole = "replicated"
    attrs: dict[str, int] = field(default_factory=dict)  # structural features: d_in, d_out, heads, head_dim, seq, ...
    # The eager operators one forward of an occurrence runs: aten op -> (calls, elements read + written per
    # sample). What a non-GEMM layer costs on a device is mostly these (GPT-2's tanh GELU is eight of them,
    # BERT's one); `predictor.models.op_costs` prices them.
    ops: dict[str, tuple[int, float]] = field(default_factory=dict)

    @property
    def role(self) -> TPRole:
        """How a split of a layer's width shards it (the field keeps its first name, `tp`, so stored graphs load)."""
        return self.tp


@dataclass
class LayerGraph:
    """Nodes in execution order and the edges (src, dst, elements per sample) between them."""

    family: str
    nodes: list[LayerNode]
    edges: list[tuple[int, int, float]]
    tokens: int  # sequence positions per sample
    num_blocks: int  # transformer blocks a pipeline splits

    @property
    def params(self) -> int:
        return sum(n.count * n.params for n in self.nodes)

    @property
    def fwd_flops(self) -> float:
        """Forward FLOPs per sample of the whole model."""
        return sum(n.count * n.fwd_flops for n in self.nodes)

    @property
    def bwd_flops(self) -> float:
        return sum(n.count * n.bwd_flops for n in self.nodes)

    def group_nodes(self, *groups: str) -> list[LayerNode]:
        return [n for n in self.nodes if n.group in groups]
