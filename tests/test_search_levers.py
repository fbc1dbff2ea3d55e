"""The search's lever pass: plans that overflow but would beat what fits are tried again with the memory levers."""

from __future__ import annotations

from orchestrator.planning import sized_spec
from orchestrator.search.levers import Repredictor, explore_levers, memory_levers, runs
from orchestrator.search.types import SearchResult
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.spec.workload import parse_spec

SPEC = parse_spec({"model": {"preset": "llama3-70b", "seq_len": 8192},
                   "training": {"global_batch": 128, "precision": "bf16", "framework": "megatron"},
                   "cluster": {"device": "h100", "nodes": 8, "gpus_per_node": 8}})
GRAPH = graph_for(SPEC.model)


def _result(plans: list[Plan], limit_gib: float) -> tuple[SearchResult, Repredictor]:
    repredictor = Repredictor(AnalyticalPredictor(), GRAPH, sized_spec)
    return SearchResult(plans, repredictor.table(SPEC, plans), limit_gib, 80.0), repredictor


def test_memory_levers_name_each_change_and_pair_it_with_bf16_moments() -> None:
    plan = Plan.parse("dp=8,tp=8,mbs=1,zero=1,sp=true")
    levers = dict(memory_levers(plan, SPEC))
    assert levers["recompute=layernorm"].recompute == "layernorm"
    assert levers["offload=layers:20"].offload == "layers:20"
    assert levers["optimizer_offload=1"].optimizer_offload == 1.0
    assert levers["moments=bf16, grads=bf16, recompute=layernorm"].grads == "bf16"
    assert levers["grads=bf16"].grads == "bf16" and levers["grads=bf16"].moments == "fp32"
    assert all(runs(p, SPEC) for p in levers.values())


def test_overflowing_plans_faster_than_what_fits_get_their_levers_tried() -> None:
    fast = Plan.parse("dp=8,tp=8,mbs=1,zero=1,sp=true")  # ~88 GiB: over an 80 GB H100
    slow = Plan.parse("dp=8,tp=8,mbs=1,zero=1,sp=true,recompute=full")  # fits, ~30 % slower
    result, repredictor = _result([fast, slow], limit_gib=76.0)
    assert list(result.infeasible) == [True, False]
    joined = explore_levers(result, [SPEC], repredictor)
    added = joined.plans[2:]
    assert added and all(p.with_(recompute="none", recompute_layers=0, offload="none", optimizer_offload=0.0,
                                 moments="fp32", grads="fp32") == fast for p in added)
    fits = [i for i in range(2, len(joined.plans)) if not joined.infeasible[i]]
    best = min(fits, key=lambda i: joined.table.iter_time_s[i])
    assert joined.table.iter_time_s[best] < result.table.iter_time_s[1]  # a lever beats full recomputation
    assert joined.stats["levers"]["variants_fitting"] == len(fits)


def test_nothing_is_tried_when_the_fastest_plan_fits() -> None:
    result, repredictor = _result([Plan.parse("dp=8,tp=8,mbs=1,zero=1,sp=true")], limit_gib=200.0)
    assert explore_levers(result, [SPEC], repredictor).plans == result.plans
