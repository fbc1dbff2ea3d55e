"""Every valid plan of a workload inside a search space, and why the others are rejected.

The structural rules live in `predictor.plan.plan_errors`; this module only generates the
candidates of a space and keeps the ones with no error. dp is derived (GPUs / (tp*pp)), so
the degrees always multiply to the GPU count. To stay fast on big clusters it checks one
prototype per (tp, pp, dp, mbs) first: every rule is monotone in the other fields (the
prototype has v=1, zero=0, sp=false, 1F1B and tp innermost, the least constrained choice),
so a failing prototype rejects all its variants with the same reasons.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from typing import Iterable, Iterator

from predictor.plan import Plan, plan_errors
from predictor.workload import WorkloadSpec
from search_spaces.space import SpaceConfig


@dataclass
class Enumeration:
    """The valid plans (deterministic order) and how many candidates were rejected for which reason."""

    plans: list[Plan]
    checked: int
    rejected: Counter[str] = field(default_factory=Counter)

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


def _degrees(spec: WorkloadSpec, space: SpaceConfig) -> Iterator[tuple[int, int, int, int]]:
    """(tp, pp, dp, mbs) combinations of the space whose degrees multiply to the GPU count."""
    gpus, gb = spec.cluster.gpus, spec.training.global_batch
    for tp in _pick(space.tp, _divisors(gpus), space.max_tp):
        if gpus % tp:
            continue
        for pp in _pick(space.pp, _divisors(gpus // tp), space.max_pp):
            if (gpus // tp) % pp:
                continue
            dp = gpus // (tp * pp)
            if (space.dp != "auto" and dp not in space.dp) or (space.max_dp is not None and dp > space.max_dp):
                continue
            for mbs in _pick(space.mbs, _divisors(gb // dp) if gb % dp == 0 else (1,), space.max_mbs):
                yield tp, pp, dp, mbs


def _virtual_stages(spec: WorkloadSpec, space: SpaceConfig, pp: int) -> list[int]:
    blocks = spec.model.num_blocks
    auto = _divisors(blocks // pp) if blocks % pp == 0 else (2,)
    return [v for v in _pick(space.v, auto, space.max_v) if v > 1]  # interleaving with v=1 is plain 1F1B


def _variants(spec: WorkloadSpec, space: SpaceConfig, tp: int, pp: int, dp: int, mbs: int) -> Iterator[Plan]:
    """All plans of the space with these degrees; placements that map ranks identically are kept once."""
    placements: list[str] = []
    seen: set[tuple[int, ...]] = set()
    for placement in space.placement:
        proto = Plan(dp=dp, tp=tp, pp=pp, placement=placement)
        key = tuple(proto.stride(a) if getattr(proto, a) > 1 else 0 for a in ("dp", "tp", "pp"))
        if key not in seen:
            seen.add(key)
            placements.append(placement)
    for zero in space.zero:
        for recompute in space.recompute:
            for sp in space.sp:
                for schedule in space.schedule:
                    if schedule == "interleaved":
                        if pp == 1:
                            continue  # Plan itself refuses interleaving without a pipeline
                        vs = _virtual_stages(spec, space, pp)
                    else:
                        vs = [1]
                    for v in vs:
                        for placement in placements:
                            yield Plan(dp=dp, tp=tp, pp=pp, mbs=mbs, zero=zero, recompute=recompute, sp=sp,
                                       schedule=schedule, v=v, placement=placement)


def candidates(spec: WorkloadSpec, space: SpaceConfig) -> Iterator[Plan]:
    """Every plan the space proposes for the workload, valid or not."""
    for degrees in _degrees(spec, space):
        yield from _variants(spec, space, *degrees)


def enumerate_plans(spec: WorkloadSpec, space: SpaceConfig) -> Enumeration:
    """The valid plans of `space` for `spec`, with rejection counts per reason."""
    result = Enumeration(plans=[], checked=0)
    for tp, pp, dp, mbs in _degrees(spec, space):
        proto_errors = plan_errors(Plan(dp=dp, tp=tp, pp=pp, mbs=mbs), spec, space.allow_cross_node_tp)
        variants = _variants(spec, space, tp, pp, dp, mbs)
        if proto_errors:
            n = sum(1 for _ in variants)
            result.checked += n
            for reason in proto_errors:
                result.rejected[reason] += n
            continue
        for plan in variants:
            result.checked += 1
            errors = plan_errors(plan, spec, space.allow_cross_node_tp)
            if errors:
                result.rejected.update(errors)
            else:
                result.plans.append(plan)
    return result


def rejected(spec: WorkloadSpec, space: SpaceConfig) -> Iterator[tuple[Plan, list[str]]]:
    """Each rejected candidate of the space with every reason it is rejected."""
    for plan in candidates(spec, space):
        errors = plan_errors(plan, spec, space.allow_cross_node_tp)
        if errors:
            yield plan, errors


def explain(plan: Plan, spec: WorkloadSpec, space: SpaceConfig) -> list[str]:
    """Why `plan` is not searched: outside the space, and/or structurally invalid. Empty if it is searched."""
    reasons = []
    for axis in ("dp", "tp", "pp", "mbs", "v"):
        value, allowed, cap = getattr(plan, axis), getattr(space, axis), getattr(space, f"max_{axis}")
        if axis == "v" and plan.schedule != "interleaved":
            continue
        if allowed != "auto" and value not in allowed:
            reasons.append(f"{axis}={value} is not in the space's {axis} values {allowed}")
        if cap is not None and value > cap:
            reasons.append(f"{axis}={value} exceeds the space's max_{axis}={cap}")
    for axis in ("zero", "recompute", "sp", "schedule", "placement"):
        value = getattr(plan, axis)
        if value not in getattr(space, axis):
            reasons.append(f"{axis}={str(value).lower()} is not in the space's {axis} values {getattr(space, axis)}")
    return reasons + plan_errors(plan, spec, space.allow_cross_node_tp)
