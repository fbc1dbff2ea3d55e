"""One plan, one row: fields that change nothing at a plan's degrees take one value, and a recompute module the
model does not have is refused, never proposed; and `PlanList` behaves as the list of its plans."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np

from predictor.frameworks.launch import run_errors
from predictor.plan import Plan, recompute_for_model
from predictor.spec.resolver import resolve
from predictor.spec.workload import load_spec, parse_spec
from search_spaces import enumerate_plans, explain, load_space, narrow, resolve_space
from search_spaces.plan_list import Listed, PlanList

ROOT = Path(__file__).resolve().parents[1]
GPT3 = load_spec(ROOT / "examples/gpt3-175b-a100x1024.yaml")
BERT = load_spec(ROOT / "examples/bert-cpu2.yaml")
MIXTRAL = parse_spec({"model": {"preset": "mixtral-8x7b"}, "training": {"global_batch": 32, "precision": "bf16"},
                      "cluster": {"device": "a100-80gb", "nodes": 2, "gpus_per_node": 8}})


def test_a_dense_model_is_never_proposed_a_module_it_does_not_have() -> None:
    space = narrow(load_space("full"), {"mbs": [1]}, "full")
    recomputes = {p.recompute for p in enumerate_plans(GPT3, space).plans}
    assert recomputes == {"none", "selective", "layernorm", "full"}  # layernorm+moe_act read as layernorm
    assert "layernorm+moe_act" in {p.recompute for p in enumerate_plans(MIXTRAL, space).plans}
    assert recompute_for_model("layernorm+moe_act", GPT3) == "layernorm"
    assert recompute_for_model("moe_act", GPT3) == "none"
    assert recompute_for_model("layernorm+moe_act", MIXTRAL) == "layernorm+moe_act"


def test_the_rules_refuse_a_module_the_model_does_not_have() -> None:
    plan = Plan(dp=128, tp=8, mbs=1, recompute="layernorm+moe_act", sp=True)
    errors = run_errors(plan, resolve(GPT3))
    assert any("moe_act, which the model does not have" in e and "use recompute=layernorm" in e for e in errors)
    assert not run_errors(Plan(dp=128, tp=8, mbs=1, recompute="layernorm", sp=True), resolve(GPT3))
    assert any("does not have" in r for r in explain(plan, GPT3, load_space("full")))


def test_without_a_pipeline_the_schedule_is_one_plan_and_counted_as_pruned() -> None:
    name, space = resolve_space(BERT)  # ScaleDL's own runner runs gpipe and 1f1b
    assert {"gpipe", "1f1b"} <= set(space.schedule)
    result = enumerate_plans(BERT, space)
    unpipelined = [p for p in result.plans if p.pp == 1]
    assert unpipelined and {p.schedule for p in unpipelined} == {"1f1b"}
    assert {p.schedule for p in result.plans if p.pp > 1} >= {"gpipe", "1f1b"}
    (reason, count), = result.pruned.items()
    assert reason.startswith("schedule=gpipe at pp=1") and count >= len(unpipelined)  # candidates, valid or not
    assert explain(Plan(dp=2, mbs=1, schedule="gpipe"), BERT, space) == [
        "schedule=gpipe at pp=1 is searched as schedule=1f1b (no pipeline: the same plan)"]


def test_plan_list_is_the_list_of_its_plans() -> None:
    plans = enumerate_plans(GPT3, load_space("megatron-3d")).plans
    every = list(plans)
    assert isinstance(plans, PlanList) and len(plans.blocks) < len(plans) == len(every)
    assert plans == every and plans[-1] == every[-1] and list(plans[10:20]) == every[10:20]
    rows = random.Random(0).sample(range(len(every)), 50)
    chosen = plans.take(rows)
    assert list(chosen) == [every[i] for i in rows] and chosen[3] == every[rows[3]]
    shipped = pickle.loads(pickle.dumps(chosen[:5]))
    assert shipped == [every[i] for i in rows[:5]] and len(shipped.blocks) <= 5  # only the blocks it uses
    joined = chosen + [Plan(dp=1024)]
    assert joined[-1] == Plan(dp=1024) and list(joined[:-1]) == list(chosen)
    assert (joined.gpus() == 1024).all() and isinstance(joined.blocks[-1], Listed)
    assert np.array_equal(plans.gpus(), [p.gpus for p in every])

