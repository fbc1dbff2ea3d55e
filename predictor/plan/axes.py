"""The parallel axes a plan is made of, one definition each (the model is torchtitan's `ParallelDims`).

An `Axis` declares everything the rest of ScaleDL asks of a parallel dimension:
- where it sits: whether its degree multiplies into the GPU count, its place in the default rank order, the rank
  group its collectives run over (a `predictor.costs.parallel.PlanGroups` name);
- what it costs: the time parts it adds to a prediction (each with the correction term the learned predictor
  scales it by, and whether it is communication), the kinds of hidden communication it reports, the `overlap`
  kinds that hide it, whether a per-stage cost function prices it and the plan fields that cost reads (the pricing
  layer's memo keys);
- what it means: words for reports and docs and the sentence the report explains a plan's degree with.

The functions an axis has (`FUNCTION_KINDS`: its report facts, its per-stage cost, its validity rules, the degrees
a stage can take) read plans and price them, so they live in the layers above this module: each registers itself
onto its axis by name where it is defined (`axis_function`), and `Axis.function` finds it. A layer that calls one
imports the module that defines it (the stage costs: `predictor.models.stage_costs`; the rules and degree choices:
`predictor.plan.rules`; the report facts: `predictor.plan.explained`), so the import that brings the caller the
module registers the function before it is asked for.

How a framework launches an axis is the framework's own (`predictor.frameworks.base.Framework.axes`: the axes it
runs, each with its flag or key); a framework refuses an axis it does not declare.

Every list of time parts, hidden kinds, overlap kinds and correction terms is generated here from `AXES` (in
`PRICING_ORDER`), and so are `Plan`'s degree and option fields, the search spaces' fields and the pricing core's
communication groups (`PLAN_GROUPS`) and memo keys; the pricing core and the search ask for the axes they price in
their own way by role (`REPLICA_AXIS`, `PIPELINE_AXIS`, `SEQUENCE_SPLIT_AXIS`), and for the time parts and hidden
kinds of the replicas and the pipeline by theirs (`PART_ROLES`, `HIDDEN_ROLES`: `part_named`, `hidden_named`).
So adding an axis is one entry here, its cost function (and its rules, if it has any) registered onto it, and its
flag in each framework that runs it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Callable, Mapping, TypeVar

# What the pricing core prices the replicas' and the pipeline's parts and hidden kinds as (`TimePart.role`,
# `HiddenKind.role`): it asks for each by its role (`part_named`, `hidden_named`), never by an axis or a position, so
# each role is one part or kind of the registry, and a missing or doubled one is refused when it loads.
PART_ROLES: dict[str, str] = {
    "sync": "the replicas' gradient sync and parameter all-gather, exposed (`stage_costs.grad_sync_time`)",
    "bubble": "the pipeline's fill and drain: the other stages' micro-batch time before and after the slowest's",
    "send": "the pipeline's activation send/recv between neighbouring stages, exposed",
}
HIDDEN_ROLES: dict[str, str] = {
    "grad_sync": "the gradient reduction, beside the last micro-batch's backward",
    "param_gather": "the parameter all-gather, beside the forward (and under ZeRO-3 the backward)",
    "send": "the pipeline's send/recv, beside another chunk's computation",
}


@dataclass(frozen=True)
class TimePart:
    """One entry of a prediction's time breakdown.

    term: the learned predictor's correction term that scales it (`predictor.models.features.TERMS`);
    comm: whether it is exposed communication (what the no-communication ablation drops);
    role: what the pricing core prices it as (`PART_ROLES`; "" for a stage axis's part, priced by its stage cost)."""

    name: str
    words: str  # what the report calls it
    term: str
    comm: bool = True
    role: str = ""


@dataclass(frozen=True)
class HiddenKind:
    """One kind of communication a prediction reports hidden (`Prediction.hidden_comm`).

    overlap: the kind of a plan's `overlap` that hides it, one of its axis's `Axis.overlap` ("" where a plan value
    hides it instead: `Axis.overlapped_when`); role: what the pricing core prices it as (`HIDDEN_ROLES`; "" for a
    stage axis's kind, hidden beside its `Axis.window`)."""

    name: str
    words: str  # what the report calls it
    overlap: str = ""
    role: str = ""


@dataclass(frozen=True)
class Axis:
    """One parallel dimension of a plan."""

    name: str
    title: str
    shards: str
    collectives: str
    memory: str
    order: int
    explain: str  # a sentence of the report; fields: degree, share (% of the time in its parts) and its "facts"
    group: str = ""  # the group its collectives run over (a `PLAN_GROUPS` name; "" when it has no group of its own)
    parts: tuple[TimePart, ...] = ()
    hidden: tuple[HiddenKind, ...] = ()  # the kinds of `Prediction.hidden_comm` it reports
    overlap: tuple[str, ...] = ()  # kinds of a plan's `overlap` that hide its communication (or move it: ep's wgrad)
    stage_cost: bool = False  # priced per pipeline stage by its "stage_cost" function (`FUNCTION_KINDS`)
    cost_fields: tuple[str, ...] = ()  # the plan fields `stage_cost` reads beyond `SHARDING_FIELDS` and its group
    # The plan fields of it a stage's computation and memory read beyond `SHARDING_FIELDS` (ep: its dispatcher's
    # permutation kernels and buffers).
    stage_fields: tuple[str, ...] = ()
    # what its hidden communication runs beside: the stage's "compute", its "gemms" (all but attention), "attention",
    # or "phases" (half beside attention, half beside the rest); the window also decides what of it nothing hides
    # (`predictor.models.overlap.EDGE_SHARE`, `EDGE_MICROBATCHES`)
    window: str = "compute"
    # Whether the host runs ahead while the GPU waits on its per-layer collectives, so that a host-bound stage's
    # stretch to the host's pace is net of them (`predictor.models.plan_batch`: tensor parallelism's, which block
    # the stream between dependent GEMMs).
    host_runs_ahead: bool = False
    overlapped_when: str = ""  # "field=value": always hidden under that plan value (else: by its `overlap` kinds)
    # Plan fields that tune how it communicates, each with its values (the first its default). They mean nothing at
    # degree 1, where a search tries the default only, and no validity rule reads them (`RULE_BLIND`). `Plan` and the
    # search spaces take their fields from here.
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Their place in a plan string: after this plan field ("": right after its degree), one after another.
    options_after: str = ""
    # The other axes whose ranks its group spans (dp: gradients sync over the context-parallel ranks too).
    group_with: tuple[str, ...] = ()
    multiplies_gpus: bool = True
    # For an axis that regroups a stage's ranks: the group of the stage's ranks that hold the same share of what it
    # shards, which syncs those parameters' gradients (ep: the expert-data-parallel group); "" for none.
    complement_group: str = ""
    # Its place in a plan string: the plan field its degree follows ("" first; None: after every other field).
    written_after: str | None = None
    # An axis of the first plan format (tp, dp, pp): every plan string names it, so the strings and ids of stored
    # plans and datasets stay as written, and searched placements permute these axes.
    first_format: bool = False
    space_default: str | tuple[int, ...] = "auto"  # a search space's values when it names none ('auto': divisors)
    # The dimensions of a stage's layers it splits over its ranks (`DIMENSIONS`): what one rank holds of them is the
    # whole divided by the degrees of the axes that split it (`predictor.plan.share.RankShare`).
    splits: tuple[str, ...] = ()
    # Whether a search space may open every degree of it for long sequences: the space's `<name>_from_tokens` field
    # gives the sequence length from which `auto` replaces the space's list (`search_spaces.space.for_workload`;
    # cp: below it the activations cp splits rarely decide whether a plan fits, and cp multiplies the plans).
    from_tokens: bool = False
    # Whether its per-layer collectives sit between dependent GEMMs, so that a group leaving NVLink costs every
    # layer: a plan keeps it inside an NVLink domain unless it allows cross-node tp (context parallelism's ring
    # runs beside attention instead, and crosses nodes in the frameworks' own recipes: Llama 3.1 405B's tp=8
    # fills a node, cp=2 spans two).
    nvlink: bool = False

    def degree(self, plan: object) -> int:
        return int(getattr(plan, self.name))

    @property
    def group_axes(self) -> tuple[str, ...]:
        """The axes whose ranks form one group of it."""
        return (self.name, *self.group_with)

    def function(self, kind: str) -> Callable[..., Any] | None:
        """Its function of `kind` (`FUNCTION_KINDS`), None where it has none."""
        if kind not in FUNCTION_KINDS:
            raise ValueError(f"unknown axis function kind {kind!r}; known: {', '.join(FUNCTION_KINDS)}")
        return _FUNCTIONS.get((self.name, kind))


# The functions an axis may have, each with what it takes and gives.
FUNCTION_KINDS: dict[str, str] = {
    "facts": "(plan, spec) -> the fields its `explain` sentence names beyond its degree and share",
    "stage_cost": "(resolved spec, layout, config) -> seconds per pipeline stage and micro-batch (`Axis.stage_cost`)",
    # beside the layers, what a framework's per-call cost on collectives adds (`plan_batch.FRAMEWORK_PARTS`' calls);
    # an axis without one adds none there (its stage cost may charge its calls itself)
    "calls": "(layout) -> its collective calls per pipeline stage and micro-batch, at degree above 1",
    "rules": "(plan, spec) -> every reason its degree cannot run the workload",
    # for an axis that does not multiply into the GPU count (it regroups a stage's ranks); without one, a space's
    # `auto` takes every divisor
    "choices": "(spec, divisors of a stage's ranks) -> the degrees among them it can take, or None where it does "
               "not apply to the workload (degree 1, whatever the space lists)",
}
_FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] = {}
_F = TypeVar("_F", bound=Callable[..., Any])


def axis_function(axis: str, kind: str) -> Callable[[_F], _F]:
    """Registers the decorated function as the `kind` function (`FUNCTION_KINDS`) of the axis named `axis`."""
    if kind not in FUNCTION_KINDS:
        raise ValueError(f"unknown axis function kind {kind!r}; known: {', '.join(FUNCTION_KINDS)}")

    def register(function: _F) -> _F:
        known = _FUNCTIONS.get((axis, kind))
        if known is not None and (known.__module__, known.__qualname__) != (function.__module__, function.__qualname__):
            raise ValueError(f"axis {axis!r} has a {kind} function already ({known.__module__}.{known.__qualname__}); "
                             f"an axis has one function of each kind")
        _FUNCTIONS[(axis, kind)] = function
        return function
    return register


# The dimensions an axis may split (`Axis.splits`), each with what it is. One rank's share of a stage's layers is each
# divided by the degrees of the axes that split it (`predictor.plan.share.RankShare`), and the pricing core reads the
# share, never an axis: an axis that splits a dimension already here needs no edit there.
DIMENSIONS: dict[str, str] = {
    "width": "a sharded node's features: attention heads, MLP columns, the vocabulary (column, row, heads and vocab "
             "roles of `predictor.graph.layer_graph.TPRole`)",
    "tokens": "the tokens of the MoE layers (router and routed experts): they run sequence parallel",
    "sequence": "every node's sequence (attention's queries and keys in load-balanced chunks)",
    "experts": "the routed experts of each MoE layer (each rank holds experts / this; each of them computes the tokens "
               "of that many ranks)",
    "expert_width": "each routed expert's FFN width (FC1 columns, FC2 rows; its ranks' tokens gathered before it)",
    "layers": "the layers, into pipeline stages",
}
# The divisor of the sequence of the nodes a width split leaves whole (norms, dropout, residual adds): the degree of
# `SEQUENCE_SPLIT_AXIS` when a plan's sequence parallelism (`Plan.sp`) is on.
SEQUENCE_SHARD = "seq_shard"

# What a stage's per-layer computation reads beyond how its layers are sharded, under any axis's cost.
_WORK_FIELDS: tuple[str, ...] = ("mbs", "recompute", "recompute_layers")



def _plugin_axes() -> tuple[Axis, ...]:
    """Axes defined outside ScaleDL: `SCALEDL_AXES` names them as "module:attribute" entries joined by ','.

    The choice: it is read once, when this module is first imported, and never again, so a process has one `Plan`
    class and one set of tables from start to end (a plan string, a stored dataset row and a prediction table always
    agree on the fields). Set it in the environment before the process starts (tests/test_toy_axis.py runs a fresh
    interpreter); setting it later changes nothing, and a plan naming an unregistered axis is refused with a message
    that says so. An axis registered this way is refused by every framework until one declares it
    (`Framework.axes`)."""
    entries = filter(None, os.environ.get("SCALEDL_AXES", "").split(","))
    return tuple(getattr(import_module(module), name) for module, _, name in (e.partition(":") for e in entries))


AXES: tuple[Axis, ...] = (
    Axis("tp", "tensor parallel", "attention heads, MLP columns and the vocabulary of each layer",
         "all-reduce (reduce-scatter + all-gather with sp) per layer, forward and backward",
         "weights, gradients, optimizer state and most activations divided by tp", order=0,
         explain="tp={degree} keeps its all-reduces {where} ({share:.0f} % of the time)",
         group="tp", nvlink=True, splits=("width", "tokens"),
         parts=(TimePart("tp_comm", "tensor-parallel communication", "tp_comm"),),
         hidden=(HiddenKind("tp_comm", "tensor-parallel", "tp"),), overlap=("tp",), window="gemms",
         host_runs_ahead=True,
         stage_cost=True, cost_fields=_WORK_FIELDS, written_after="dp", first_format=True),
    Axis("cp", "context parallel", "the sequence of every layer (2·cp load-balanced chunks)",
         "K/V passed round a ring of cp ranks per attention layer (or all-gathered), overlapped with attention",
         "activations divided by cp", order=1,
         explain="cp={degree} splits every sequence over {degree} ranks (the sequence of every layer in 2·cp "
                 "load-balanced chunks); its K/V exchange ({cp_comm}) costs {share:.0f} % of the time",
         group="cp", splits=("sequence",), from_tokens=True,
         parts=(TimePart("cp_comm", "context-parallel K/V exchange", "tp_comm"),),
         hidden=(HiddenKind("cp_comm", "context-parallel"),),
         stage_cost=True, cost_fields=("mbs", "cp_comm"), window="attention",
         overlapped_when="cp_comm=ring", space_default=(1,), written_after="placement",
         # how it exchanges K/V: ring (send/recv overlapped with attention) or allgather (gathered before attention)
         options={"cp_comm": ("ring", "allgather")}, options_after="overlap"),
    Axis("dp", "data parallel", "the global batch",
         "gradient all-reduce or reduce-scatter (over dp·cp ranks), weight all-gather with ZeRO/FSDP",
         "optimizer state, gradients and weights divided by dp·cp with ZeRO 1/2/3", order=2,
         explain="dp={degree} spends {share:.0f} % in gradient sync{over}",
         group="dp", group_with=("cp",),
         parts=(TimePart("dp_comm", "data-parallel gradient sync", "dp_comm", role="sync"),),
         hidden=(HiddenKind("dp_grad", "gradient reduction", "dp", role="grad_sync"),
                 HiddenKind("dp_param", "parameter all-gather", "param", role="param_gather")),
         overlap=("dp", "param"), written_after="", first_format=True),
    Axis("pp", "pipeline parallel", "the layers into pp stages (pp·v chunks interleaved)",
         "activation send/recv between neighbouring stages", "each rank holds 1/pp of the layers", order=3,
         explain="pp={degree} with {microbatches} micro-batches{virtual} leaves a {bubble:.1f} % bubble "
                 "({share:.0f} % of the time)",
         parts=(TimePart("pp_bubble", "pipeline bubble", "pp", comm=False, role="bubble"),
                TimePart("pp_p2p", "pipeline send/recv", "pp", role="send")),
         hidden=(HiddenKind("pp_p2p", "pipeline send/recv", "pp", role="send"),),
         overlap=("pp",), written_after="tp", first_format=True, splits=("layers",)),
    Axis("ep", "expert parallel", "the routed experts of each MoE layer (E/ep per rank)",
         "token dispatch and combine all-to-all per MoE layer, forward and backward; expert gradients over dp·tp·cp/ep",
         "expert weights, gradients and optimizer state divided by ep", order=1,
         explain="ep={degree} holds {experts_per_rank} of the {experts} experts of each MoE layer per rank; its "
                 "token all-to-all costs {share:.0f} % of the time exposed",
         group="ep", splits=("experts",),
         parts=(TimePart("ep_comm", "expert-parallel token all-to-all", "tp_comm"),),
         # "wgrad": Megatron-Core's delay_wgrad_compute, the experts' weight-gradient GEMMs moved beside the dispatch's
         # backward all-to-all (`predictor.models.overlap.combined_1f1b_exposed`)
         hidden=(HiddenKind("ep_comm", "expert all-to-all", "ep"),), overlap=("ep", "wgrad"), window="phases",
         stage_cost=True, cost_fields=(*_WORK_FIELDS, "dispatcher"),
         multiplies_gpus=False, complement_group="edp", stage_fields=("dispatcher",), space_default=(1,),
         written_after="cp_comm",
         # how it moves tokens to their experts and back (`predictor.costs.moe_dispatch`): alltoall (NCCL all-to-all of each
         # token-expert pair), allgather (every token gathered over the ep ranks, combined by reduce-scatter), deepep or
         # hybridep (DeepEP's and NVIDIA's Hybrid-EP kernels: each token sent once per rank holding one of its experts;
         # Megatron-Core's flex dispatcher)
         options={"dispatcher": ("alltoall", "allgather", "deepep", "hybridep")}),
    # Megatron-Core's expert tensor parallelism (--expert-tensor-parallel-size; torchtitan's
    # expert_tensor_parallel_degree): each rank of an etp group holds 1/etp of every local expert, and the alltoall
    # dispatcher all-gathers the tokens it received over the group before the experts and reduce-scatters their
    # outputs after (megatron/core/transformer/moe/token_dispatcher.py: permute -> A2A(EP) -> AG(TP) -> experts ->
    # RS(TP) -> A2A(EP), its "TP" the expert tensor-parallel group). It regroups a stage's ranks innermost, inside
    # ep (parallel_state's expert RankGenerator: tp=etp, ep, dp=expert-dp), so the expert-data-parallel group is a
    # stage's ranks / (ep·etp); its exchanges run in the dispatcher's, hidden where ep's are.
    Axis("etp", "expert tensor parallel", "each routed expert's FFN over etp ranks (FC1 columns, FC2 rows)",
         "all-gather of the dispatched tokens before the experts and reduce-scatter after, per MoE layer, forward and "
         "backward", "expert weights, gradients and optimizer state divided by ep·etp", order=0,
         explain="etp={degree} splits each routed expert over {degree} ranks (their states synchronised over "
                 "{expert_dp} expert-data-parallel ranks); its token all-gathers and reduce-scatters cost "
                 "{share:.0f} % of the time exposed",
         group="etp", splits=("expert_width",),
         parts=(TimePart("etp_comm", "expert tensor-parallel all-gather and reduce-scatter", "tp_comm"),),
         hidden=(HiddenKind("etp_comm", "expert tensor-parallel", "ep"),), overlap=("ep",), window="phases",
         stage_cost=True, cost_fields=_WORK_FIELDS, multiplies_gpus=False, space_default=(1,), written_after="ep"),
    *_plugin_axes(),
)
AXIS: dict[str, Axis] = {a.name: a for a in AXES}
for _axis in AXES:
    if set(_axis.splits) - set(DIMENSIONS):
        raise ValueError(f"axis {_axis.name!r} splits {sorted(set(_axis.splits) - set(DIMENSIONS))}, not a dimension "
                         f"(predictor.plan.axes.DIMENSIONS: {', '.join(DIMENSIONS)}); add the dimension there and to "
                         f"predictor.plan.share.RankShare, which the pricing reads")
    for _kind in _axis.hidden:
        if _kind.overlap and _kind.overlap not in _axis.overlap:
            raise ValueError(f"axis {_axis.name!r}: its hidden kind {_kind.name!r} is hidden by overlap kind "
                             f"{_kind.overlap!r}, not one of its overlap kinds {_axis.overlap}; add it to Axis.overlap")
AXIS_NAMES: tuple[str, ...] = tuple(a.name for a in AXES)
# The order axes are priced, explained and listed in a breakdown: by rank order position, then registry order.
PRICING_ORDER: tuple[Axis, ...] = tuple(sorted(AXES, key=lambda a: a.order))
# The rank order a placement that names no axis gets (Megatron-Core's tp-cp-dp-pp). Only axes that multiply the
# GPU count order ranks: ep regroups the ranks of a stage for its expert layers (`predictor.costs.parallel.regrouped`).
DEFAULT_ORDER: tuple[str, ...] = tuple(a.name for a in PRICING_ORDER if a.multiplies_gpus)
RANK_AXES: tuple[str, ...] = tuple(a.name for a in AXES if a.multiplies_gpus)
# The axes whose ranks make up one pipeline stage, in the default rank order: what an axis that does not multiply
# the GPU count regroups (Megatron-Core builds the expert layers' groups from them).
# The axis whose ranks hold the same layers (every other degree shards them): gradients sync over its group, ZeRO
# shards over it, each of its ranks takes global batch / its degree samples, and a search derives its degree from the
# GPU count the others leave.
REPLICA_AXIS = "dp"
# The axis that splits the layers into pipeline stages, whose neighbours exchange activations.
PIPELINE_AXIS = "pp"
# The axis whose group Megatron's sequence parallelism (plan field sp) splits the sequence along: sp means nothing
# at its degree 1.
SEQUENCE_SPLIT_AXIS = "tp"
STAGE_RANK_AXES: tuple[str, ...] = tuple(a for a in DEFAULT_ORDER if a != PIPELINE_AXIS)
# The plan fields that split a stage's layers over its ranks: every degree but the replicas', with tp's sequence
# split and pp's virtual stages. Every stage cost reads them (`Axis.cost_fields` names the rest).
SHARDING_FIELDS: tuple[str, ...] = (*(a.name for a in AXES if a.name != REPLICA_AXIS), "sp", "v")
# The plan fields a stage's computation and memory read beyond them (`Axis.stage_fields`).
STAGE_FIELDS: tuple[str, ...] = tuple(f for a in AXES for f in a.stage_fields)
# Every communication group of a plan, by name: each axis's own and the complement of an axis that regroups a stage's
# ranks (`predictor.costs.parallel.PlanGroups`).
PLAN_GROUPS: tuple[str, ...] = tuple(g for a in AXES for g in (a.group, a.complement_group) if g)
# The groups gradients sync over: the replicas' (Megatron-Core's data-parallel group) and the complement of the
# axis that regroups a stage's ranks for the routed experts (their data-parallel group).
SYNC_GROUPS: tuple[str, ...] = (AXIS[REPLICA_AXIS].group, *(a.complement_group for a in AXES if a.complement_group))
# Each axis option's values (the first its default), and the axis it tunes (`Axis.options`).
OPTIONS: dict[str, tuple[str, ...]] = {o: values for a in AXES for o, values in a.options.items()}
OPTION_AXIS: dict[str, str] = {o: a.name for a in AXES for o in a.options}
# How expert parallelism moves tokens (its option's values, the first its default): what the frameworks spell.
DISPATCHERS: tuple[str, ...] = OPTIONS["dispatcher"]
# Axes whose groups must stay inside an NVLink domain (`Axis.nvlink`).
NVLINK_AXES: tuple[str, ...] = tuple(a.name for a in AXES if a.nvlink)
# The axes of the first plan format, whose permutations are the placements a search tries.
FIRST_AXES: tuple[str, ...] = tuple(a.name for a in AXES if a.first_format)

# A prediction's time breakdown: the layers' computation, each axis's parts, the optimizer step.
_PARTS: tuple[TimePart, ...] = (TimePart("compute", "compute", "compute", comm=False),
                                *(p for a in PRICING_ORDER for p in a.parts),
                                TimePart("optimizer", "optimizer step", "optimizer", comm=False))
TIME_PARTS: tuple[str, ...] = tuple(p.name for p in _PARTS)
TERM_OF_PART: dict[str, str] = {p.name: p.term for p in _PARTS}
PART_WORDS: dict[str, str] = {p.name: p.words for p in _PARTS}
COMM_PARTS: tuple[str, ...] = tuple(p.name for p in _PARTS if p.comm)
# Kinds of hidden communication (`Prediction.hidden_comm`), in the order of `PredictionTable.hidden`.
HIDDEN_KINDS: tuple[str, ...] = tuple(k.name for a in PRICING_ORDER for k in a.hidden)
HIDDEN_WORDS: dict[str, str] = {k.name: k.words for a in PRICING_ORDER for k in a.hidden}
# Communication a framework can hide behind computation; a plan's `overlap` switches each kind on or off.
OVERLAP_KINDS: tuple[str, ...] = tuple(dict.fromkeys(k for a in PRICING_ORDER for k in a.overlap))  # shared kinds once
# Axes priced per pipeline stage by their own cost function.
STAGE_AXES: tuple[Axis, ...] = tuple(a for a in PRICING_ORDER if a.stage_cost)


_Named = TypeVar("_Named", TimePart, HiddenKind)


def by_role(entries: tuple[_Named, ...], roles: Mapping[str, str], what: str) -> dict[str, _Named]:
    """Each of `roles` with the one entry that takes it; an unknown role, a role two entries take or one no entry
    takes is refused when the registry loads, so a reordered or edited registry prices the same or fails here."""
    found: dict[str, _Named] = {}
    for entry in entries:
        if entry.role and entry.role not in roles:
            raise ValueError(f"{what} {entry.name!r} takes role {entry.role!r}; known roles: {', '.join(roles)}")
        if entry.role in found:
            raise ValueError(f"{what}s {found[entry.role].name!r} and {entry.name!r} both take role {entry.role!r}; "
                             f"one {what} takes each role")
        if entry.role:
            found[entry.role] = entry
    missing = [role for role in roles if role not in found]
    if missing:
        raise ValueError(f"no {what} takes the roles {missing} the pricing core prices (predictor.plan.axes: "
                         f"{'; '.join(f'{r}: {roles[r]}' for r in missing)}); give each to the axis that has it")
    return found


_PART_OF_ROLE = by_role(_PARTS, PART_ROLES, "time part")
_HIDDEN_OF_ROLE = by_role(tuple(k for a in AXES for k in a.hidden), HIDDEN_ROLES, "hidden kind")


def part_named(role: str) -> str:
    """The time part that takes `role` (`PART_ROLES`)."""
    if role not in _PART_OF_ROLE:
        raise KeyError(f"unknown time part role {role!r}; known: {', '.join(PART_ROLES)}")
    return _PART_OF_ROLE[role].name


def hidden_named(role: str) -> HiddenKind:
    """The hidden kind that takes `role` (`HIDDEN_ROLES`), with the overlap kind that hides it."""
    if role not in _HIDDEN_OF_ROLE:
        raise KeyError(f"unknown hidden kind role {role!r}; known: {', '.join(HIDDEN_ROLES)}")
    return _HIDDEN_OF_ROLE[role]
