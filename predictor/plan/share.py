"""What one rank holds of a pipeline stage's layers: each dimension of them (`predictor.plan.axes.DIMENSIONS`)
divided by the degrees of the axes that split it.

The pricing core (`predictor.costs.parallel`, `predictor.memory`) reads a `RankShare`, never an axis: which axis
splits a dimension is the registry's word alone (`Axis.splits`), so an axis that splits a dimension already priced
needs no edit there.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from math import prod
from typing import TYPE_CHECKING, Mapping

from predictor.plan.axes import AXES, AXIS, DIMENSIONS, SEQUENCE_SHARD, SEQUENCE_SPLIT_AXIS

if TYPE_CHECKING:  # pragma: no cover
    from predictor.plan.plan import Plan


@dataclass(frozen=True)
class RankShare:
    """The divisor of each dimension of a stage's layers on one rank (1: held whole)."""

    width: int = 1
    tokens: int = 1
    sequence: int = 1
    experts: int = 1
    expert_width: int = 1
    layers: int = 1
    seq_shard: int = 1  # the sequence of the nodes a width split leaves whole (`SEQUENCE_SHARD`)

    @classmethod
    def of(cls, plan: Plan) -> RankShare:
        """The share of one rank of `plan`."""
        return cls.split(plan.degrees(), plan.sp)

    @classmethod
    def split(cls, degrees: Mapping[str, int], sp: bool = False) -> RankShare:
        """The share of one rank under `degrees` (axis name: degree; an axis not named has degree 1), with
        sequence parallelism `sp` splitting the sequence of what the width split leaves whole."""
        unknown = sorted(set(degrees) - set(AXIS))
        if unknown:
            raise ValueError(f"unknown axes {unknown}; known: {', '.join(AXIS)}")
        divisors = {d: prod(int(degrees.get(a.name, 1)) for a in AXES if d in a.splits) for d in DIMENSIONS}
        divisors[SEQUENCE_SHARD] = int(degrees.get(SEQUENCE_SPLIT_AXIS, 1)) if sp else 1
        return cls(**divisors)


if {f.name for f in fields(RankShare)} != {*DIMENSIONS, SEQUENCE_SHARD}:  # pragma: no cover (a registry edit)
    raise ValueError(f"RankShare's fields must be the registry's dimensions {[*DIMENSIONS, SEQUENCE_SHARD]}")

# The communication group of the axis that splits each dimension (`Axis.group`), where one axis with a group does
# (two would leave the dimension's group ambiguous: it is then not here).
_GROUPED: tuple[tuple[str, str], ...] = tuple((d, a.group) for a in AXES if a.group for d in a.splits)
SPLIT_GROUPS: dict[str, str] = {d: g for d, g in _GROUPED if [x for x, _ in _GROUPED].count(d) == 1}
