"""Every valid plan of a workload inside a search space, and why the others are rejected.

The structural rules live in `predictor.plan.plan_errors`, the framework's in
`predictor.frameworks`; this module only generates the candidates of a space and keeps the ones
with no error. The degrees of the registered axes (`predictor.plan.axes`) are chosen in registry order
with dp derived (GPUs / the others), so they always multiply to the GPU count; an axis that multiplies into no
GPU count (it regroups a stage's ranks) is chosen apart, among the divisors of a stage's ranks that its
"choices" function allows. To stay fast on
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
from typing import Iterable, Iterator, Sequence

from predictor.frameworks import Framework
from predictor.models.base import Dominated
from predictor.plan import AXES, Axis
from predictor.plan import Plan, plan_errors, recompute_errors, recompute_for_model
from predictor.plan.axes import OPTION_AXIS, OPTIONS, PIPELINE_AXIS, REPLICA_AXIS, SEQUENCE_SPLIT_AXIS
from predictor.spec.resolver import resolve
from predictor.spec.workload import WorkloadSpec
from search_spaces.plan_list import PlanList, Product
from search_spaces.space import CHOICE_AXES, INT_AXES, SpaceConfig

# Axes whose degree a search picks; the replicas (`REPLICA_AXIS`) take what the GPU count leaves.
_CHOSEN = tuple(a.name for a in AXES if a.multiplies_gpus and a.name != REPLICA_AXIS)
# Axes that regroup a stage's ranks (for some of its layers) rather than multiply into the GPU count.
_REGROUPING = tuple(a for a in AXES if not a.multiplies_gpus)
_REGROUPING_NAMES = tuple(a.name for a in _REGROUPING)


@dataclass
class Enumeration:
    """The valid plans (deterministic order), how many candidates were rejected for which reason, and how many
    were never candidates because another plan of the space is the same plan (`pruned`, by why: a field that changes
    nothing at these degrees has one value) or a plan the predictor never prices better than (a dominated value)."""

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

    allowed, cap = getattr(space, REPLICA_AXIS), getattr(space, f"max_{REPLICA_AXIS}")
    for picked in chosen(0, gpus, {}):
        replicas = gpus
        for d in picked.values():
            replicas //= d
        if (allowed != "auto" and replicas not in allowed) or (cap is not None and replicas > cap):
            continue
        regrouped = product(*(_regrouping_degrees(spec, space, a, _divisors(gpus // picked.get(PIPELINE_AXIS, 1)))
                               for a in _REGROUPING))
        for degrees in regrouped:
            for mbs in _pick(space.mbs, _divisors(gb // replicas) if gb % replicas == 0 else (1,), space.max_mbs):
                yield {**picked, REPLICA_AXIS: replicas, **dict(zip(_REGROUPING_NAMES, degrees))}, mbs


def _regrouping_degrees(spec: WorkloadSpec, space: SpaceConfig, axis: Axis, divisors: tuple[int, ...]) -> list[int]:
    """The degrees of the space of an axis that regroups a stage's ranks (multiplies into no GPU count), so it is
    chosen apart, among the degrees its "choices" function allows at a stage of ranks with these `divisors`."""
    choices = axis.function("choices")
    auto = choices(spec, divisors) if choices else list(divisors)
    if auto is None:
        return [1]
    return [d for d in _pick(getattr(space, axis.name), auto, getattr(space, f"max_{axis.name}")) if d in auto]


def _virtual_stages(spec: WorkloadSpec, space: SpaceConfig, stages: int) -> list[int]:
    """Interleaving depths v > 1 of the space whose stages·v chunks split the layers evenly (or the layers with
    the embedding and the loss counted as one each)."""
    blocks = spec.model.num_blocks
    auto = sorted({v for total in (blocks, blocks + 2) if total % stages == 0 for v in _divisors(total // stages)}) or [2]
    return [v for v in _pick(space.v, auto, space.max_v) if v > 1]  # interleaving with v=1 is plain 1F1B


# A plan recomputing some layers only: a framework whose levers refuse it recomputes every layer or none.
_SOME_LAYERS = Plan(recompute="full", recompute_layers=1)


def runnable_space(space: SpaceConfig, framework: Framework, spec: WorkloadSpec | None = None) -> SpaceConfig:
    """`space` without the option values `framework` never runs (its rules would refuse every such plan): each
    parallel axis it does not declare (`Framework.axes`) at degree 1 where the space takes every degree ('auto'; a
    space that names degrees keeps them, for the rules to refuse with the reason), and counts of recomputed layers
    where it recomputes every layer or none; and, for `spec`, each recompute value less the modules its model does not
    have (`recompute_for_model`: the rules refuse naming them)."""
    changes: dict[str, object] = {axis: [v for v in getattr(space, axis) if framework.runs_value(axis, v)]
                                  for axis in CHOICE_AXES}
    changes.update({axis.name: [1] for axis in AXES if axis.name not in framework.axes and getattr(space, axis.name) == "auto"})
    if framework.lever_errors(_SOME_LAYERS):  # it recomputes every layer or none
        changes["recompute_layers"] = [0]
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
# if a rule starts reading one). A count of recomputed layers (`recompute_layers`) is read only with the pipeline's
# chunking, so its errors are checked once per interleaving depth.
RULE_BLIND: tuple[str, ...] = ("recompute", *OPTIONS)


def recompute_counts(spec: WorkloadSpec, space: SpaceConfig, chunks: int) -> tuple[list[int], list[int]]:
    """(counts searched, counts left out) of layers per model chunk a full recomputation recomputes, the layers split
    into `chunks` model chunks (pp·v): `auto` is each power of two that divides a chunk's blocks and is fewer
    (recomputed layers cost time and save memory in proportion, so a doubling grid brackets the count that fits; and
    torchtitan checkpoints every k-th block, these counts); a listed count of a chunk's blocks or more is full
    recomputation of every layer, the count 0, so it is left out as that plan."""
    blocks = spec.model.num_blocks // chunks
    if space.recompute_layers == "auto":
        counts = [1 << i for i in range(max(blocks, 1).bit_length()) if (1 << i) < blocks and blocks % (1 << i) == 0]
    else:
        counts = [n for n in space.recompute_layers if n]
    cap = space.max_recompute_layers
    counts = [n for n in counts if cap is None or n <= cap]
    return [n for n in counts if n < blocks], [n for n in counts if n >= blocks]


@dataclass(frozen=True)
class _Chunking:
    """The candidates at one interleaving depth `v`: their recomputations (a recompute and its recompute_layers, which
    counts a chunk's layers) and the fields the rules read (sp, schedule, v, placement, overlap)."""

    v: int
    recomputes: list[dict[str, object]]
    read: list[tuple[bool, str, int, str, str]]

    @property
    def count(self) -> int:
        return len(self.recomputes) * len(self.read)


@dataclass(frozen=True)
class _Options:
    """The option values of the space at one set of degrees, in the candidates' loop order: zero, then each
    interleaving depth's recomputations and `read` fields (`chunkings`), the axes' options (`tuned`) innermost;
    `pruned`: the candidates per reason left out as the same plan as one kept."""

    zero: list[int]
    chunkings: list[_Chunking]
    tuned: list[dict[str, str]]
    pruned: Counter[str] = field(default_factory=Counter)

    @property
    def count(self) -> int:
        return len(self.zero) * sum(c.count for c in self.chunkings) * len(self.tuned)


def _chunkings(spec: WorkloadSpec, space: SpaceConfig, stages: int, read: list[tuple[bool, str, int, str, str]],
               pruned: Counter[str], repeats: int) -> list[_Chunking]:
    """`read` grouped by interleaving depth, each with its recomputations; counts of recomputed layers that are full
    recomputation of every layer at that depth are added to `pruned` (`repeats` candidates each per read value)."""
    out = []
    for v in dict.fromkeys(r[2] for r in read):
        at_v = [r for r in read if r[2] == v]
        recomputes: list[dict[str, object]] = [{"recompute": r, "recompute_layers": 0} for r in space.recompute]
        if "full" in space.recompute:
            counts, every = recompute_counts(spec, space, stages * v)
            recomputes += [{"recompute": "full", "recompute_layers": n} for n in counts]
            for n in every:
                pruned[f"recompute_layers={n} at {spec.model.num_blocks // (stages * v)} blocks per chunk (every layer: "
                       f"the plan with recompute_layers=0)"] += repeats * len(at_v)
        out.append(_Chunking(v, recomputes, at_v))
    return out


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
    stages = degrees[PIPELINE_AXIS]
    # Options that mean nothing at these degrees take one value: an axis's options their default at degree 1, and
    # sequence parallelism only splits along its axis's group (plan_errors refuses sp=true with tp=1).
    tuned = [dict(zip(OPTIONS, chosen)) for chosen in product(*(
        getattr(space, option) if degrees.get(OPTION_AXIS[option], 1) > 1 else [values[0]]
        for option, values in OPTIONS.items()))]
    sps = space.sp if degrees[SEQUENCE_SPLIT_AXIS] > 1 else [sp for sp in space.sp if not sp]
    timings: list[tuple[str, int]] = []
    flat = _unpipelined(space.schedule) if stages == 1 else [s for s in space.schedule if s != "interleaved"]
    for schedule in space.schedule:
        if schedule in flat:
            timings.append((schedule, 1))
        elif schedule == "interleaved" and stages > 1:  # Plan itself refuses interleaving without a pipeline
            # checked once here, so that the enumerator may build its candidates unchecked (`Plan.trusted`)
            timings += [(schedule, Plan(schedule=schedule, v=v, **{PIPELINE_AXIS: stages}).v)
                        for v in _virtual_stages(spec, space, stages)]
    read = [(sp, schedule, v, placement, overlap)
            for sp, (schedule, v), placement, overlap in product(sps, timings, placements, space.overlap)]
    pruned: Counter[str] = Counter()
    options = _Options(list(space.zero), _chunkings(spec, space, stages, read, pruned, len(space.zero) * len(tuned)),
                       tuned, pruned)
    same = [s for s in space.schedule if s != "interleaved" and s not in flat]
    if same and read:
        per_schedule = options.count // len(flat)
        options.pruned[f"schedule={'/'.join(same)} at {PIPELINE_AXIS}=1 (no pipeline: the plan with schedule={flat[0]})"] += (
            per_schedule * len(same))
    return options


def _variants(spec: WorkloadSpec, space: SpaceConfig, degrees: dict[str, int], mbs: int) -> Iterator[Plan]:
    """All plans of the space with these degrees and micro-batch size."""
    options = _options(spec, space, degrees)
    for zero in options.zero:
        for chunking in options.chunkings:
            for recompute in chunking.recomputes:
                for sp, schedule, v, placement, overlap in chunking.read:
                    for tuned in options.tuned:
                        yield Plan(mbs=mbs, zero=zero, **recompute, sp=sp, schedule=schedule, v=v,
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
                  options: _Options, fixed: dict[str, int], dominated: Sequence[Dominated] = ()) -> None:
    """Check the candidates of `_variants` at the `fixed` degrees and micro-batch, one per RULE_BLIND group (and each
    count of recomputed layers once per interleaving depth), and add them to `result` in `_variants`' order: a
    group's errors count once per member, each in the order its first member would have met it. A valid candidate
    `dominated` by a valid one is left out, counted in `result.pruned`."""
    if not options.tuned:
        return
    blind = {"recompute": "none", "recompute_layers": 0, **options.tuned[0]}
    gpus = Plan.trusted({**fixed, **blind}).gpus
    # The counts of recomputed layers each depth's rules accept, checked once for every ZeRO stage
    runnable = [_runnable_recomputes(result, spec, space, framework, chunking,
                                     {**_values(fixed, options.zero[0], chunking.read[0]), **options.tuned[0]},
                                     len(chunking.read) * len(options.tuned) * len(options.zero))
                for chunking in options.chunkings]
    for zero in options.zero:
        for chunking, recomputes in zip(options.chunkings, runnable):
            valid: list[dict[str, object]] = []
            for read in chunking.read:
                values = _values(fixed, zero, read)
                errors = all_errors(Plan.trusted({**values, **blind}), spec, space, framework)
                for reason in errors:
                    result.rejected[reason] += len(chunking.recomputes) * len(options.tuned)
                if not errors:
                    valid.append(values)
            kept = _undominated(valid, dominated, result.pruned, len(recomputes) * len(options.tuned))
            result.checked += chunking.count * len(options.tuned) - (len(valid) - len(kept)) * len(recomputes) * len(
                options.tuned)
            result.plans.append(Product(tuple(kept), tuple(recomputes), tuple(options.tuned), gpus))


def _values(fixed: dict[str, int], zero: int, read: tuple[bool, str, int, str, str]) -> dict[str, object]:
    """A candidate's fields but its recomputation and the axes' options: the `fixed` degrees and micro-batch, the ZeRO
    stage, the fields the rules read, and the memory levers a search leaves off."""
    sp, schedule, v, placement, overlap = read
    return {**fixed, "zero": zero, "sp": sp, "schedule": schedule, "v": v, "placement": placement, "overlap": overlap,
            "offload": "none", "optimizer_offload": 0.0, "moments": "fp32", "grads": "fp32"}


def _undominated(valid: list[dict[str, object]], dominated: Sequence[Dominated], pruned: Counter[str],
                 repeats: int) -> list[dict[str, object]]:
    """`valid` less each candidate a predictor's `dominated` rule says never beats its valid twin (the same values
    but the rule's field at its `by`), each counted `repeats` times in `pruned` under the rule's reason."""
    keys = {tuple(values.items()) for values in valid}
    kept = []
    for values in valid:
        rule = next((r for r in dominated if values.get(r.field) == r.value
                     and tuple({**values, r.field: r.by}.items()) in keys), None)
        if rule is None:
            kept.append(values)
        else:
            pruned[f"{rule.field}={str(rule.value).lower()} where {rule.field}={str(rule.by).lower()} is searched "
                   f"(never faster nor smaller: {rule.why})"] += repeats
    return kept


def _runnable_recomputes(result: Enumeration, spec: WorkloadSpec, space: SpaceConfig, framework: Framework,
                         chunking: _Chunking, values: dict[str, object], repeats: int) -> list[dict[str, object]]:
    """The recomputations of `chunking` whose count of recomputed layers the rules accept at its depth (checked on
    the candidate `values`: what a count adds to its errors); the others' reasons counted `repeats` times each."""
    base: set[str] | None = None
    kept = []
    for recompute in chunking.recomputes:
        if not recompute["recompute_layers"]:
            kept.append(recompute)
            continue
        if base is None:
            base = set(all_errors(Plan.trusted({**values, **recompute, "recompute_layers": 0}), spec, space, framework))
        added = [e for e in all_errors(Plan.trusted({**values, **recompute}), spec, space, framework) if e not in base]
        for reason in added:
            result.rejected[reason] += repeats
        if not added:
            kept.append(recompute)
    return kept


def _add_prototype(result: Enumeration, spec: WorkloadSpec, space: SpaceConfig, framework: Framework,
                   degrees: dict[str, int], mbs: int, dominated: Sequence[Dominated] = ()) -> None:
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
    _add_variants(result, spec, space, framework, options, {**degrees, "mbs": mbs}, dominated)


def candidate_count(spec: WorkloadSpec, space: SpaceConfig) -> int:
    """How many candidates `enumerate_plans` would check (its `checked` with the dominated plans it leaves out), a
    bound on the valid plans, counted without checking or building any: a caller deciding how to search a space
    knows its size before enumerating it."""
    space = runnable_space(space, resolve(spec).framework, spec)
    per_degrees: dict[tuple[tuple[str, int], ...], int] = {}
    total = 0
    for degrees, _ in _degrees(spec, space):
        key = tuple(degrees.items())
        if key not in per_degrees:
            per_degrees[key] = _options(spec, space, degrees).count
        total += per_degrees[key]
    return total


def enumerate_plans(spec: WorkloadSpec, space: SpaceConfig, dominated: Sequence[Dominated] = ()) -> Enumeration:
    """The valid plans of `space` for `spec` that its framework runs, with rejection counts per reason; less those
    the predictor's `dominated` rules say never beat another valid plan of the space (`Predictor.dominated`), counted
    in `pruned` with the rule's reason."""
    result, framework = Enumeration(plans=PlanList(), checked=0), resolve(spec).framework
    space = runnable_space(space, framework, spec)
    for degrees, mbs in _degrees(spec, space):
        _add_prototype(result, spec, space, framework, degrees, mbs, dominated)
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
        if axis == "recompute_layers" and value:
            chunks = getattr(plan, PIPELINE_AXIS) * plan.v
            counts, every = recompute_counts(spec, space, chunks)
            if value in every:
                reasons.append(f"recompute_layers={value} is every layer of a chunk: searched as recompute_layers=0")
            elif allowed == "auto" and value not in counts:
                reasons.append(f"recompute_layers={value} is not in the space's counts at {chunks} chunks "
                               f"(auto: {counts})")
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
    if getattr(plan, PIPELINE_AXIS) == 1 and flat and plan.schedule != flat[0]:
        reasons.append(f"schedule={plan.schedule} at {PIPELINE_AXIS}=1 is searched as schedule={flat[0]} (no pipeline: the same plan)")
    return reasons + all_errors(plan, spec, space) + recompute_errors(plan, spec)
