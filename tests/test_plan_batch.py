"""Predicting plans in one batch (pieces shared between plans, kept across calls) gives each plan exactly what
predicting it alone gives; the table's columns are the predictions' fields."""

import random

import numpy as np
import pytest

from predictor.costs.prediction import TIME_PARTS
from predictor.costs.prediction_table import PredictionTable
from predictor.frameworks import FRAMEWORKS
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.spec.workload import parse_spec
from search_spaces import enumerate_plans, load_space

MOE = {"family": "qwen3_moe", "hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "seq_len": 128,
       "vocab": 1024, "experts": 8, "top_k": 2, "expert_ffn": 128}


def _spec(model: dict, framework: str, nodes: int) -> object:
    return parse_spec({"model": model, "training": {"global_batch": 64, "precision": "bf16", "framework": framework},
                       "cluster": {"device": "h100", "nodes": nodes, "gpus_per_node": 8}})


@pytest.mark.parametrize("model,framework", [({"preset": "llama3-8b", "seq_len": 2048}, "megatron"),
                                             (MOE, "megatron"), ({"preset": "llama3-8b", "seq_len": 2048}, "deepspeed")],
                         ids=["dense-megatron", "moe-megatron", "dense-deepspeed"])
def test_a_batch_predicts_each_plan_as_alone(model: dict, framework: str) -> None:
    spec = _spec(model, framework, nodes=8)
    graph = graph_for(spec.model)
    space = enumerate_plans(spec, load_space("full")).plans
    plans = random.Random(0).sample(space, 200)
    # plans alike but for their placement: their groups differ, their stages' layers do not
    plans += [p for p in space if p.ep == 8 and p.pp > 1 and p.placement != "tp-dp-pp"][:50]
    plans += [p.with_(placement="tp-dp-pp") for p in plans[200:]]
    predictor = AnalyticalPredictor()
    batched = predictor.predict(spec, graph, plans[:150]) + predictor.predict(spec, graph, plans[150:])
    for plan, got in zip(plans, batched):
        assert got == AnalyticalPredictor().predict(spec, graph, [plan])[0], str(plan)


def test_the_table_holds_the_predictions_fields() -> None:
    spec = _spec(MOE, "megatron", nodes=2)
    graph = graph_for(spec.model)
    plans = enumerate_plans(spec, load_space("full")).plans[:200]
    table = AnalyticalPredictor().predict_table(spec, graph, plans)
    preds = table.rows()
    assert len(table) == len(preds) == len(plans)
    assert np.array_equal(table.iter_time_s, [p.iter_time_s for p in preds])
    assert np.array_equal(table.part("dp_comm"), [p.breakdown["dp_comm"] for p in preds])
    assert all(list(p.breakdown) == list(TIME_PARTS) for p in preds)
    assert all(p.extra["active_params"] < p.extra["params"] for p in preds)
    assert table.row(7) == preds[7]


def test_tables_split_and_join_without_changing_a_row() -> None:
    spec = _spec(MOE, "megatron", nodes=2)
    graph = graph_for(spec.model)
    plans = enumerate_plans(spec, load_space("full")).plans[:300]
    predictor = AnalyticalPredictor()
    whole = predictor.predict(spec, graph, plans)
    parts = [predictor.predict_table(spec, graph, plans[i:i + 100]) for i in range(0, 300, 100)]
    joined = PredictionTable.concatenate(parts)
    assert joined.rows() == whole
    picked = joined.take([299, 3, 150])
    assert picked.rows() == [whole[299], whole[3], whole[150]]
    tabulated = PredictionTable.from_predictions(whole)
    assert PredictionTable.concatenate([tabulated.take([5]), tabulated.take([1])]).rows() == [whole[5], whole[1]]


def test_overlap_depends_only_on_the_fields_a_batch_keys_it_by() -> None:
    """plan_batch looks each plan's overlapped kinds up under (overlap, ep, pp, schedule, zero, tp, sp, full
    recomputation: Megatron-Core's expert all-to-all overlap is refused beside it)."""
    spec = _spec(MOE, "megatron", nodes=8)
    plans = random.Random(1).sample(enumerate_plans(spec, load_space("full")).plans, 400)
    changes = {"dp": 3, "mbs": 5, "recompute": "selective", "placement": "tp-pp-dp", "cp": 2, "cp_comm": "allgather"}
    for framework in FRAMEWORKS.values():
        for plan in plans:
            for field, value in changes.items():
                if field == "recompute" and plan.recompute == "full":
                    continue  # full recomputation is in the key
                assert framework.overlap(plan.with_(**{field: value})) == framework.overlap(plan), (framework.name, field)
