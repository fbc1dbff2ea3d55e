"""A hand-built Megatron GPT layer graph (Korthikanti et al. 2023 accounting), for tests that must
not depend on the torch.export graph builder: its activation elements reproduce the paper's closed
forms exactly, so memory formulas can be checked against them."""

from __future__ import annotations

from predictor.graph.layer_graph import LayerGraph, LayerNode


def gpt_graph(hidden: int, heads: int, seq: int, layers: int, vocab: int) -> LayerGraph:
    h, a, s, V = hidden, heads, seq, vocab
    sh = s * h

    def node(name, kind, group, tp, d_in, d_out, fwd, params, act, count=1, **attrs):
        return LayerNode(name, kind, group, count, (1, s, d_in), (1, s, d_out), float(fwd), 2.0 * fwd,
                         params, float(act), float(s * d_out), tp, attrs)

    L = layers
    nodes = [
        LayerNode("embed", "embedding", "pre", 1, (1, s), (1, s, h), 0.0, 0.0, V * h + s * h, 0.0, float(sh), "vocab"),
        node("ln1", "layernorm", "block", "replicated", h, h, 5 * sh, 2 * h, sh, L),
        node("qkv", "linear", "block", "column", h, 3 * h, 6 * sh * h, 3 * h * h + 3 * h, sh, L),
        node("attn", "attention", "block", "heads", 3 * h, h, 4 * s * sh, 0, 3 * sh + 2.5 * a * s * s, L,
             heads=a, head_dim=h // a, seq=s),
        node("proj", "linear", "block", "row", h, h, 2 * sh * h, h * h + h, sh, L),
        node("drop1", "dropout", "block", "replicated", h, h, sh, 0, 0.5 * sh, L),
        node("ln2", "layernorm", "block", "replicated", h, h, 5 * sh, 2 * h, sh, L),
        node("fc1", "linear", "block", "column", h, 4 * h, 8 * sh * h, 4 * h * h + 4 * h, sh, L),
        node("gelu", "activation", "block", "column", 4 * h, 4 * h, 8 * 4 * sh, 0, 4 * sh, L),
        node("fc2", "linear", "block", "row", 4 * h, h, 8 * sh * h, 4 * h * h + h, 4 * sh, L),
        node("drop2", "dropout", "block", "replicated", h, h, sh, 0, 0.5 * sh, L),
        node("lnf", "layernorm", "post", "replicated", h, h, 5 * sh, 2 * h, sh),
        node("logits", "linear", "post", "vocab", h, V, 2 * sh * V, 0, sh),
        LayerNode("loss", "loss", "post", 1, (1, s, V), (1,), 3.0 * s * V, 3.0 * s * V, 0, float(s * V), 1.0, "vocab"),
    ]
    edges = [(i, i + 1, nodes[i].out_elems) for i in range(len(nodes) - 1)]
    return LayerGraph("gpt", nodes, edges, tokens=s, num_blocks=L)
