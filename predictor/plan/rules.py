"""Whether a plan can run a workload: the validity rules of tp, pp and cp, and `plan_errors`, which applies every
axis's rules (`Axis.rules`) and the options'.

`plan_errors` returns every reason a plan is rejected (degrees that do not multiply to the GPU count, each axis's
rules, divisibility of the batch, tensor parallel inside an NVLink domain) so that callers (the CLI, the search
space) can explain themselves. Memory capacity is not checked here: that needs a prediction.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Callable

from predictor.families import names as family_names
from predictor.plan.axes import AXES, NVLINK_AXES, resolve
from predictor.plan.placement import nvlink_domain
from predictor.plan.plan import RECOMPUTE_MODULES, canonical_recompute, recompute_modules

if TYPE_CHECKING:  # pragma: no cover
    from predictor.plan.plan import Plan
    from predictor.workload import WorkloadSpec



def _dims_missing(spec: "WorkloadSpec", *names: str) -> list[str]:
    m = spec.model
    return [n for n in names if getattr(m, n) is None]


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


@cache
def _axis_rules() -> tuple[Callable[["Plan", "WorkloadSpec"], list[str]], ...]:
    """Each axis's rules, resolved when first asked for (an axis's rules may live beside its cost function)."""
    return tuple(resolve(axis.rules) for axis in AXES if axis.rules)


def plan_errors(plan: "Plan", spec: "WorkloadSpec", allow_cross_node_tp: bool = False) -> list[str]:
    """Every reason `plan` cannot run `spec`; an empty list means structurally valid.

    Each axis checks its own rules (`Axis.rules`); the rest are the options'. Tensor and
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
