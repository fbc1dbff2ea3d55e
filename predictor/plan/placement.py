"""Where a plan's ranks sit: rank orders (placements) and NVLink domains (`predictor.plan.rules` says which groups
leave them).

Rank order: a placement names axes innermost first ('tp-dp-pp': tp ranks are adjacent GPUs). Axes a
placement leaves out are inserted at their `order` position, so the placements written before an axis existed
keep meaning what they meant.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import permutations
from typing import TYPE_CHECKING

from predictor.plan.axes import DEFAULT_ORDER, FIRST_AXES, RANK_AXES

if TYPE_CHECKING:  # pragma: no cover
    from predictor.spec.workload import WorkloadSpec


@lru_cache(maxsize=1024)
def complete_order(placement: str) -> tuple[str, ...]:
    """The full rank order of `placement`: its axes in its order, each axis it leaves out right after the
    nearest axis before it in `DEFAULT_ORDER` (first when there is none)."""
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
                f"{', '.join(RANK_AXES)} (e.g. {DEFAULT_PLACEMENT}); got {placement!r}")
    if len(set(named)) != len(named):
        return f"plan field 'placement' names an axis twice: {placement!r}"
    return None


# The placement a plan gets when it names none: the first format's axes in registry order (tp-dp-pp).
DEFAULT_PLACEMENT = "-".join(FIRST_AXES)


def placements(axes: tuple[str, ...] = FIRST_AXES) -> tuple[str, ...]:
    """Every rank order of `axes` (the space of placements a search may try), in a stable order."""
    return tuple("-".join(p) for p in permutations(axes))


def nvlink_domain(spec: "WorkloadSpec") -> int:
    """GPUs that share one NVLink domain (a node, or an NVL72 rack): where a group's collectives stay fast."""
    c = spec.cluster
    return int(getattr(c, "nvlink_domain_gpus", None) or c.gpus_per_node)
