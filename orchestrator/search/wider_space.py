"""Whether a wider space holds better plans than the one searched: a cheap check the report states.

The default space is the framework's own (`search_spaces`), far smaller than the `full` space; it can still miss
what a choice it leaves out buys (another schedule, placement, micro-batch, ZeRO stage, context parallelism). So
after a search of another space, a sample of the full space's valid plans (`search_spaces.sample_plans`: whole
prototypes, half nearest the winner's degrees and half in a random order, never the whole space, which takes seconds
to enumerate on big clusters) is predicted
in this process by the search's predictor. When the sample's best plan that fits beats the winner by more than
`GAIN` on the ranking's measure, or fits where nothing did, the report names it and the space that holds it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from orchestrator.report.model import Report, WiderPlan
from orchestrator.search.levers import Repredictor
from predictor.plan import Plan
from predictor.spec.workload import WorkloadSpec
from search_spaces import resolve_space, sample_plans

WIDER = "full"  # every plan ScaleDL predicts (narrowed by the spec's search: section, as the searched space is)
GAIN = 0.03  # a smaller gain is within what the predictors' errors leave undecided
SAMPLE = 2_000  # plans of the wider space predicted, over all cluster sizes: 0.5-1 s on this 2-core machine


def best_of_sample(report: Report, sizes: Sequence[WorkloadSpec], repredictor: Repredictor,
                   seed: int = 0) -> WiderPlan | None:
    """The best plan that fits among about `SAMPLE` plans of the wider space at the cluster sizes searched, when it
    beats the report's winner by more than `GAIN` (or fits where nothing does); None otherwise, and when the space
    searched is the wider one."""
    if report.space.name == WIDER:
        return None
    by_cost = report.ranking.by != "time"  # throughput and cost rank by GPU-seconds per iteration
    best: tuple[float, Plan, float, float] | None = None  # (score, plan, iteration time, peak memory)
    near = report.ranked[0].plan if report.ranked else None  # half the sample around the winner's degrees
    sampled = 0
    for spec in sizes:
        plans = sample_plans(spec, resolve_space(spec, WIDER)[1], SAMPLE // len(sizes), seed, near).plans
        if not plans:
            continue
        sampled += len(plans)
        table = repredictor.table(spec, plans)
        t, peak = table.iter_time_s, table.peak_memory_gib
        score = t * spec.cluster.gpus if by_cost else t
        fits = np.flatnonzero(peak <= report.device.memory_limit_gib)
        if len(fits):
            i = int(fits[np.argmin(score[fits])])
            if best is None or score[i] < best[0]:
                best = (float(score[i]), plans[i], float(t[i]), float(peak[i]))
    if best is None:
        return None
    if report.ranked:
        winner = report.ranked[0]
        if best[0] >= winner.iter_time_s * (winner.plan.gpus if by_cost else 1) * (1 - GAIN):
            return None
    return WiderPlan(WIDER, best[1], best[2], best[3], sampled)
