"""Where a validation's ranks go: one bundle per rank, tp packed on a node, pipeline stages spread."""

from __future__ import annotations

import math
from typing import Sequence

from predictor.plan import Plan


def shared_cpus(ranks: int, wanted: float, nodes: Sequence[dict[str, float]]) -> float:
    """CPUs each of `ranks` ranks asks for: `wanted`, or an equal share of the cluster's CPUs when it has fewer
    than the ranks want (an embedded Ray declares one CPU per core). Ranks then time-share cores, which the
    comparison with the prediction accounts for (`ValidationResult.core_sharing`); Ray counts resources in
    units of 1/10,000, so the share is rounded down to that."""
    total = sum(n.get("CPU", 0.0) for n in nodes)
    if ranks * wanted <= total or total <= 0:
        return wanted
    return math.floor(total / ranks * 10_000) / 10_000


def rank_bundles(plan: Plan, cpus_per_rank: float = 1.0, gpus: bool = False) -> list[dict[str, float]]:
    """One bundle per rank, in global rank order."""
    bundle = {"CPU": cpus_per_rank, **({"GPU": 1.0} if gpus else {})}
    return [dict(bundle) for _ in range(plan.gpus)]


def placement_strategy(plan: Plan, bundle: dict[str, float], nodes: Sequence[dict[str, float]]) -> tuple[str, str]:
    """(Ray placement strategy, note) for a plan on nodes with the given total resources.

    tp exchanges activations every layer, so its ranks belong on one node: a plan that is a
    single tp group is STRICT_PACKed when one node can hold it, otherwise PACKed (Ray keeps
    consecutive bundles, i.e. tp neighbours with tp innermost, together as far as it can).
    Pipeline stages only pass activations between neighbours once per micro-batch, so they are
    spread over nodes like a real pipeline; pure data parallelism is packed.
    """
    if plan.tp > 1:
        fits = any(all(node.get(k, 0.0) >= v * plan.tp for k, v in bundle.items()) for node in nodes)
        if plan.gpus == plan.tp and fits:
            return "STRICT_PACK", ""
        return "PACK", "" if fits else f"no node holds the tp={plan.tp} group; its ranks span nodes"
    if plan.pp > 1:
        return "SPREAD", ""
    return "PACK", ""



def unplaceable(bundles: list[dict[str, float]], nodes: Sequence[dict[str, float]]) -> str:
    """Why the cluster can never hold these bundles ('' when it can, greedily first-fit)."""
    free = [dict(n) for n in nodes]
    for i, bundle in enumerate(bundles):
        for node in free:
            if all(node.get(k, 0.0) >= v for k, v in bundle.items()):
                for k, v in bundle.items():
                    node[k] -= v
                break
        else:
            total = {k: sum(n.get(k, 0.0) for n in nodes) for k in bundles[0]}
            need = {k: sum(b.get(k, 0.0) for b in bundles) for k in bundles[0]}
            return f"the plan needs {len(bundles)} ranks ({need}) but the cluster has {total}; rank {i} has no room"
    return ""
