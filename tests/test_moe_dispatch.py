"""The plan's MoE token dispatcher: priced by its own kernels and links, its buffers counted, written to and read back
from each framework's launch file or refused with the reason."""

from __future__ import annotations

import pytest

from predictor.frameworks import FRAMEWORKS
from predictor.frameworks.base import as_run
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.costs.moe_dispatch import (DEEPEP_TOKEN_EXTRA_BYTES, buffer_bytes, dispatch_facts, exchange_seconds,
                                    fact_for, reach)
from predictor.costs.parallel import apply_plan
from predictor.plan import DISPATCHERS, Plan
from predictor.spec.resolver import get_device, resolve
from predictor.spec.workload import parse_spec
from search_spaces.enumerate import runnable_space
from search_spaces.space import load_space


def _spec(framework: str = "megatron", device: str = "h100", nodes: int = 2):
    return parse_spec({"model": {"preset": "qwen3-30b-a3b", "seq_len": 4096},
                       "training": {"global_batch": 512, "precision": "bf16", "framework": framework},
                       "cluster": {"device": device, "nodes": nodes, "gpus_per_node": 8}})


def _ep_group(spec, ep: int):
    plan = Plan(dp=spec.cluster.gpus, ep=ep, zero=1)
    return apply_plan(spec, graph_for(spec.model), plan, get_device(spec.cluster.device)).groups["ep"]


def test_reach_is_the_chance_a_token_meets_a_rank() -> None:
    assert reach(128, 8, 128) == pytest.approx(1.0)
    assert reach(8, 1, 1) == pytest.approx(1 / 8)
    assert reach(8, 2, 2) == pytest.approx(1 - (6 * 5) / (8 * 7))
    # top-8 of 128 experts over 8 ranks: a token reaches 5.3 ranks on average, not 8 copies
    assert 8 * reach(128, 8, 16) == pytest.approx(5.3, abs=0.1)


def test_flex_dispatchers_send_each_token_once_per_rank_and_domain() -> None:
    spec = _spec()
    group = _ep_group(spec, 16)  # two DGX H100 nodes: the exchange crosses InfiniBand
    pair = 4096 * 8 * 2048 * 2.0
    t = {d: exchange_seconds(d, pair, spec.model, group, "h100", "hopper") for d in DISPATCHERS}
    # NCCL's all-to-all sends every token-expert pair over the NIC; DeepEP and Hybrid-EP a token once per node
    assert t["deepep"] < t["alltoall"] / 2 and t["hybridep"] < t["alltoall"] / 2
    assert t["allgather"] > t["deepep"]  # every token gathered to every rank
    assert exchange_seconds("deepep", pair, spec.model, _ep_group(spec, 1), "h100", "hopper") == 0.0


def test_facts_prefer_the_device_then_its_generation() -> None:
    assert fact_for("hybridep", "nvlink", 32, "gb200", "blackwell").ranks == 32
    assert fact_for("hybridep", "nvlink", 32, "gb300", "blackwell").device == "gb200"
    assert fact_for("deepep", "rdma", 64, "h100", "hopper").ranks == 64
    assert all(0 < f.dispatch_share <= 1.2 and f.source for f in dispatch_facts())


def test_buffers_follow_each_dispatchers_code() -> None:
    spec = _spec(device="b200", nodes=1)
    group = _ep_group(spec, 8)
    h, tokens = spec.model.hidden, 4096
    pairs = 2 * tokens * spec.model.top_k * h * 2.0
    assert buffer_bytes("alltoall", tokens, spec.model, 1, 2, group) == pytest.approx(pairs)
    # DeepEP's NVLink buffer: 10 channels x 8 peers x 256 queued tokens x (hidden bytes + top-k, scales, metadata)
    deepep = 10 * 8 * 256 * (2 * h + DEEPEP_TOKEN_EXTRA_BYTES)
    assert buffer_bytes("deepep", tokens, spec.model, 1, 2, group) == pytest.approx(pairs + deepep)
    # Hybrid-EP: dispatch output and combine input of every rank of the NVLink domain's tokens
    assert buffer_bytes("hybridep", tokens, spec.model, 1, 2, group) == pytest.approx(pairs + 2 * tokens * 8 * h * 2)
    assert buffer_bytes("deepep", tokens, spec.model, 1, 2, _ep_group(spec, 1)) == 0.0


def test_dispatcher_moves_time_and_memory() -> None:
    spec = _spec()
    graph = graph_for(spec.model)
    plans = [Plan(dp=16, ep=16, zero=1, overlap="none", dispatcher=d) for d in DISPATCHERS]
    batch = dict(zip(DISPATCHERS, AnalyticalPredictor().predict(spec, graph, plans)))  # one batch, memo keys apart
    alone = {p.dispatcher: AnalyticalPredictor().predict(spec, graph, [p])[0] for p in plans}
    assert batch["deepep"].iter_time_s < batch["alltoall"].iter_time_s
    assert batch["deepep"].peak_memory_gib > batch["alltoall"].peak_memory_gib
    for d in DISPATCHERS:
        assert (batch[d].iter_time_s, batch[d].peak_memory_gib) == (alone[d].iter_time_s, alone[d].peak_memory_gib)


@pytest.mark.parametrize("framework", ["megatron", "torchtitan"])
@pytest.mark.parametrize("dispatcher", DISPATCHERS)
def test_launch_files_write_and_read_back_the_dispatcher(framework, dispatcher) -> None:
    spec = _spec(framework)
    fw = FRAMEWORKS[framework]
    plan = Plan(dp=16, ep=8, zero=1 if framework == "megatron" else 3, dispatcher=dispatcher)
    errors = fw.errors(plan, spec)
    if framework == "torchtitan" and dispatcher in ("allgather", "hybridep"):
        assert any(f"dispatcher={dispatcher}" in e and "expert_parallel_comm_backend" in e for e in errors)
        assert dispatcher not in runnable_space(load_space("full").model_copy(
            update={"dispatcher": list(DISPATCHERS)}), fw).dispatcher
        return
    assert not errors
    text = next(iter(fw.launch.write(as_run(plan, fw, spec), resolve(spec)).values()))
    assert fw.launch.read(text, spec).dispatcher == dispatcher


def test_deepspeed_refuses_other_dispatchers_with_the_reason() -> None:
    errors = FRAMEWORKS["deepspeed"].option_errors(Plan(dp=16, ep=8, dispatcher="deepep"))
    assert errors and "_AllToAll" in errors[0] and "dispatcher=alltoall" in errors[0]


def test_no_experts_sharded_means_the_default_dispatcher() -> None:
    fw = FRAMEWORKS["megatron"]
    assert as_run(Plan(dp=16, dispatcher="hybridep"), fw, _spec()).dispatcher == DISPATCHERS[0]


def test_routing_imbalance_is_a_workload_setting() -> None:
    balanced = _spec()
    skewed = balanced.model_copy(update={"training": balanced.training.model_copy(update={"moe_imbalance": 1.5})})
    graph = graph_for(balanced.model)
    plan = Plan(dp=16, ep=16, zero=1, overlap="none", dispatcher="deepep")
    even, busy = (AnalyticalPredictor().predict(s, graph, [plan])[0] for s in (balanced, skewed))
    assert busy.iter_time_s > even.iter_time_s * 1.1  # the busiest rank's experts and exchange set the pace
    assert busy.peak_memory_gib > even.peak_memory_gib
    # the busiest rank's experts keep imbalance times the balanced share of their saved inputs, as its buffers do
    for part in ("activations", "buffers"):
        assert busy.memory_breakdown[part] > even.memory_breakdown[part]
    assert busy.memory_breakdown["optimizer"] == even.memory_breakdown["optimizer"]
    with pytest.raises(ValueError, match="moe_imbalance"):
        parse_spec({"model": {"preset": "qwen3-30b-a3b"}, "training": {"global_batch": 8, "moe_imbalance": 0.5},
                    "cluster": {"device": "h100"}})


def test_why_it_does_not_fit_names_the_dispatchers_buffers() -> None:
    from orchestrator.search.levers import fixes
    spec = _spec()
    plan = Plan(dp=16, ep=16, zero=1, dispatcher="hybridep")
    named = dict(fixes(plan, spec))
    assert named["dispatcher=alltoall"].dispatcher == "alltoall"
    assert "dispatcher=alltoall" not in dict(fixes(plan.with_(dispatcher="alltoall"), spec))
