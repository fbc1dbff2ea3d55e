"""The parallel axes a plan is made of, one definition each (the model is torchtitan's `ParallelDims`): pure data.

An `Axis` declares everything the rest of ScaleDL asks of a parallel dimension:
- where it sits: whether its degree multiplies into the GPU count, its place in the default rank order, the rank
  group its collectives run over (a `predictor.parallel.PlanGroups` field);
- what it costs: the time parts it adds to a prediction (each with the correction term the learned predictor
  scales it by, and whether it is communication), the kinds of hidden communication it reports, the `overlap`
  kinds that hide it, its per-stage cost function (a dotted path the pricing layer resolves, so this module
  imports nothing of it) and the plan fields that cost reads (the pricing layer's memo keys);
- what it means: words for reports and docs and the sentence the report explains a plan's degree with.

How a framework launches an axis is the framework's own (`predictor.frameworks.base.Framework.axes`: the axes it
runs, each with its flag or key); a framework refuses an axis it does not declare.

Its validity rules against a workload are a function it names (`predictor.plan.rules` applies them). Every list of time parts,
hidden kinds, overlap kinds and correction terms is generated here from `AXES` (in `PRICING_ORDER`), and so are
`Plan`'s degree fields, so adding an axis is one entry here and its cost function (and its rules, if it has any),
and its flag in each framework that runs it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class TimePart:
    """One entry of a prediction's time breakdown.

    term: the learned predictor's correction term that scales it (`predictor.models.features.TERMS`);
    comm: whether it is exposed communication (what the no-communication ablation drops)."""

    name: str
    words: str  # what the report calls it
    term: str
    comm: bool = True


@dataclass(frozen=True)
class Axis:
    """One parallel dimension of a plan."""

    name: str
    title: str
    shards: str
    collectives: str
    memory: str
    order: int
    explain: str  # a sentence of the report; fields: degree, share (% of the time in its parts) and its facts'
    facts: str = ""  # "module:function" (plan, spec) -> the other fields its `explain` sentence names
    group: str = ""  # the PlanGroups field its collectives run over ("" when it has no group of its own)
    parts: tuple[TimePart, ...] = ()
    hidden: Mapping[str, str] = field(default_factory=dict)  # kinds of `Prediction.hidden_comm` it reports: words
    overlap: tuple[str, ...] = ()  # kinds of a plan's `overlap` that hide its communication
    stage_cost: str = ""  # "module:function" (resolved spec, layout, config) -> seconds per pipeline stage and micro-batch
    cost_fields: tuple[str, ...] = ()  # the plan fields `stage_cost` reads beyond `SHARDING_FIELDS` and its group
    # what its hidden communication runs beside: the stage's "compute", its "gemms" (all but attention), "attention",
    # or "phases" (half beside attention, half beside the rest: `predictor.models.overlap`)
    window: str = "compute"
    overlapped_when: str = ""  # "field=value": always hidden under that plan value (else: by its `overlap` kinds)
    # Plan fields that tune how it communicates, each with its values (the first its default). They mean nothing at
    # degree 1, where a search tries the default only, and no validity rule reads them (`RULE_BLIND`).
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    rules: str = ""  # "module:function" (plan, spec) -> every reason its degree cannot run the workload
    # The other axes whose ranks its group spans (dp: gradients sync over the context-parallel ranks too).
    group_with: tuple[str, ...] = ()
    multiplies_gpus: bool = True
    # Its place in a plan string: the plan field its degree follows ("" first; None: after every other field).
    written_after: str | None = None
    # An axis of the first plan format (tp, dp, pp): every plan string names it, so the strings and ids of stored
    # plans and datasets stay as written, and searched placements permute these axes.
    first_format: bool = False
    space_default: str | tuple[int, ...] = "auto"  # a search space's values when it names none ('auto': divisors)
    # Whether its per-layer collectives sit between dependent GEMMs, so that a group leaving NVLink costs every
    # layer: a plan keeps it inside an NVLink domain unless it allows cross-node tp (context parallelism's ring
    # runs beside attention instead, and crosses nodes in the frameworks' own recipes: Llama 3.1 405B's tp=8
    # fills a node, cp=2 spans two).
    nvlink: bool = False
    # For an axis that does not multiply into the GPU count (it regroups a stage's ranks): "module:function"
    # (spec, divisors of a stage's ranks) -> the degrees among them it can take, or None where it does not apply
    # to the workload (degree 1, whatever the space lists); "" takes every divisor.
    choices: str = ""

    def degree(self, plan: object) -> int:
        return int(getattr(plan, self.name))

    @property
    def group_axes(self) -> tuple[str, ...]:
        """The axes whose ranks form one group of it."""
        return (self.name, *self.group_with)


def resolve(path: str) -> Callable[..., Any]:
    """The function a "module:function" path of an axis entry names (imported when first asked for)."""
    module, _, name = path.partition(":")
    return getattr(import_module(module), name)


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
         facts="predictor.models.stage_costs:tp_explained",
         group="tp", nvlink=True, parts=(TimePart("tp_comm", "tensor-parallel communication", "tp_comm"),),
         hidden={"tp_comm": "tensor-parallel"}, overlap=("tp",), window="gemms",
         stage_cost="predictor.models.stage_costs:tp_stage_time", cost_fields=_WORK_FIELDS,
         written_after="dp", first_format=True, rules="predictor.plan.rules:tp_rules"),
    Axis("cp", "context parallel", "the sequence of every layer (2·cp load-balanced chunks)",
         "K/V passed round a ring of cp ranks per attention layer (or all-gathered), overlapped with attention",
         "activations divided by cp", order=1,
         explain="cp={degree} splits every sequence over {degree} ranks (the sequence of every layer in 2·cp "
                 "load-balanced chunks); its K/V exchange ({cp_comm}) costs {share:.0f} % of the time",
         facts="predictor.models.stage_costs:cp_explained",
         group="cp", parts=(TimePart("cp_comm", "context-parallel K/V exchange", "tp_comm"),),
         hidden={"cp_comm": "context-parallel"},
         stage_cost="predictor.models.stage_costs:cp_stage_time",
         cost_fields=("mbs", "cp_comm"), window="attention",
         overlapped_when="cp_comm=ring", options={"cp_comm": ("ring", "allgather")}, space_default=(1,),
         written_after="placement",
         rules="predictor.plan.rules:cp_rules"),
    Axis("dp", "data parallel", "the global batch",
         "gradient all-reduce or reduce-scatter (over dp·cp ranks), weight all-gather with ZeRO/FSDP",
         "optimizer state, gradients and weights divided by dp·cp with ZeRO 1/2/3", order=2,
         explain="dp={degree} spends {share:.0f} % in gradient sync{over}", facts="predictor.models.stage_costs:dp_explained",
         group="dp", group_with=("cp",), parts=(TimePart("dp_comm", "data-parallel gradient sync", "dp_comm"),),
         hidden={"dp_grad": "gradient reduction", "dp_param": "parameter all-gather"},
         overlap=("dp", "param"), written_after="", first_format=True),
    Axis("pp", "pipeline parallel", "the layers into pp stages (pp·v chunks interleaved)",
         "activation send/recv between neighbouring stages", "each rank holds 1/pp of the layers", order=3,
         explain="pp={degree} with {microbatches} micro-batches{virtual} leaves a {bubble:.1f} % bubble "
                 "({share:.0f} % of the time)", facts="predictor.models.stage_costs:pp_explained",
         parts=(TimePart("pp_bubble", "pipeline bubble", "pp", comm=False),
                TimePart("pp_p2p", "pipeline send/recv", "pp")), hidden={"pp_p2p": "pipeline send/recv"},
         overlap=("pp",), written_after="tp", first_format=True, rules="predictor.plan.rules:pp_rules"),
    Axis("ep", "expert parallel", "the routed experts of each MoE layer (E/ep per rank)",
         "token dispatch and combine all-to-all per MoE layer, forward and backward; expert gradients over dp·tp·cp/ep",
         "expert weights, gradients and optimizer state divided by ep", order=1,
         explain="ep={degree} holds {experts_per_rank} of the {experts} experts of each MoE layer per rank; its "
                 "token all-to-all costs {share:.0f} % of the time exposed",
         facts="predictor.models.stage_costs:ep_explained",
         group="ep", parts=(TimePart("ep_comm", "expert-parallel token all-to-all", "tp_comm"),),
         hidden={"ep_comm": "expert all-to-all"}, overlap=("ep",), window="phases",
         stage_cost="predictor.models.stage_costs:ep_stage_time", cost_fields=(*_WORK_FIELDS, "dispatcher"),
         options={"dispatcher": ("alltoall", "allgather", "deepep", "hybridep")},
         multiplies_gpus=False, space_default=(1,), written_after="cp_comm", choices="predictor.moe:expert_degrees",
         rules="predictor.moe:ep_rules"),
    *_plugin_axes(),
)
AXIS: dict[str, Axis] = {a.name: a for a in AXES}
AXIS_NAMES: tuple[str, ...] = tuple(a.name for a in AXES)
# The order axes are priced, explained and listed in a breakdown: by rank order position, then registry order.
PRICING_ORDER: tuple[Axis, ...] = tuple(sorted(AXES, key=lambda a: a.order))
# The rank order a placement that names no axis gets (Megatron-Core's tp-cp-dp-pp). Only axes that multiply the
# GPU count order ranks: ep regroups the ranks of a stage for its expert layers (`predictor.parallel.expert_groups`).
DEFAULT_ORDER: tuple[str, ...] = tuple(a.name for a in PRICING_ORDER if a.multiplies_gpus)
RANK_AXES: tuple[str, ...] = tuple(a.name for a in AXES if a.multiplies_gpus)
# The axes whose ranks make up one pipeline stage, in the default rank order: what an axis that does not multiply
# the GPU count regroups (Megatron-Core builds the expert layers' groups from them).
STAGE_RANK_AXES: tuple[str, ...] = tuple(a for a in DEFAULT_ORDER if a != "pp")
# The plan fields that split a stage's layers over its ranks: every degree but dp's (which replicates them), with
# tp's sequence split and pp's virtual stages. Every stage cost reads them (`Axis.cost_fields` names the rest).
SHARDING_FIELDS: tuple[str, ...] = (*(a.name for a in AXES if a.name != "dp"), "sp", "v")
# Each axis option's values (the first its default), and the axis it tunes (`Axis.options`).
OPTIONS: dict[str, tuple[str, ...]] = {o: values for a in AXES for o, values in a.options.items()}
OPTION_AXIS: dict[str, str] = {o: a.name for a in AXES for o in a.options}
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
HIDDEN_KINDS: tuple[str, ...] = tuple(k for a in PRICING_ORDER for k in a.hidden)
HIDDEN_WORDS: dict[str, str] = {k: w for a in PRICING_ORDER for k, w in a.hidden.items()}
# Communication a framework can hide behind computation; a plan's `overlap` switches each kind on or off.
OVERLAP_KINDS: tuple[str, ...] = tuple(k for a in PRICING_ORDER for k in a.overlap)
# Axes priced per pipeline stage by their own cost function.
STAGE_AXES: tuple[Axis, ...] = tuple(a for a in PRICING_ORDER if a.stage_cost)
