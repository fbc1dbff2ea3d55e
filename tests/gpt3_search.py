"""GPT-3 1.3B on two DGX A100-40GB nodes with the megatron-3d plans: the case the search, cluster-size and
report tests share, with the search's answer found without Ray and the report of a search over 1, 2 and 4 nodes."""

from __future__ import annotations

from functools import cache

from orchestrator.planning import enumerate_sizes, sized_spec
from orchestrator.report import Report, build_report
from orchestrator.search.types import Evaluated, SearchResult, infeasibility
from predictor.models.analytical import AnalyticalPredictor
from predictor.spec.hardware import GIB
from predictor.spec.resolver import get_device, resolve
from predictor.spec.workload import parse_spec
from search_spaces import enumerate_plans, load_space
from tests.gpt_graph import gpt_graph

SPEC = parse_spec({"model": {"preset": "gpt3-1.3b"}, "training": {"global_batch": 64},
                   "cluster": {"device": "a100-40gb", "nodes": 2, "gpus_per_node": 8}})
GRAPH = gpt_graph(2048, 32, 2048, 24, 51200)
PLANS = enumerate_plans(SPEC, load_space("megatron-3d")).plans
DEVICE = get_device("a100-40gb")
CAPACITY = DEVICE.mem_capacity / GIB
TOKENS = 1e10


def best_direct(headroom: float = 0.10) -> str:
    """The answer without Ray: predict every plan here, keep the fastest that fits."""
    preds = AnalyticalPredictor().predict(SPEC, GRAPH, PLANS)
    ok = [(p.iter_time_s, p.peak_memory_gib, str(plan)) for plan, p in zip(PLANS, preds)
          if p.peak_memory_gib <= CAPACITY * (1 - headroom)]
    return min(ok)[2]


def best_found(result) -> str:
    ok = [(e.prediction.iter_time_s, e.prediction.peak_memory_gib, str(e.plan)) for e in result.evaluated if e.feasible]
    return min(ok)[2]


@cache
def _evaluated() -> tuple:
    """SPEC at 1, 2 and 4 nodes: the sizes' specs, their enumeration and every plan predicted (once a session)."""
    specs = [sized_spec(SPEC, n) for n in (1, 2, 4)]
    enumeration = enumerate_sizes(specs, load_space("megatron-3d"))
    evs = []
    for spec in specs:
        plans = [p for p in enumeration.plans if p.gpus == spec.cluster.gpus]
        evs += [Evaluated(p, pr, infeasible=infeasibility(pr, CAPACITY * 0.9, CAPACITY))
                for p, pr in zip(plans, AnalyticalPredictor().predict(spec, GRAPH, plans))]
    return specs, enumeration, evs


def sized_build(accuracy: dict | None = None, **kw) -> Report:
    """The report of an exhaustive search over the three sizes at $2 per GPU-hour; `kw` go to build_report."""
    specs, enumeration, evs = _evaluated()
    space = load_space("megatron-3d")
    stats = {"memory_limit_gib": CAPACITY * 0.9, "headroom": 0.1, "searcher": "exhaustive", "evaluated_plans": len(evs),
             "trials": 1, "trials_failed": 0, "search_s": 1.0, "plans_per_s": 1.0}
    return build_report(resolved=resolve(SPEC), spec_path="spec.yaml", predictor={"name": "analytical", "accuracy": accuracy},
                        space_name="megatron-3d", space=space, enumeration=enumeration, result=SearchResult.of(evs, stats, CAPACITY * 0.9, CAPACITY),
                        sizes=specs, price=2.0, **kw)
