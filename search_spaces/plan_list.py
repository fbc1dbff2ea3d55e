"""Many plans held as the products the enumerator makes them from, not as one object each.

A space's valid plans come in blocks: at one set of degrees, micro-batch and ZeRO stage, every recomputation times
every checked combination of the fields the rules read times every combination of the axes' options. A search
walks hundreds of thousands of them and ranks a few, so `PlanList` keeps the blocks (a few thousand small dicts)
and an optional selection of positions, and builds a `Plan` only when one is asked for. It is a `Sequence[Plan]`:
indexing, slicing, iterating and `==` against a list behave as a list of the same plans would. Sent to another
process (a replica's chunk), it pickles only the blocks its positions use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Iterator, overload

import numpy as np

from predictor.plan import Plan


@dataclass(frozen=True)
class Product:
    """The plans `{**fixed, **r, **tuned}` for r in `recomputes` (each a recompute and its recompute_layers), for fixed
    in `fixed`, for tuned in `tuned` (that order: the enumerator's), all with `gpus` GPUs."""

    fixed: tuple[dict[str, Any], ...]
    recomputes: tuple[dict[str, Any], ...]
    tuned: tuple[dict[str, Any], ...]
    gpus: int

    def __len__(self) -> int:
        return len(self.recomputes) * len(self.fixed) * len(self.tuned)

    def plan(self, j: int) -> Plan:
        r, rest = divmod(j, len(self.fixed) * len(self.tuned))
        f, t = divmod(rest, len(self.tuned))
        return Plan.trusted({**self.fixed[f], **self.recomputes[r], **self.tuned[t]})

    def __iter__(self) -> Iterator[Plan]:
        for recompute in self.recomputes:
            for fixed in self.fixed:
                for tuned in self.tuned:
                    yield Plan.trusted({**fixed, **recompute, **tuned})


@dataclass(frozen=True)
class Listed:
    """Plans given one by one (e.g. the lever variants a search adds)."""

    plans: tuple[Plan, ...]

    def __len__(self) -> int:
        return len(self.plans)

    def plan(self, j: int) -> Plan:
        return self.plans[j]

    def __iter__(self) -> Iterator[Plan]:
        return iter(self.plans)


Block = Product | Listed


class PlanList(Sequence[Plan]):
    """The plans of `blocks` end to end, or those at `index` (positions in that concatenation) in its order."""

    def __init__(self, blocks: Sequence[Block] = (), index: np.ndarray | None = None) -> None:
        self.blocks: list[Block] = list(blocks)
        self.index = None if index is None else np.asarray(index, dtype=np.int64)
        self._starts: np.ndarray | None = None

    @classmethod
    def of(cls, plans: Sequence[Plan]) -> "PlanList":
        """`plans` as a PlanList (itself if it is one)."""
        return plans if isinstance(plans, PlanList) else cls([Listed(tuple(plans))] if len(plans) else [])

    def append(self, block: Block) -> None:
        """Add a block's plans at the end (while enumerating; only on a list without a selection)."""
        assert self.index is None, "append to a selection"
        if len(block):
            self.blocks.append(block)
            self._starts = None

    @property
    def starts(self) -> np.ndarray:
        """Where each block starts in the concatenation, and its total length last."""
        if self._starts is None:
            self._starts = np.concatenate([[0], np.cumsum([len(b) for b in self.blocks], dtype=np.int64)]).astype(np.int64)
        return self._starts

    def __len__(self) -> int:
        return int(self.starts[-1]) if self.index is None else len(self.index)

    def positions(self) -> np.ndarray:
        """The positions in the blocks' concatenation of this list's plans, in order."""
        return np.arange(len(self), dtype=np.int64) if self.index is None else self.index

    @overload
    def __getitem__(self, i: int) -> Plan: ...

    @overload
    def __getitem__(self, i: slice) -> "PlanList": ...

    def __getitem__(self, i: int | slice) -> "Plan | PlanList":
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"plan {i} of {n}")
        at = int(self.index[i]) if self.index is not None else i % n
        b = int(np.searchsorted(self.starts, at, side="right")) - 1
        return self.blocks[b].plan(at - int(self.starts[b]))

    def __iter__(self) -> Iterator[Plan]:
        if self.index is None:
            for block in self.blocks:
                yield from block
            return
        starts = self.starts
        which = np.searchsorted(starts, self.index, side="right") - 1
        for b, j in zip(which.tolist(), (self.index - starts[which]).tolist()):
            yield self.blocks[b].plan(j)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str) or len(other) != len(self):
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable while enumerating, like a list

    def __repr__(self) -> str:
        return f"PlanList({len(self)} plans in {len(self.blocks)} blocks)"

    def take(self, rows: Sequence[int] | np.ndarray) -> "PlanList":
        """The plans at `rows` of this list, as a list of their own (sharing the blocks)."""
        rows = np.asarray(rows, dtype=np.int64)
        return PlanList(self.blocks, rows if self.index is None else self.index[rows])._share(self)

    def _share(self, other: "PlanList") -> "PlanList":
        self._starts = other._starts
        return self

    def __add__(self, other: Sequence[Plan]) -> "PlanList":
        other = PlanList.of(other)
        if self.index is None and other.index is None:
            return PlanList([*self.blocks, *other.blocks])
        offset = int(self.starts[-1])
        return PlanList([*self.blocks, *other.blocks], np.concatenate([self.positions(), other.positions() + offset]))

    def gpus(self) -> np.ndarray:
        """Each plan's GPU count."""
        per_block = [np.full(len(b), b.gpus, dtype=np.int64) if isinstance(b, Product)
                     else np.fromiter((p.gpus for p in b.plans), dtype=np.int64, count=len(b)) for b in self.blocks]
        every = np.concatenate(per_block) if per_block else np.zeros(0, dtype=np.int64)
        return every if self.index is None else every[self.index]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with only the blocks its plans come from."""
        if self.index is None:
            return PlanList, (self.blocks,)
        starts = self.starts
        which = np.searchsorted(starts, self.index, side="right") - 1
        used = np.unique(which)
        new_starts = np.concatenate([[0], np.cumsum(starts[used + 1] - starts[used])])
        remap = np.zeros(len(self.blocks), dtype=np.int64)
        remap[used] = new_starts[:-1] - starts[used]
        return PlanList, ([self.blocks[b] for b in used.tolist()], self.index + remap[which])
