"""The parallel axes a plan is made of, one definition each (the model is torchtitan's `ParallelDims`).

An `Axis` declares everything the rest of ScaleDL asks of a parallel dimension: whether its degree
multiplies into the GPU count, where it sits in the default rank order, what it shards and which
collectives it runs (words for reports and docs), its validity rules against a workload, and its
flag or key in each framework's launch file. Plans (`predictor.plan`), rank groups
(`predictor.parallel`), search spaces and launch files loop over `AXES`; adding an axis is one
entry here, a `Plan` field of the same name, and its cost functions.

Rank order: a placement names axes innermost first ('tp-cp-dp-pp': tp ranks are adjacent GPUs).
Axes a placement leaves out are inserted at their `order` position, so the placements written
before an axis existed keep meaning what they meant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from itertools import permutations
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from predictor.plan import Plan
    from predictor.workload import WorkloadSpec

# Families whose attention is causal self-attention over one sequence: what context parallelism splits.
DECODER_FAMILIES: tuple[str, ...] = ("gpt", "gpt2", "llama", "mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss")


@dataclass(frozen=True)
class Axis:
    """One parallel dimension of a plan."""

    name: str
    title: str
    shards: str
    collectives: str
    memory: str
    order: int
    rules: Callable[["Plan", "WorkloadSpec"], list[str]]
    launch: Mapping[str, str] = field(default_factory=dict)
    multiplies_gpus: bool = True
    space_default: str | tuple[int, ...] = "auto"  # a search space's values when it names none ('auto': divisors)

    def degree(self, plan: "Plan") -> int:
        return int(getattr(plan, self.name))


def _no_rules(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
    return []


def _dims_missing(spec: "WorkloadSpec", *names: str) -> list[str]:
    m = spec.model
    return [n for n in names if getattr(m, n) is None]


def _tp_rules(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
    """Megatron's tensor parallelism splits attention heads, query groups, hidden and FFN columns."""
    if plan.tp == 1:
        return []
    m = spec.model
    missing = _dims_missing(spec, "heads", "hidden")
    if missing:
        return [f"tp={plan.tp} splits attention heads and hidden columns, but the model does not declare "
                f"{' or '.join(missing)} (a module: model: give model.{missing[0]}, or use tp=1)"]
    errors = []
    if m.heads % plan.tp:
        errors.append(f"tp={plan.tp} does not divide heads={m.heads}")
    if m.kv_heads is not None and m.kv_heads % plan.tp:
        errors.append(f"tp={plan.tp} does not divide kv_heads={m.kv_heads}")
    if m.hidden % plan.tp:
        errors.append(f"tp={plan.tp} does not divide hidden={m.hidden}")
    if m.ffn_hidden_size % plan.tp:
        errors.append(f"tp={plan.tp} does not divide ffn_hidden={m.ffn_hidden_size}")
    return errors


def embedding_and_loss_in_split(plan: "Plan", blocks: int) -> bool:
    """Whether the pp·v chunks split the blocks evenly only when the embedding and the loss count as one layer
    each (Megatron-Core's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split,
    how the Llama 3.1 405B recipes put 126 layers on 64 chunks)."""
    chunks = plan.pp * plan.v
    return plan.pp > 1 and blocks % chunks != 0 and (blocks + 2) % chunks == 0


def _pp_rules(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
    """A pipeline splits the repeated blocks evenly over pp·v chunks (the embedding and the loss may count
    as a layer each, see `embedding_and_loss_in_split`); a mixture of experts over any pp·v chunks up to its
    layers, as Megatron-Core's pipeline layout does (the prediction spreads the layers evenly)."""
    if plan.pp == 1:
        return []
    blocks = spec.model.num_blocks
    if not blocks:
        return [f"pp={plan.pp} splits the transformer layers, but the model does not declare them "
                f"(a module: model: give model.layers, or use pp=1)"]
    if spec.model.is_moe and plan.pp * plan.v <= blocks:
        return []  # Megatron-Core's --pipeline-model-parallel-layout places MoE layers unevenly (DeepSeek-V3 recipes)
    if blocks % (plan.pp * plan.v) and not embedding_and_loss_in_split(plan, blocks):
        return [f"pp*v = {plan.pp}*{plan.v} divides neither the {blocks} transformer layers nor {blocks + 2} "
                f"(embedding and loss counted as layers)"]
    return []


def _cp_rules(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
    """Megatron-Core and torchtitan split a causal sequence into 2·cp chunks (rank i holds chunks i and
    2cp-1-i, which balances the causal mask's work), so 2·cp must divide the sequence length."""
    if plan.cp == 1:
        return []
    m = spec.model
    if m.family not in DECODER_FAMILIES:
        return [f"cp={plan.cp} splits the sequence of causal self-attention; the model family "
                f"{m.family or 'of a module: model'} is not a decoder ({', '.join(DECODER_FAMILIES)})"]
    if m.tokens % (2 * plan.cp):
        return [f"cp={plan.cp} splits the sequence into 2*cp = {2 * plan.cp} chunks, which does not divide "
                f"seq_len={m.tokens}"]
    return []


def _ep_rules(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
    """Megatron-Core (`validate_args`, `parallel_state.initialize_model_parallel`) and torchtitan: expert
    parallelism regroups a stage's dp·tp·cp ranks for the expert layers (expert tensor parallelism 1), so ep
    must divide dp·tp·cp and the experts; Megatron-Core runs MoE beside tp only with sequence parallelism."""
    m = spec.model
    if plan.ep == 1:
        return []
    if not m.is_moe:
        return [f"ep={plan.ep} shards experts, but the model has none (ep=1 for a dense model)"]
    errors = []
    if m.experts % plan.ep:
        errors.append(f"ep={plan.ep} does not divide experts={m.experts}")
    ranks = plan.dp * plan.tp * plan.cp
    if ranks % plan.ep:
        errors.append(f"ep={plan.ep} does not divide dp*tp*cp = {plan.dp}*{plan.tp}*{plan.cp} = {ranks}, the ranks of a "
                      f"pipeline stage that the expert layers regroup")
    return errors


AXES: tuple[Axis, ...] = (
    Axis("tp", "tensor parallel", "attention heads, MLP columns and the vocabulary of each layer",
         "all-reduce (reduce-scatter + all-gather with sp) per layer, forward and backward",
         "weights, gradients, optimizer state and most activations divided by tp", order=0, rules=_tp_rules,
         launch={"megatron": "--tensor-model-parallel-size", "torchtitan": "parallelism.tensor_parallel_degree",
                 "deepspeed": "--tensor-model-parallel-size"}),
    Axis("cp", "context parallel", "the sequence of every layer (2·cp load-balanced chunks)",
         "K/V passed round a ring of cp ranks per attention layer (or all-gathered), overlapped with attention",
         "activations divided by cp", order=1, rules=_cp_rules, space_default=(1,),
         launch={"megatron": "--context-parallel-size", "torchtitan": "parallelism.context_parallel_degree"}),
    Axis("dp", "data parallel", "the global batch",
         "gradient all-reduce or reduce-scatter (over dp·cp ranks), weight all-gather with ZeRO/FSDP",
         "optimizer state, gradients and weights divided by dp·cp with ZeRO 1/2/3", order=2, rules=_no_rules,
         launch={"torchtitan": "parallelism.data_parallel_shard_degree"}),
    Axis("pp", "pipeline parallel", "the layers into pp stages (pp·v chunks interleaved)",
         "activation send/recv between neighbouring stages", "each rank holds 1/pp of the layers",
         order=3, rules=_pp_rules,
         launch={"megatron": "--pipeline-model-parallel-size", "torchtitan": "parallelism.pipeline_parallel_degree",
                 "deepspeed": "--pipeline-model-parallel-size"}),
    Axis("ep", "expert parallel", "the routed experts of each MoE layer (E/ep per rank)",
         "token dispatch and combine all-to-all per MoE layer, forward and backward; expert gradients over dp·tp·cp/ep",
         "expert weights, gradients and optimizer state divided by ep", order=1, rules=_ep_rules,
         multiplies_gpus=False, space_default=(1,),
         launch={"megatron": "--expert-model-parallel-size", "torchtitan": "parallelism.expert_parallel_degree"}),
)
AXIS: dict[str, Axis] = {a.name: a for a in AXES}
AXIS_NAMES: tuple[str, ...] = tuple(a.name for a in AXES)
# The rank order a placement that names no axis gets (Megatron-Core's tp-cp-dp-pp). Only axes that multiply the
# GPU count order ranks: ep regroups the ranks of a stage for its expert layers (`predictor.parallel.expert_groups`).
DEFAULT_ORDER: tuple[str, ...] = tuple(a.name for a in sorted(AXES, key=lambda a: a.order) if a.multiplies_gpus)
RANK_AXES: tuple[str, ...] = tuple(a.name for a in AXES if a.multiplies_gpus)
# Placements written before context parallelism: permutations of these three.
LEGACY_AXES: tuple[str, ...] = ("tp", "dp", "pp")


@lru_cache(maxsize=1024)
def complete_order(placement: str) -> tuple[str, ...]:
    """The full rank order of `placement`: its axes in its order, the axes it leaves out at their default
    position (e.g. 'tp-dp-pp' -> tp, cp, dp, pp; 'dp-tp-pp' -> dp, tp, cp, pp)."""
    named = [a for a in placement.split("-") if a]
    order = list(named)
    for axis in DEFAULT_ORDER:
        if axis in order:
            continue
        before = [a for a in DEFAULT_ORDER[: DEFAULT_ORDER.index(axis)] if a in order]
        order.insert(order.index(before[-1]) + 1 if before else 0, axis)
    return tuple(order)


@lru_cache(maxsize=1024)
def placement_error(placement: str) -> str | None:
    """Why `placement` is not a rank order of registered axes (None when it is)."""
    named = placement.split("-")
    unknown = [a for a in named if a not in RANK_AXES]
    if unknown or not placement:
        return (f"plan field 'placement' must name axes innermost first, joined by '-', from "
                f"{', '.join(RANK_AXES)} (e.g. {'-'.join(LEGACY_AXES)}); got {placement!r}")
    if len(set(named)) != len(named):
        return f"plan field 'placement' names an axis twice: {placement!r}"
    return None


def placements(axes: tuple[str, ...] = LEGACY_AXES) -> tuple[str, ...]:
    """Every rank order of `axes` (the space of placements a search may try), in a stable order."""
    return tuple("-".join(p) for p in permutations(axes))
