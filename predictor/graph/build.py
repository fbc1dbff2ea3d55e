"""Model → `LayerGraph`: one node per layer of the real model, traced on the meta device.

Get a graph through `predictor.graph.cache.graph_for`, which keeps what this module builds. How a graph is
built (`build_graph`), one module a step:

1. `blocks`: a *reduced* copy of the model with ONE transformer block per block list (one encoder and one
   decoder block for T5) is built on `torch.device("meta")` (`predictor.graph.modelzoo`), so a 96-layer 175B
   model costs one block's work; each node of that block gets `count` = number of blocks.
2. `tracing`: the structure, from `torch.export.export(model, (), kwargs, strict=False)`; every aten op
   carries `meta["nn_module_stack"]`, whose innermost entry (with its `@k` call index) says which module
   call ran it.
3. `traced_costs`: one instrumented training step (forward + backward) of the reduced model under
   `FakeTensorMode` on meta gives FLOPs and elements saved for backward per module call.
4. `assembly`: which module calls are nodes, which node every op and every measured figure belongs to,
   the execution order, groups, counts and edges; `node_attrs` describes each node (its kind,
   tensor-parallel role and attributes).

All figures are per sample (micro-batch 1). FLOPs are what `FlopCounterMode` counts: matmuls,
convolutions and attention; element-wise work (norms, activations, the loss) counts 0 FLOPs, so the
graph's total agrees with `FlopCounterMode` on the full model.
"""

from __future__ import annotations

from dataclasses import replace

from predictor.graph.assembly import assemble
from predictor.graph.blocks import block_counts, block_lists, first_block_only, reduced_spec, user_block_list
from predictor.graph.layer_graph import LayerGraph, LayerNode
from predictor.graph.layer_kinds import hybrid_lists, hybrid_plan
from predictor.graph.modelzoo import build_model, example_inputs, module_args, user_model_errors
from predictor.graph.traced_costs import measure_costs
from predictor.graph.tracing import export_ops
from predictor.spec.workload import ModelSpec


def build_graph(model: ModelSpec) -> LayerGraph:
    """The layer graph of `model` at micro-batch 1, traced afresh (see this module's docstring for the method)."""
    if model.hf_config is None and model.is_moe and (0 < model.dense_layers < (model.layers or 0) or model.mtp_layers):
        return _mixed_moe_graph(model)
    if model.hf_config is not None and model.decoder:  # any causal LM: one block of each kind it stacks
        with user_model_errors(model, "building the model"):
            reduced, counts = hybrid_plan(model)
        module = build_model(reduced, device="meta")
        lists, first_only = hybrid_lists(module, counts), set()
    else:
        blocks = block_counts(model)
        reduced = reduced_spec(model) if blocks else model
        module = build_model(reduced, device="meta")
        with user_model_errors(model, _tracing(model)):
            lists = block_lists(module, blocks)
            first_only = first_block_only(model, lists) if lists else set()
    with user_model_errors(model, _tracing(model)):
        inputs = example_inputs(reduced, 1, device="meta")
        args, kwargs = module_args(reduced, inputs)

        if model.module is not None:
            lists = user_block_list(module)
        ops = export_ops(module, args, kwargs)
        costs = measure_costs(module, reduced, inputs)
    graph = assemble(model, module, ops, costs, lists, first_only)
    return dispatched_experts(graph, model) if model.any_architecture else graph


def dispatched_experts(graph: LayerGraph, model: ModelSpec) -> LayerGraph:
    """Experts a reference implementation runs densely (Llama 4's: every token through every expert, weighted by
    its router score) priced as the balanced top-k dispatch training frameworks run, as `predictor.graph.moe_tracing`
    traces the others: their FLOPs, saved and output elements scaled to tokens x top_k / experts rows each."""
    if not model.top_k:
        return graph
    nodes, share = [], 1.0
    for n in graph.nodes:
        if n.kind == "experts" and n.fwd_flops:
            rows = n.fwd_flops / (6 * n.attrs["d_in"] * n.attrs["d_ffn"] * n.attrs["experts"])
            share = min(1.0, graph.tokens * model.top_k / n.attrs["experts"] / rows)
        if n.tp == "experts" and share < 1 / 1.5:  # the experts and their activation
            rows_in = (int(n.in_shape[0] * share), *n.in_shape[1:]) if n.in_shape else n.in_shape
            n = replace(n, fwd_flops=n.fwd_flops * share, bwd_flops=n.bwd_flops * share, in_shape=rows_in,
                        act_elems=n.act_elems * share, out_elems=n.out_elems * share)
        nodes.append(n)
    return replace(graph, nodes=nodes)


def _mixed_moe_graph(model: ModelSpec) -> LayerGraph:
    """A mixture of experts with leading dense layers (DeepSeek-V3's first 3) or multi-token prediction: the
    dense block and the MoE block are traced apart, each counted for its layers, the dense block's nodes first.
    The MTP module is counted as one more MoE block and one more output layer and loss per depth (its
    embedding is shared; its small h x 2h projection and two norms are left out). A pipeline spreads both
    kinds of block evenly over its stages (Megatron-Core places the dense ones on the first stage)."""
    moe = build_graph(model.model_copy(update={"dense_layers": 0, "mtp_layers": 0,
                                               "layers": model.layers - model.dense_layers + model.mtp_layers}))
    pre = [n for n in moe.nodes if n.group == "pre"]
    blocks = [n for n in moe.nodes if n.group == "block"]
    post = [replace(n, count=n.count * (1 + model.mtp_layers)) for n in moe.nodes if n.group == "post"]
    dense: list[LayerNode] = []
    dense_edges: list[tuple[int, int, float]] = []
    if model.dense_layers:
        g = build_graph(model.model_copy(update={"layers": model.dense_layers, "mtp_layers": 0}))
        idx = [i for i, n in enumerate(g.nodes) if n.group == "block"]
        dense = [replace(g.nodes[i], name=f"dense:{g.nodes[i].name}") for i in idx]
        where = {i: len(pre) + j for j, i in enumerate(idx)}
        dense_edges = [(where[a], where[b], e) for a, b, e in g.edges if a in where and b in where]
    shift = len(dense)
    edges = [(a + shift * (a >= len(pre)), b + shift * (b >= len(pre)), e) for a, b, e in moe.edges]
    return LayerGraph(family=moe.family, nodes=[*pre, *dense, *blocks, *post], edges=sorted(edges + dense_edges),
                      tokens=moe.tokens, num_blocks=model.layers + model.mtp_layers)


def _tracing(model: ModelSpec) -> str:
    """What a failing trace was doing, told to the user: a `module:` model's forward is fed the spec's inputs."""
    if model.module is None:
        return "tracing the model's forward"
    shapes = ", ".join(f"{i.dtype} {i.shape}" for i in model.inputs or [])
    return f"tracing its forward on model.inputs ({shapes}, each after a batch dimension)"
