"""The traced ops and the measured costs become the layer graph's nodes and edges.

Calls of leaf layers (Linear, Embedding, norms, activations, dropout, conv) are nodes; a module that runs
the attention core itself (SDPA / matmul / softmax outside any child Linear) is one `attention` node; ops
of other composite modules (residual adds, the SwiGLU product, reshapes) fold into the node that ran just
before them; what the top module runs after its last layer is the `loss` node. Data flow between ops
gives the edges (elements passed) and each node's input/output shapes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from torch import nn

from predictor.graph.blocks import BlockList
from predictor.graph.layer_graph import LayerGraph, LayerNode
from predictor.graph.node_attrs import kind_of, node_attrs, op_counts
from predictor.graph.node_attrs import tp_role
from predictor.graph.traced_costs import Costs
from predictor.graph.tracing import Op, strip_call
from predictor.spec.workload import ModelSpec

_ATTN_OPS = {
    "scaled_dot_product_attention", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math", "softmax", "_softmax", "bmm", "matmul", "baddbmm", "einsum",
}


def assemble(spec: ModelSpec, module: nn.Module, ops: list[Op], costs: Costs,
             lists: list[BlockList], first_only: set[str]) -> LayerGraph:
    """The layer graph of the traced (reduced) model, its block nodes counted for every block of the full one."""
    mods = dict(module.named_modules())
    placed = _place(ops, mods)
    groups = _Groups(lists, first_only, placed)
    params = _assign_params(module, ops, placed)
    nodes = _nodes(spec, mods, ops, placed, _figures(costs, placed), groups, params)
    unplaced = params.get(None, 0)  # parameters of modules that never ran (none in the supported families)
    if unplaced:
        nodes.append(LayerNode("unused_parameters", "other", groups.outside, 1, (), (), 0.0, 0.0,
                               unplaced, 0.0, 0.0, "replicated", {}))
    num_blocks = sum(b.count for b in lists) if lists else 1
    family = spec.family if spec.module is None else "module"
    return LayerGraph(family=str(family), nodes=nodes, edges=_edges(ops, placed), tokens=spec.tokens,
                      num_blocks=num_blocks)


# --------------------------------------------------------------------------------------------
# Which module calls are nodes, and which node owns each op
# --------------------------------------------------------------------------------------------


@dataclass
class _Placement:
    """The nodes (by module call key) in execution order, and the node every traced op belongs to."""

    calls: dict[str, tuple[bool, bool]]  # node call -> (is_attention, is_loss)
    direct_targets: dict[str, set[str]]  # module call -> the aten ops it ran itself
    owner: list[str]  # op index -> its node's call ('' for none)
    const: list[bool]  # op index -> reads no activation (`constant_ops`)
    order: list[str]  # node calls in execution order
    pos: dict[str, int]  # node call -> its index in `order`
    node_of_op: dict[int, int]  # op index -> its node's index in `order`


def _place(ops: list[Op], mods: dict[str, nn.Module]) -> _Placement:
    direct_targets: dict[str, set[str]] = {}
    for op in ops:
        direct_targets.setdefault(op.call, set()).add(op.target)
    calls = _node_calls(direct_targets, mods)
    owner = _fold_ops(ops, calls)
    if "loss" in owner:
        calls["loss"] = (False, True)
    const = constant_ops(ops)
    _give_constants_to_consumers(ops, calls, owner, const)
    order = _topological(_starts(ops, calls, owner, const), ops, owner, const)
    pos = {c: i for i, c in enumerate(order)}
    node_of_op = {i: pos[o] for i, o in enumerate(owner) if o}
    return _Placement(calls, direct_targets, owner, const, order, pos, node_of_op)


def _node_calls(direct_targets: dict[str, set[str]], mods: dict[str, nn.Module]) -> dict[str, tuple[bool, bool]]:
    """The module calls that are nodes: leaf layers, grouped experts, attention cores and modules with
    parameters of their own, as call -> (is_attention, is_loss)."""
    calls: dict[str, tuple[bool, bool]] = {}
    for call, targets in direct_targets.items():
        if call == "":
            continue
        mod = mods.get(strip_call(call))
        if mod is None:
            continue
        if not list(mod.children()):
            calls[call] = (False, type(mod).__name__.endswith("Loss"))
        elif type(mod).__name__.endswith("Experts"):  # grouped GEMMs (bmm), not an attention core
            calls[call] = (False, False)
        elif targets & _ATTN_OPS:
            calls[call] = (True, False)
        elif any(True for _ in mod.named_parameters(recurse=False)):
            calls[call] = (False, False)
    return calls


def _fold_ops(ops: list[Op], calls: dict[str, tuple[bool, bool]]) -> list[str]:
    """The node of every op: a node's own, else the node run just before it (the next one for ops before
    any node); ops after the last node are the loss's."""
    last_node_op = max((i for i, op in enumerate(ops) if op.call in calls), default=-1)
    owner: list[str] = []
    prev: str | None = None
    pending: list[int] = []
    for i, op in enumerate(ops):
        if op.call in calls:
            mine = op.call
        elif i > last_node_op:
            mine = "loss"
        elif prev is not None:
            mine = prev
        else:
            mine = ""  # before any node: resolved to the next node below
            pending.append(i)
        owner.append(mine)
        if mine not in ("", "loss"):
            prev = mine
            for j in pending:
                owner[j] = mine
            pending.clear()
    return owner


def constant_ops(ops: list[Op]) -> list[bool]:
    """Ops that depend on no activation, model input or parameter (arange, masks, index arithmetic)."""
    const: list[bool] = []
    for op in ops:
        const.append(all(src is not None and const[src] for src, _k, _s in op.inputs))
    return const


def _give_constants_to_consumers(ops: list[Op], calls: dict[str, tuple[bool, bool]], owner: list[str],
                                 const: list[bool]) -> None:
    """Index arithmetic outside layers that reads no activation (position ids, masks, T5's relative position
    buckets) belongs to the layer that consumes it, not to the composite module running it (in place)."""
    consumers: dict[int, list[int]] = {}
    for j, op in enumerate(ops):
        for src, _k, _s in op.inputs:
            if src is not None:
                consumers.setdefault(src, []).append(j)
    for i in range(len(ops) - 1, -1, -1):
        if const[i] and (ops[i].call not in calls or calls[ops[i].call][0]):
            users = consumers.get(i, [])
            direct = [j for j in users if not const[j]] or users  # prefer a layer reading it directly
            if direct and owner[direct[0]]:
                owner[i] = owner[direct[0]]


def _starts(ops: list[Op], calls: dict[str, tuple[bool, bool]], owner: list[str], const: list[bool]) -> dict[str, int]:
    """Where each node begins: its first op that reads an activation, an attention node's first attention-core
    op (after q, k, v)."""
    start: dict[str, int] = {}
    for i, mine in enumerate(owner):
        if mine and mine not in start and not const[i]:
            start[mine] = i
    for i, mine in enumerate(owner):
        if mine and mine not in start:
            start[mine] = i
    cores: set[str] = set()
    for i, op in enumerate(ops):
        if calls.get(op.call, (False, False))[0] and op.target in _ATTN_OPS and op.call not in cores:
            cores.add(op.call)
            start[op.call] = i
    return start


def _topological(start: dict[str, int], ops: list[Op], owner: list[str], const: list[bool]) -> list[str]:
    """Nodes by their start op, moved after every node they take data from (T5's bias before its attention)."""
    deps: dict[str, set[str]] = {c: set() for c in start}
    for op, dst in zip(ops, owner):
        if not dst:
            continue
        for src_op, _k, _s in op.inputs:
            if src_op is not None and not const[src_op] and owner[src_op] and owner[src_op] != dst:
                deps[dst].add(owner[src_op])
    users: dict[str, set[str]] = {c: set() for c in start}
    for c, ds in deps.items():
        for d in ds:
            users[d].add(c)
    waiting = {c: len(ds) for c, ds in deps.items()}
    heap = [(start[c], c) for c, n in waiting.items() if n == 0]
    heapq.heapify(heap)
    order: list[str] = []
    while len(order) < len(start):
        if not heap:  # a cycle (should not happen): release the earliest waiting node
            c = min((c for c in start if c not in set(order)), key=lambda c: start[c])
            waiting[c] = 0
            heapq.heappush(heap, (start[c], c))
        _, c = heapq.heappop(heap)
        if c in order:
            continue
        order.append(c)
        for u in users[c]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(heap, (start[u], u))
    return order


# --------------------------------------------------------------------------------------------
# Figures per node: costs, groups and counts, parameters
# --------------------------------------------------------------------------------------------


@dataclass
class _Figures:
    """What the instrumented step measured, summed per node call."""

    fwd: dict[str, float]
    bwd: dict[str, float]
    act: dict[str, float]
    mask: dict[str, float]


def _figures(costs: Costs, placed: _Placement) -> _Figures:
    figures = _Figures(*({c: 0.0 for c in placed.order} for _ in range(4)))
    pairs = ((costs.fwd, figures.fwd), (costs.bwd, figures.bwd), (costs.act, figures.act),
             (costs.act_mask, figures.mask))
    for src, dst in pairs:
        for key, v in src.items():
            dst[_cost_owner(key, placed, costs.entered)] += v
    return figures


def _cost_owner(where: tuple[str, int], placed: _Placement, entered: list[str]) -> str:
    """The node a figure measured at run time goes to: its call's node; for composite modules (residual adds,
    the SwiGLU product) the node that last began before them, like their ops; the top module's figures after
    the last call are the loss's."""
    key, n = where
    if key in placed.pos:
        return key
    path = strip_call(key)
    while path:  # inside a composite child of a node
        path = path.rpartition(".")[0]
        if path in placed.pos:
            return path
    if key == "" and n >= len(entered) and "loss" in placed.pos:
        return "loss"
    for k in reversed(entered[:max(n, 0)]):
        if k in placed.pos:
            return k
    return placed.order[0]


class _Groups:
    """Each node's pipeline group and count: a block's nodes stand for every block of their list."""

    def __init__(self, lists: list[BlockList], first_only: set[str], placed: _Placement):
        self.lists, self.first_only, self.pos = lists, first_only, placed.pos
        self.outside = "post" if lists else "block"  # the group of the loss and of parameters no node holds
        block_pos = [placed.pos[c] for c in placed.order if self.block_of(c)]
        self.first_block, self.last_block = (min(block_pos), max(block_pos)) if block_pos else (len(placed.order), -1)

    def block_of(self, call: str) -> BlockList | None:
        p = strip_call(call)
        for b in self.lists:
            if p == b.prefix or p.startswith(b.prefix + "."):
                return b
        return None

    def group_count(self, call: str) -> tuple[str, int]:
        if call == "loss":
            return self.outside, 1
        b = self.block_of(call)
        if b is not None:
            return b.group, (1 if b.traced_whole or strip_call(call) in self.first_only else b.count)
        i = self.pos[call]
        if not self.lists or i < self.first_block:
            return ("pre" if self.lists else "block"), 1
        if i > self.last_block:
            return "post", 1
        p = strip_call(call)
        for b in reversed(self.lists):  # between encoder and decoder blocks
            if b.stack and (p == b.stack or p.startswith(b.stack + ".")):
                return b.group, 1
        return self.lists[0].group, 1


def _assign_params(module: nn.Module, ops: list[Op], placed: _Placement) -> dict[str | None, int]:
    """Each unique parameter once, to the first node whose module owns it (tied weights: the embedding);
    None holds those of modules no node stands for."""
    fold: dict[str, str] = {}  # call -> the node its first op went to
    for op, mine in zip(ops, placed.owner):
        if mine:
            fold.setdefault(op.call, mine)
    path_to_node: dict[str, str] = {}
    for c in placed.order:
        path_to_node.setdefault(strip_call(c), c)
    owners: dict[int, list[str]] = {}
    sizes: dict[int, int] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name.rpartition(".")[0])
        sizes[id(p)] = p.numel()
    out: dict[str | None, int] = {}
    for pid, paths in owners.items():
        target = None
        for path in paths:
            if path in path_to_node:
                target = path_to_node[path]
                break
        if target is None:
            for path in paths:
                if path in fold and fold[path] in placed.order:
                    target = fold[path]
                    break
        if target is None:
            for path in paths:  # nearest ancestor that is a node
                p = path
                while p and target is None:
                    p = p.rpartition(".")[0]
                    target = path_to_node.get(p)
                if target is not None:
                    break
        out[target] = out.get(target, 0) + sizes[pid]
    return out


# --------------------------------------------------------------------------------------------
# Nodes and edges
# --------------------------------------------------------------------------------------------


def _nodes(spec: ModelSpec, mods: dict[str, nn.Module], ops: list[Op], placed: _Placement, figures: _Figures,
           groups: _Groups, params: dict[str | None, int]) -> list[LayerNode]:
    """One `LayerNode` per node call, in execution order."""
    node_ops: dict[str, list[int]] = {c: [] for c in placed.order}
    for i, mine in enumerate(placed.owner):
        if mine:
            node_ops[mine].append(i)
    nodes: list[LayerNode] = []
    prev_role = "replicated"
    for c in placed.order:
        idx = node_ops[c]
        is_attn, is_loss = placed.calls.get(c, (False, c == "loss"))
        mod = None if c == "loss" else mods.get(strip_call(c))
        kind = kind_of(mod, is_attn, is_loss)
        if kind == "other" and placed.direct_targets.get(c, set()) & {"linear", "mm", "addmm", "matmul"}:
            kind = "linear"  # a parameterless projection, e.g. GPT's logits against the tied embedding
        group, count = groups.group_count(c)
        own = [i for i in idx if ops[i].call == c] or idx
        in_shape = _in_shape(ops, own, placed.node_of_op, placed.pos[c])
        out_i = _out_op(ops, own)
        out_shape = ops[out_i].shape or () if out_i is not None else ()
        out_elems = float(ops[out_i].numel) if out_i is not None else 0.0
        its_ops = [ops[i] for i in idx]
        attrs = node_attrs(kind, mod, its_ops, spec, in_shape, out_shape)
        if figures.mask[c]:
            attrs["act_mask_elems"] = int(figures.mask[c])
        prev_role = tp_role(kind, c, group, mod, spec, prev_role, attrs.get("d_out", 0))
        nodes.append(LayerNode(
            name=c if c else "model", kind=kind, group=group, count=count, in_shape=in_shape, out_shape=out_shape,
            fwd_flops=figures.fwd[c], bwd_flops=figures.bwd[c], params=params.get(c, 0), act_elems=figures.act[c],
            out_elems=out_elems, tp=prev_role, attrs=attrs, ops=op_counts(its_ops, attrs.get("p_x1000") == 0)))
    return nodes


def _in_shape(ops: list[Op], idx: list[int], node_of_op: dict[int, int], me: int) -> tuple[int, ...]:
    """Shape of the first activation entering the node from outside (another node or a model input)."""
    for i in idx:
        for src, kind, shape in ops[i].inputs:
            if src is not None and node_of_op.get(src) != me:
                return shape
    for i in idx:
        for src, kind, shape in ops[i].inputs:
            if kind == "input":
                return shape
    for i in idx:
        for src, kind, shape in ops[i].inputs:
            if kind != "param":
                return shape
    return ()


def _out_op(ops: list[Op], idx: list[int]) -> int | None:
    """The node's output: the last of its own ops with a tensor result."""
    shaped = [i for i in idx if ops[i].shape is not None]
    return shaped[-1] if shaped else None


def _edges(ops: list[Op], placed: _Placement) -> list[tuple[int, int, float]]:
    """(src node, dst node, elements) for every activation one node hands another, summed per pair.

    Index arithmetic (positions, masks: `constant_ops`) is not an activation and makes no edge."""
    acc: dict[tuple[int, int], float] = {}
    seen: set[tuple[int, int]] = set()
    for j, op in enumerate(ops):
        dst = placed.node_of_op.get(j)
        if dst is None:
            continue
        for src_op, _k, _s in op.inputs:
            if src_op is None or placed.const[src_op]:
                continue
            src = placed.node_of_op.get(src_op)
            if src is None or src == dst or (src_op, dst) in seen:
                continue
            seen.add((src_op, dst))
            acc[(src, dst)] = acc.get((src, dst), 0.0) + float(ops[src_op].numel)
    return sorted((s, d, e) for (s, d), e in acc.items())
