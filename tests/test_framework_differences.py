"""Megatron-Core and DeepSpeed on one A100 plan without overlap differ only by what the two frameworks do differently,
each difference named in the prediction (issue 34): their attention kernels, the host's pace beyond the kernels
and the per-call costs (`extra['framework_s']`), with the constants that price them named in `extra['constants']`.
"""

import numpy as np
import pytest

from predictor.costs.parallel import apply_plan, shard_nodes
from predictor.costs.prediction import Prediction
from predictor.data.evaluate import vtrain_workload
from predictor.frameworks.deepspeed import DEEPSPEED
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.plan_batch import FRAMEWORK_PARTS
from predictor.models.roofline import AnalyticalConfig, layer_times, softmax_fallbacks
from predictor.models.stage_costs import compute_parts
from predictor.plan import Plan, plan_errors
from predictor.plan.share import RankShare
from predictor.spec.resolver import get_device
from predictor.spec.resolver import resolve
from predictor.spec.workload import WorkloadSpec, parse_spec

# Time parts the named differences can move: the computation and the fill and drain it sets (attention, host), and
# the communication parts that charge a per-call cost.
MOVED = {"compute", "pp_bubble", "tp_comm", "pp_p2p", "dp_comm"}


def _spec(model: dict, framework: str, nodes: int, batch: int) -> WorkloadSpec:
    return parse_spec({"model": model, "training": {"global_batch": batch, "precision": "bf16", "framework": framework},
                       "cluster": {"device": "a100-80gb", "nodes": nodes, "gpus_per_node": 8}})


def _predict(model: dict, framework: str, nodes: int, batch: int, plan: str) -> Prediction:
    spec = _spec(model, framework, nodes, batch)
    parsed = Plan.parse(plan)
    assert plan_errors(parsed, spec) == []
    return AnalyticalPredictor().predict(spec, graph_for(spec.model), [parsed])[0]


# GPT-3 175B on 1,024 A100 (kernel-bound) and a 350M GPT on one node (host-bound at micro-batch 1), neither
# overlapping anything.
CASES = [({"preset": "gpt3-175b"}, 128, 1536, "dp=16,tp=8,pp=8,mbs=1,zero=1,recompute=full,sp=false,overlap=none"),
         ({"preset": "gpt3-350m"}, 1, 32, "dp=2,tp=2,pp=2,mbs=1,recompute=full,sp=false,overlap=none")]


@pytest.mark.parametrize("model,nodes,batch,plan", CASES)
def test_megatron_and_deepspeed_differ_by_the_named_parts_only(model, nodes, batch, plan):
    megatron, deepspeed = (_predict(model, fw, nodes, batch, plan) for fw in ("megatron", "deepspeed"))
    for part in set(megatron.breakdown) - MOVED:
        assert megatron.breakdown[part] == pytest.approx(deepspeed.breakdown[part], rel=1e-12, abs=1e-15), part
    assert set(megatron.extra["framework_s"]) == set(FRAMEWORK_PARTS)
    named = {k: megatron.extra["framework_s"][k] - deepspeed.extra["framework_s"][k] for k in FRAMEWORK_PARTS}
    moved = sum(megatron.breakdown[k] - deepspeed.breakdown[k] for k in MOVED)
    assert moved == pytest.approx(sum(named.values()), rel=1e-9, abs=1e-9 * megatron.iter_time_s)
    # the fused kernel skips the masked half of causal attention and the s² scores' passes through memory
    assert named["attention"] < 0
    assert megatron.extra["attention_kernel"].startswith("fused")
    assert deepspeed.extra["attention_kernel"].startswith("unfused")


def test_each_framework_on_ampere_says_which_constants_price_it():
    """Megatron-Core has none fitted on Ampere (its recorded ones are Hopper's and Blackwell's): first principles.
    DeepSpeed's host and per-call costs were chosen on vTrain's single-node A100 runs."""
    model, nodes, batch, plan = CASES[0]
    megatron, deepspeed = (_predict(model, fw, nodes, batch, plan) for fw in ("megatron", "deepspeed"))
    assert megatron.extra["constants"].startswith("first principles") and "ampere" in megatron.extra["constants"]
    assert deepspeed.extra["constants"] == "deepspeed constants calibrated on ampere"
    assert megatron.extra["framework_s"]["calls"] == 0 < deepspeed.extra["framework_s"]["calls"]


def test_megatron_deepspeed_softmax_falls_back_where_its_fused_kernel_does_not_apply():
    """Megatron-DeepSpeed's fused scale-mask-softmax needs micro-batch x heads per rank divisible by 4 (and keys
    of at most 2048): a 16-head GPT on tp=8 at micro-batch 1 runs the eager fp32 fallback, whose extra passes over
    the scores and operators make that rank's attention slower than tp=4's with twice the heads, and its host
    issue more operators; at micro-batch 2 the kernel runs again."""
    fallback = DEEPSPEED.softmax_fallback
    assert fallback.fused(np.array([2, 4, 6, 8]), 1024, 1024).tolist() == [False, True, False, True]
    assert not fallback.fused(4, 4096, 4096)
    spec, _ = vtrain_workload({"# GPUs": 8, "tensor parallelism": 8, "hidden size": 1024, "# layers": 12,
                               "attention heads": 16, "sequence length": 1024, "global batch": 16,
                               "data parallelism": 1, "pipeline parallelism": 1, "micro batch": 1})
    graph, device = graph_for(spec.model), get_device("a100-80gb")
    attention = shard_nodes(graph, RankShare.split({"tp": 8}), 16).attention

    def forward(tp: int, mbs: int) -> float:
        return float(layer_times(resolve(spec, device), graph, RankShare.split({"tp": tp}), mbs)[0][attention].sum())

    assert forward(8, 1) > forward(4, 1)  # half the scores, yet slower
    assert forward(8, 2) < forward(4, 2)
    eager = softmax_fallbacks(shard_nodes(graph, RankShare.split({"tp": 8}), 16), 1, False, fallback)
    assert eager.any() and not softmax_fallbacks(shard_nodes(graph, RankShare.split({"tp": 8}), 16), 2, False, fallback).any()
    layouts = {mbs: apply_plan(spec, graph, Plan(tp=8, mbs=mbs, recompute="full"), device) for mbs in (1, 2)}
    host = {mbs: compute_parts(resolve(spec, device), graph, lay, AnalyticalConfig())[2] for mbs, lay in layouts.items()}
    layers = layouts[1].stage_counts @ eager  # the forward host time of each attention layer gains the operators
    assert host[1] == pytest.approx(host[2] + layers * fallback.ops * AnalyticalConfig().host_op_s)
