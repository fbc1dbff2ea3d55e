"""What a model's modules are, read from the modules themselves: a leaf module's layer-graph kind and the
lists of repeated transformer blocks. The layer timer and the runner's parallelizer both need them.
"""

from __future__ import annotations

from torch import nn

# Module class names (lower case) -> LayerGraph kinds (predictor.graph.layer_graph.LAYER_KINDS).
KIND_OF_CLASS = {"linear": "linear", "conv1d": "linear", "conv2d": "conv", "embedding": "embedding",
                 "layernorm": "layernorm", "t5layernorm": "rmsnorm", "llamarmsnorm": "rmsnorm", "rmsnorm": "rmsnorm",
                 "dropout": "dropout", "gelu": "activation", "geluactivation": "activation",
                 "newgeluactivation": "activation", "relu": "activation", "silu": "activation",
                 "softmax": "softmax"}


def layer_kind(mod: nn.Module) -> str:
    """The LayerGraph kind of a leaf module (GPT-2's Conv1D is a linear layer)."""
    return KIND_OF_CLASS.get(type(mod).__name__.lower(), "other")


def block_lists(model: nn.Module) -> list[nn.ModuleList]:
    """The ModuleLists of repeated transformer blocks (two for T5: encoder and decoder); none for a pipeline
    chunk holding only the embeddings or only the head (Megatron's split that counts them as a block each)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) and
             len({type(c) for c in m}) == 1 and sum(p.numel() for p in m.parameters()) > 0]
    if not lists:
        return []
    top = max(sum(p.numel() for p in m.parameters()) for m in lists)
    return [m for m in lists if sum(p.numel() for p in m.parameters()) * 4 >= top]
