"""How a search space maps onto Ray Tune trials, as plain data (only the orchestrator imports Ray).

One trial per plan is far too slow (Tune runs ~30 trials/s at best), so a trial evaluates a
batch of plans. Trials never see an invalid plan because they only ever address plans that
`enumerate_plans` already kept:

* exhaustive and random search: the valid plans are cut into batches (exhaustive: contiguous
  chunks, all of them; random: groups in a seeded random order) and a trial's config is just
  the index of its batch;
* model-based search (Optuna TPE): a trial picks a *group* — the plans sharing the GPU count, the
  degree of every axis but the derived dp, mbs and ZeRO stage (`GROUP_AXES`) — by walking a tree of the valid values, each choice conditional on the previous
  ones (define-by-run), so every path ends at a non-empty group. Inside a group the cheap axes
  (recomputation, sequence parallel, schedule, placement) are evaluated together.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from predictor.plan import AXES
from predictor.plan import Plan
from predictor.plan.axes import REPLICA_AXIS
from search_spaces.plan_list import PlanList

# The axes a model-based searcher chooses, in order (the cluster size, when several are searched: a plan's GPU
# count; each registered parallel axis but the replicas, whose degree is derived, those that regroup ranks too; then
# the micro-batch and the ZeRO stage); the rest are evaluated as one batch.
GROUP_AXES: tuple[str, ...] = ("gpus", *(a.name for a in AXES if a.name != REPLICA_AXIS), "mbs", "zero")


class SuggestTrial(Protocol):
    """The part of `optuna.Trial` a define-by-run space uses."""

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


@dataclass
class TuneSpace:
    """The valid plans of a workload, addressable by batch index or by group choice."""

    plans: PlanList
    batch_size: int = 512

    @cached_property
    def groups(self) -> dict[tuple[int, ...], list[int]]:
        """The plans' indices by group (built when a searcher asks: an exhaustive search never does)."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, plan in enumerate(self.plans):
            groups.setdefault(tuple(getattr(plan, a) for a in GROUP_AXES), []).append(i)
        return groups

    @property
    def n_batches(self) -> int:
        return -(-len(self.plans) // self.batch_size)

    def batch(self, index: int) -> list[int]:
        """Plan indices of exhaustive batch `index` (contiguous, `batch_size` plans)."""
        return list(range(index * self.batch_size, min(len(self.plans), (index + 1) * self.batch_size)))

    def grid(self, kind: str, seed: int = 0) -> dict[str, list[Any]]:
        """Values of the single grid axis of a batch-indexed search ('exhaustive' or 'random')."""
        if kind == "exhaustive":
            return {"batch": list(range(self.n_batches))}
        keys = sorted(self.groups)
        random.Random(seed).shuffle(keys)
        return {"group": [list(k) for k in keys]}

    def _names(self, prefix: tuple[int, ...]) -> str:
        """Parameter name of the next axis after `prefix`, made unique per parent choice (Optuna needs
        fixed choices per name)."""
        axis = GROUP_AXES[len(prefix)]
        context = ",".join(f"{a}={v}" for a, v in zip(GROUP_AXES, prefix))
        return f"{axis}|{context}" if context else axis

    def suggest(self, trial: SuggestTrial) -> None:
        """Define-by-run space for OptunaSearch: conditional choices down the tree of valid groups."""
        prefix: tuple[int, ...] = ()
        while len(prefix) < len(GROUP_AXES):
            depth = len(prefix)
            choices = sorted({k[depth] for k in self.groups if k[:depth] == prefix})
            prefix = prefix + (trial.suggest_categorical(self._names(prefix), choices),)

    def members(self, config: dict[str, Any]) -> list[int]:
        """Plan indices a trial config addresses (any of the three forms)."""
        if "batch" in config:
            return self.batch(int(config["batch"]))
        if "group" in config:
            return self.groups[tuple(config["group"])]
        prefix: tuple[int, ...] = ()
        while len(prefix) < len(GROUP_AXES):
            prefix = prefix + (config[self._names(prefix)],)
        return self.groups[prefix]

    def key(self, config: dict[str, Any]) -> str:
        """A stable name of what a config addresses (used to skip repeats and to name stored results)."""
        if "batch" in config:
            return f"batch-{int(config['batch'])}"
        first = self.plans[self.members(config)[0]]
        return "group-" + "-".join(f"{a}{getattr(first, a)}" for a in GROUP_AXES)
