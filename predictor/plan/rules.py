"""Whether a plan can run a workload: each axis's validity rules and the degrees a stage can take (registered onto
the axes: `predictor.plan.axes.axis_function`), and `plan_errors`, which applies every axis's rules and the options'.

`plan_errors` returns every reason a plan is rejected (degrees that do not multiply to the GPU count, each axis's
rules, divisibility of the batch, tensor parallel inside an NVLink domain) so that callers (the CLI, the search
space) can explain themselves. Memory capacity is not checked here: that needs a prediction.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Callable

from predictor.plan.axes import AXES, NVLINK_AXES, STAGE_RANK_AXES, axis_function
from predictor.plan.placement import nvlink_domain
from predictor.plan.plan import RECOMPUTE_MODULES, canonical_recompute, recompute_modules
from predictor.spec.families import names as family_names

if TYPE_CHECKING:  # pragma: no cover
    from predictor.plan.plan import Plan
    from predictor.spec.workload import WorkloadSpec



def _dims_missing(spec: "WorkloadSpec", *names: str) -> list[str]:
    m = spec.model
    return [n for n in names if getattr(m, n) is None]


@axis_function("tp", "rules")
def tp_rules(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
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


@axis_function("pp", "rules")
def pp_rules(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
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


@axis_function("cp", "rules")
def cp_rules(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
    """Megatron-Core and torchtitan split a causal sequence into 2·cp chunks (rank i holds chunks i and
    2cp-1-i, which balances the causal mask's work), so 2·cp must divide the sequence length."""
    if plan.cp == 1:
        return []
    m = spec.model
    if not m.decoder:
        return [f"cp={plan.cp} splits the sequence of causal self-attention; the model family "
                f"{m.family or 'of a module: model'} is not a decoder ({', '.join(family_names(lambda f: f.decoder))})"]
    if m.tokens % (2 * plan.cp):
        return [f"cp={plan.cp} splits the sequence into 2*cp = {2 * plan.cp} chunks, which does not divide "
                f"seq_len={m.tokens}"]
    return []


def stage_degrees(plan: "Plan") -> str:
    """The degrees of the axes whose ranks make up a pipeline stage (what expert parallelism regroups)."""
    return ", ".join(f"{axis}={getattr(plan, axis)}" for axis in STAGE_RANK_AXES)


@axis_function("ep", "rules")
def ep_rules(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
    """Megatron-Core (`validate_args`, `parallel_state.initialize_model_parallel`) and torchtitan: expert
    parallelism regroups the ranks of a pipeline stage for the expert layers (expert tensor parallelism 1), so ep
    must divide them and the experts; Megatron-Core runs MoE beside tp only with sequence parallelism."""
    m = spec.model
    if plan.ep == 1:
        return []
    if not m.is_moe:
        return [f"ep={plan.ep} shards experts, but the model has none (ep=1 for a dense model)"]
    errors = []
    if m.experts % plan.ep:
        errors.append(f"ep={plan.ep} does not divide experts={m.experts}")
    ranks = plan.gpus // plan.pp
    if ranks % plan.ep:
        errors.append(f"ep={plan.ep} does not divide the {ranks} ranks of a pipeline stage ({stage_degrees(plan)}) "
                      f"that the expert layers regroup")
    return errors


@axis_function("ep", "choices")
def expert_degrees(spec: "WorkloadSpec", divisors: tuple[int, ...]) -> list[int] | None:
    """The expert-parallel degrees a stage whose ranks have these `divisors` can take: those that also divide the
    routed experts (None for a dense model, which has no experts to regroup its ranks for)."""
    experts = spec.model.experts
    return None if experts is None else [d for d in divisors if experts % d == 0]


@axis_function("etp", "rules")
def etp_rules(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
    """Megatron-Core (`parallel_state.initialize_model_parallel`: the expert groups are etp x ep x expert-dp over a
    stage's ranks) and torchtitan (`ParallelDims`): expert tensor parallelism splits each routed expert's FFN over
    etp ranks of a stage, inside its ep groups, so ep·etp must divide the stage's ranks and etp the experts' FFN."""
    m = spec.model
    if plan.etp == 1:
        return []
    if not m.is_moe:
        return [f"etp={plan.etp} splits routed experts, but the model has none (etp=1 for a dense model)"]
    errors = []
    ranks = plan.gpus // plan.pp
    if ranks % (plan.ep * plan.etp):
        errors.append(f"ep*etp = {plan.ep}*{plan.etp} does not divide the {ranks} ranks of a pipeline stage "
                      f"({stage_degrees(plan)}) that the expert layers regroup")
    if m.expert_ffn_size % plan.etp:
        errors.append(f"etp={plan.etp} does not divide the experts' FFN size {m.expert_ffn_size}")
    return errors


@axis_function("etp", "choices")
def expert_tensor_degrees(spec: "WorkloadSpec", divisors: tuple[int, ...]) -> list[int] | None:
    """The expert tensor-parallel degrees a stage whose ranks have these `divisors` can take: those that also divide
    the experts' FFN (None for a dense model)."""
    ffn = spec.model.expert_ffn_size if spec.model.is_moe else None
    return None if not ffn else [d for d in divisors if ffn % d == 0]


@cache
def _axis_rules() -> tuple[Callable[["Plan", "WorkloadSpec"], list[str]], ...]:
    """Each axis's rules, in registry order (every one is registered by then: this module's own, and those of an
    axis defined outside ScaleDL, whose module `SCALEDL_AXES` imports with the registry)."""
    return tuple(rules for rules in (axis.function("rules") for axis in AXES) if rules is not None)


def plan_errors(plan: "Plan", spec: "WorkloadSpec", allow_cross_node_tp: bool = False) -> list[str]:
    """Every reason `plan` cannot run `spec`; an empty list means structurally valid.

    Each axis checks its own rules (its "rules" function); the rest are the options'. Tensor and
    context parallelism outside an NVLink domain run, slowly: `allow_cross_node_tp` accepts them
    (`placement_warnings` says what they cost). Memory capacity is not checked here: that needs a
    prediction (see the search space).
    """
    c = spec.cluster
    gb = spec.training.global_batch
    errors: list[str] = []
    if plan.gpus != c.gpus:
        product = "*".join(a.name for a in AXES if a.multiplies_gpus)
        values = "*".join(str(a.degree(plan)) for a in AXES if a.multiplies_gpus)
        errors.append(f"{product} = {values} = {plan.gpus} but the cluster has {c.gpus} GPUs")
    for rules in _axis_rules():
        errors += rules(plan, spec)
    if gb % (plan.dp * plan.mbs):
        errors.append(f"dp*mbs = {plan.dp}*{plan.mbs} does not divide global_batch={gb}")
    elif plan.schedule == "interleaved" and plan.microbatches(gb) % plan.pp:
        errors.append(f"interleaved schedule needs micro-batches ({plan.microbatches(gb)}) to be a multiple of pp={plan.pp}")
    if plan.sp and plan.tp == 1:
        errors.append("sp=true needs tp > 1 (sequence parallelism splits along the tensor-parallel group)")
    if plan.zero > 0 and plan.group_size("dp") == 1:
        errors.append(f"zero={plan.zero} shards over data parallel ranks but dp=1; use zero=0")
    if not allow_cross_node_tp and plan.tp > 1:
        domain = nvlink_domain(spec)
        errors += [f"{spans_text(plan, axis, domain)}; put {axis} innermost with {axis} <= {domain} (or "
                   f"search.allow_cross_node_tp: true with --space full; `scaledl predict` predicts such plans)"
                   for axis in cross_domain_axes(plan, spec)]
    return errors




def model_modules(spec: "WorkloadSpec") -> frozenset[str]:
    """The Megatron-Core recompute modules (`RECOMPUTE_MODULES`) the model has: every transformer its attention core,
    layer norms and MLP; a mixture of experts its experts and their activation, its shared experts where it has
    them; multi-latent attention its up-projections."""
    m = spec.model
    modules = {"core_attn", "layernorm", "mlp"}
    if m.is_moe:
        modules |= {"moe", "moe_act"} | ({"shared_experts"} if m.shared_experts else set())
    if m.kv_lora_rank:
        modules.add("mla_up_proj")
    return frozenset(modules)


def recompute_for_model(value: str, spec: "WorkloadSpec") -> str:
    """`value` (a plan's recompute) less the modules the model does not have: what recomputing it means for this
    model (`layernorm+moe_act` on a dense model is `layernorm`; nothing left is `none`)."""
    modules = recompute_modules(value)
    if "full" in modules or modules <= model_modules(spec):
        return value
    kept = [m for m in RECOMPUTE_MODULES if m in modules & model_modules(spec)]
    return canonical_recompute("+".join(kept)) if kept else "none"


def recompute_errors(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
    """A recompute module the model does not have (moe_act on a dense model) names nothing to recompute: refused,
    so one recomputation has one spelling. A lever's rule, apart from `plan_errors` (whose rules never read the
    recomputation: the enumerator checks one recompute value for all), and applied to a search's space before it
    is enumerated (`search_spaces.enumerate.runnable_space`)."""
    missing = recompute_modules(plan.recompute) - model_modules(spec) - {"full"}
    if not missing:
        return []
    return [f"recompute={plan.recompute} names {'+'.join(sorted(missing))}, which the model does not have (its "
            f"modules: {', '.join(sorted(model_modules(spec)))}); use recompute={recompute_for_model(plan.recompute, spec)}"]


def cross_domain_axes(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
    """Axes of NVLINK_AXES whose groups span more consecutive GPUs than one NVLink domain holds."""
    domain = nvlink_domain(spec)
    return [a for a in NVLINK_AXES if getattr(plan, a) > 1 and plan.group_span(a) > domain]


def spans_text(plan: "Plan", axis: str, domain: int) -> str:
    return (f"{axis}={getattr(plan, axis)} with placement={plan.placement} spans {plan.group_span(axis)} consecutive "
            f"GPUs, more than an NVLink domain's {domain}")


def placement_warnings(plan: "Plan", spec: "WorkloadSpec") -> list[str]:
    """What a runnable but slow placement costs: tp groups whose collectives leave NVLink."""
    domain = nvlink_domain(spec)
    return [f"{spans_text(plan, axis, domain)}: its per-layer collectives run over the inter-node network, typically "
            f"~10x slower than NVLink (the prediction prices them so)" for axis in cross_domain_axes(plan, spec)]
