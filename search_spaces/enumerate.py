"""Every valid plan of a workload inside a search space, and why the others are rejected.

The structural rules live in `predictor.plan.plan_errors`, the framework's in
`predictor.frameworks`; this module only generates the candidates of a space and keeps the ones
with no error. The degrees of the registered axes (`predictor.plan.axes`) are chosen in registry order
with dp derived (GPUs / the others), so they always multiply to the GPU count; an axis that multiplies into no
GPU count (it regroups a stage's ranks) is chosen apart, among the divisors of a stage's ranks that its
`choices` allow. To stay fast on
big clusters it checks one prototype per (degrees, mbs) first against the structural rules: each
is monotone in the other fields (the prototype has v=1, zero=0, sp=false, 1F1B and tp innermost,
the least constrained choice), so a failing prototype rejects all its variants with the same
reasons. Framework rules are not monotone (torchtitan needs sp with tp) and are checked per variant, once
for the variants that differ only in fields no rule reads (`RULE_BLIND`); the plans kept are built
unchecked (`Plan.trusted`) from the space's validated values.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from itertools import product
from typing import Iterable, Iterator

from predictor.plan import AXES, Axis
from predictor.plan.axes import OPTION_AXIS, OPTIONS
from predictor.plan.axes import resolve as function_named
from predictor.frameworks import Framework
from predictor.plan import Plan, plan_errors, recompute_errors, recompute_for_model
from predictor.resolver import resolve
from predictor.workload import WorkloadSpec
from search_spaces.plan_list import PlanList, Product
from search_spaces.space import CHOICE_AXES, INT_AXES, SpaceConfig

# Axes whose degree a search picks; dp takes what the GPU count leaves.
_CHOSEN = tuple(a.name for a in AXES if a.multiplies_gpus and a.name != "dp")
# Axes that regroup a stage's ranks (for some of its layers) rather than multiply into the GPU count.
_REGROUPING = tuple(a for a in AXES if not a.multiplies_gpus)
_REGROUPING_NAMES = tuple(a.name for a in _REGROUPING)


@dataclass
class Enumeration:
    """The valid plans (deterministic order), how many candidates were rejected for which reason, and how many
    were never candidates because another plan of the space is the same plan (`pruned`, by why: a field that changes
    nothing at these degrees has one value)."""

    plans: PlanList
    checked: int
    rejected: Counter[str] = field(default_factory=Counter)
    pruned: Counter[str] = field(default_factory=Counter)

    @property
    def rejected_count(self) -> int:
        return self.checked - len(self.plans)

    def top_reasons(self, n: int = 5) -> list[tuple[str, int]]:
        return self.rejected.most_common(n)


@cache
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _pick(values: str | list[int], auto: Iterable[int], cap: int | None) -> list[int]:
    chosen = list(auto) if values == "auto" else list(values)
    return [v for v in chosen if cap is None or v <= cap]


def _degrees(spec: WorkloadSpec, space: SpaceConfig) -> Iterator[tuple[dict[str, int], int]]:
    """(degrees, mbs) combinations of the space whose degrees multiply to the GPU count."""
    gpus, gb = spec.cluster.gpus, spec.training.global_batch

    def chosen(i: int, left: int, picked: dict[str, int]) -> Iterator[dict[str, int]]:
        if i == len(_CHOSEN):
            yield picked
            return
        axis = _CHOSEN[i]
        for d in _pick(getattr(space, axis), _divisors(left), getattr(space, f"max_{axis}")):
            if left % d == 0:
                yield from chosen(i + 1, left // d, {**picked, axis: d})

    for picked in chosen(0, gpus, {}):
        dp = gpus
        for d in picked.values():
            dp //= d
        if (space.dp != "auto" and dp not in space.dp) or (space.max_dp is not None and dp > space.max_dp):
            continue
        regrouped = product(*(_regrouping_degrees(spec, space, a, _divisors(gpus // picked.get("pp", 1)))
                               for a in _REGROUPING))
        for degrees in regrouped:
            for mbs in _pick(space.mbs, _divisors(gb // dp) if gb % dp == 0 else (1,), space.max_mbs):
                yield {**picked, "dp": dp, **dict(zip(_REGROUPING_NAMES, degrees))}, mbs


def _regrouping_degrees(spec: WorkloadSpec, space: SpaceConfig, axis: Axis, divisors: tuple[int, ...]) -> list[int]:
    """The degrees of the space of an axis that regroups a stage's ranks (multiplies into no GPU count), so it is
    chosen apart, among the degrees its `choices` allow at a stage of ranks with these `divisors`."""
    auto = function_named(axis.choices)(spec, divisors) if axis.choices else list(divisors)
    if auto is None:
        return [1]
    return [d for d in _pick(getattr(space, axis.name), auto, getattr(space, f"max_{axis.name}")) if d in auto]


def _virtual_stages(spec: WorkloadSpec, space: SpaceConfig, pp: int) -> list[int]:
    """Interleaving depths v > 1 of the space whose pp·v chunks split the layers evenly (or the layers with
    the embedding and the loss counted as one each)."""
    blocks = spec.model.num_blocks
    auto = sorted({v for total in (blocks, blocks + 2) if total % pp == 0 for v in _divisors(total // pp)}) or [2]
    return [v for v in _pick(space.v, auto, space.max_v) if v > 1]  # interleaving with v=1 is plain 1F1B


def runnable_space(space: SpaceConfig, framework: Framework, spec: WorkloadSpec | None = None) -> SpaceConfig:
    """`space` without the option values `framework` never runs (its rules would refuse every such plan): each
    parallel axis it does not declare (`Framework.axes`) at degree 1 where the space takes every degree ('auto'; a
    space that names degrees keeps them, for the rules to refuse with the reason); and, for `spec`, each recompute value less
    the modules its model does not have (`recompute_for_model`: the rules refuse naming them)."""
    changes = {axis: [v for v in getattr(space, axis) if framework.runs_value(axis, v)] for axis in CHOICE_AXES}
    changes.update({axis.name: [1] for axis in AXES if axis.name not in framework.axes and getattr(space, axis.name) == "auto"})
    space = space.model_copy(update=changes)
    return space if spec is None else _for_model(space, spec)


def _for_model(space: SpaceConfig, spec: WorkloadSpec) -> SpaceConfig:
    """`space` with each recompute value less the modules the model of `spec` does not have."""
    return space.model_copy(update={"recompute": list(dict.fromkeys(recompute_for_model(r, spec) for r in space.recompute))})


def _unpipelined(schedules: list[str]) -> list[str]:
    """The schedule of a plan without a pipeline, where there is none to choose: the first of 1f1b and the others
    of `schedules` (interleaving needs a pipeline)."""
    return sorted((s for s in schedules if s != "interleaved"), key=lambda s: s != "1f1b")[:1]


# Plan fields that neither `plan_errors` nor any framework's rules read: candidates that differ only in them
# have the same errors, so `enumerate_plans` checks one of each such group (tests/test_search_space.py fails
# if a rule starts reading one).
RULE_BLIND: tuple[str, ...] = ("recompute", *OPTIONS)


@dataclass(frozen=True)
class _Options:
    """The option values of the space at one set of degrees, in the candidates' loop order: zero, recompute,
    then `read` (sp, schedule, v, placement, overlap), the axes' options (`tuned`) innermost; `pruned`: the
    candidates per reason left out as the same plan as one kept."""

    zero: list[int]
    recompute: list[str]
    read: list[tuple[bool, str, int, str, str]]
    tuned: list[dict[str, str]]
    pruned: dict[str, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.zero) * len(self.recompute) * len(self.read) * len(self.tuned)


def _options(spec: WorkloadSpec, space: SpaceConfig, degrees: dict[str, int]) -> _Options:
    """The options of the space at these degrees; placements that map ranks identically are kept once."""
    placements: list[str] = []
    seen: set[tuple[int, ...]] = set()
    for placement in space.placement:
        proto = Plan(placement=placement, **degrees)
        key = tuple(proto.stride(a) if n > 1 else 0 for a, n in degrees.items() if a in proto.rank_order)
        if key not in seen:
            seen.add(key)
            placements.append(placement)
    pp = degrees["pp"]
    # Options that mean nothing at these degrees take one value: an axis's options their default at degree 1, and
    # sequence parallelism only splits along a tensor-parallel group (plan_errors refuses sp=true with tp=1).
    tuned = [dict(zip(OPTIONS, chosen)) for chosen in product(*(
        getattr(space, option) if degrees.get(OPTION_AXIS[option], 1) > 1 else [values[0]]
        for option, values in OPTIONS.items()))]
    sps = space.sp if degrees["tp"] > 1 else [sp for sp in space.sp if not sp]
    timings: list[tuple[str, int]] = []
    flat = _unpipelined(space.schedule) if pp == 1 else [s for s in space.schedule if s != "interleaved"]
    for schedule in space.schedule:
        if schedule in flat:
            timings.append((schedule, 1))
        elif schedule == "interleaved" and pp > 1:  # Plan itself refuses interleaving without a pipeline
            # checked once here, so that the enumerator may build its candidates unchecked (`Plan.trusted`)
            timings += [(schedule, Plan(pp=pp, schedule=schedule, v=v).v) for v in _virtual_stages(spec, space, pp)]
    read = [(sp, schedule, v, placement, overlap)
            for sp, (schedule, v), placement, overlap in product(sps, timings, placements, space.overlap)]
    options = _Options(list(space.zero), list(space.recompute), read, tuned)
    same = [s for s in space.schedule if s != "interleaved" and s not in flat]
    if same and read:
        per_schedule = options.count // len(flat)
        options.pruned[f"schedule={'/'.join(same)} at pp=1 (no pipeline: the plan with schedule={flat[0]})"] = (
            per_schedule * len(same))
    return options


def _variants(spec: WorkloadSpec, space: SpaceConfig, degrees: dict[str, int], mbs: int) -> Iterator[Plan]:
    """All plans of the space with these degrees and micro-batch size."""
    options = _options(spec, space, degrees)
    for zero in options.zero:
        for recompute in options.recompute:
            for sp, schedule, v, placement, overlap in options.read:
                for tuned in options.tuned:
                    yield Plan(mbs=mbs, zero=zero, recompute=recompute, sp=sp, schedule=schedule, v=v,
                               placement=placement, overlap=overlap, **tuned, **degrees)


def all_errors(plan: Plan, spec: WorkloadSpec, space: SpaceConfig, framework: Framework | None = None) -> list[str]:
    """Structural reasons and the framework's: why a search does not propose `plan`. `framework`: the spec's, which
    a caller checking many plans looks up once."""
    return plan_errors(plan, spec, space.allow_cross_node_tp) + (framework or resolve(spec).framework).errors(plan, spec)


def candidates(spec: WorkloadSpec, space: SpaceConfig) -> Iterator[Plan]:
    """Every plan the space proposes for the workload, valid or not, less the option values its framework
    never runs (`runnable_space`)."""
    space = runnable_space(space, resolve(spec).framework, spec)
    for degrees, mbs in _degrees(spec, space):
        yield from _variants(spec, space, degrees, mbs)


def _add_variants(result: Enumeration, spec: WorkloadSpec, space: SpaceConfig, framework: Framework,
                  options: _Options, fixed: dict[str, int]) -> None:
    """Check the candidates of `_variants` at the `fixed` degrees and micro-batch, one per RULE_BLIND group,
    and add them to `result` in `_variants`' order: a group's errors count once per member, each in the order
    its first member would have met it."""
    if not options.recompute or not options.tuned:
        return
    repeats = len(options.recompute) * len(options.tuned)
    blind = {"recompute": options.recompute[0], **options.tuned[0]}
    gpus = Plan.trusted({**fixed, **blind}).gpus
    for zero in options.zero:
        valid: list[dict[str, object]] = []
        for sp, schedule, v, placement, overlap in options.read:
            values = {**fixed, "zero": zero, "sp": sp, "schedule": schedule, "v": v, "placement": placement,
                      "overlap": overlap, "recompute_layers": 0, "offload": "none",
                      "optimizer_offload": 0.0, "moments": "fp32", "grads": "fp32"}
            plan = Plan.trusted({**values, **blind})
            errors = all_errors(plan, spec, space, framework)
            if errors:
                for reason in errors:
                    result.rejected[reason] += repeats
            else:
                valid.append(values)
        result.checked += repeats * len(options.read)
        result.plans.append(Product(tuple(valid), tuple(options.recompute), tuple(options.tuned), gpus))


def _add_prototype(result: Enumeration, spec: WorkloadSpec, space: SpaceConfig, framework: Framework,
                   degrees: dict[str, int], mbs: int) -> None:
    """Add the candidates of one (degrees, mbs) prototype to `result`: all rejected with its reasons when the
    prototype fails the structural rules, else each checked (`_add_variants`)."""
    options = _options(spec, space, degrees)
    result.pruned.update(options.pruned)
    proto_errors = plan_errors(Plan(mbs=mbs, **degrees), spec, space.allow_cross_node_tp)
    if proto_errors:
        n = options.count
        result.checked += n
        for reason in proto_errors:
            result.rejected[reason] += n
        return
    _add_variants(result, spec, space, framework, options, {**degrees, "mbs": mbs})


def enumerate_plans(spec: WorkloadSpec, space: SpaceConfig) -> Enumeration:
    """The valid plans of `space` for `spec` that its framework runs, with rejection counts per reason."""
    result, framework = Enumeration(plans=PlanList(), checked=0), resolve(spec).framework
    space = runnable_space(space, framework, spec)
    for degrees, mbs in _degrees(spec, space):
        _add_prototype(result, spec, space, framework, degrees, mbs)
    return result


def sample_plans(spec: WorkloadSpec, space: SpaceConfig, count: int, seed: int = 0, near: Plan | None = None
                 ) -> Enumeration:
    """About `count` valid plans of `space` (at least `count` when it has them), without enumerating it all: the
    plans of (degrees, mbs) prototypes taken in a random order until `count` are valid. Cheap where a whole space
    would take seconds (millions of candidates), and a sample of every prototype's variants alike. With `near`, half
    of them come first from the prototypes nearest that plan (fewest halvings and doublings of its degrees and
    micro-batch: where a wider space's better plan usually is, e.g. tp=8 as tp=4 with another axis at 2), the rest
    at random."""
    result, framework = Enumeration(plans=PlanList(), checked=0), resolve(spec).framework
    space = runnable_space(space, framework, spec)
    prototypes = list(_degrees(spec, space))
    random.Random(seed).shuffle(prototypes)
    if near is not None:
        def distance(prototype: tuple[dict[str, int], int]) -> float:
            degrees, mbs = prototype
            return abs(math.log2(mbs / near.mbs)) + sum(abs(math.log2(d / getattr(near, a))) for a, d in degrees.items())

        taken: set[int] = set()
        for prototype in sorted(prototypes, key=distance):  # stable: equally near ones keep the random order
            if len(result.plans) >= count // 2:
                break
            _add_prototype(result, spec, space, framework, *prototype)
            taken.add(id(prototype))
        prototypes = [p for p in prototypes if id(p) not in taken]
    for degrees, mbs in prototypes:
        if len(result.plans) >= count:
            break
        _add_prototype(result, spec, space, framework, degrees, mbs)
    return result


def rejected(spec: WorkloadSpec, space: SpaceConfig) -> Iterator[tuple[Plan, list[str]]]:
    """Each rejected candidate of the space with every reason it is rejected."""
    for plan in candidates(spec, space):
        errors = all_errors(plan, spec, space)
        if errors:
            yield plan, errors


def explain(plan: Plan, spec: WorkloadSpec, space: SpaceConfig) -> list[str]:
    """Why `plan` is not searched: outside the space, and/or structurally invalid, and/or outside the framework.
    Empty if it is searched."""
    space = _for_model(space, spec)
    reasons = []
    for axis in INT_AXES:
        value, allowed, cap = getattr(plan, axis), getattr(space, axis), getattr(space, f"max_{axis}")
        if axis == "v" and plan.schedule != "interleaved":
            continue
        if allowed != "auto" and value not in allowed:
            reasons.append(f"{axis}={value} is not in the space's {axis} values {allowed}")
        if cap is not None and value > cap:
            reasons.append(f"{axis}={value} exceeds the space's max_{axis}={cap}")
    for axis in CHOICE_AXES:
        value = getattr(plan, axis)
        if axis in OPTION_AXIS and getattr(plan, OPTION_AXIS[axis]) == 1:
            continue  # an axis's option means nothing at degree 1
        if value not in getattr(space, axis):
            reasons.append(f"{axis}={str(value).lower()} is not in the space's {axis} values {getattr(space, axis)}")
    flat = _unpipelined(space.schedule)
    if plan.pp == 1 and flat and plan.schedule != flat[0]:
        reasons.append(f"schedule={plan.schedule} at pp=1 is searched as schedule={flat[0]} (no pipeline: the same plan)")
    return reasons + all_errors(plan, spec, space) + recompute_errors(plan, spec)
