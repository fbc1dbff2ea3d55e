"""Mixtures of experts and expert parallelism: parameter counts, the all-to-all, expert memory, ep's rules,
the search over ep, and `scaledl predict` / `scaledl plan` on a small MoE."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.cli import main
from predictor.costs.comm import Group, Link
from predictor.spec.resolver import get_device

from predictor.costs.moe import active_params, alltoall, expert_params
from predictor.costs.parallel import apply_plan
from predictor.graph.cache import graph_for
from predictor.graph.modelzoo import build_model, param_count
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.roofline import AnalyticalConfig
from predictor.plan import Plan, plan_errors
from predictor.spec.presets import MODEL_PRESETS
from predictor.spec.resolver import resolve
from predictor.spec.workload import ModelSpec, SpecError, parse_spec
from search_spaces import enumerate_plans, load_space

# Total and active parameters the models' publishers give (billions): Mistral's Mixtral posts, Qwen3's model
# cards, OpenAI's gpt-oss model card (active without the embedding), the DeepSeek-V3 report (671B, 37B active).
PUBLISHED = {"mixtral-8x7b": (46.7, 12.9), "mixtral-8x22b": (141, 39), "qwen3-30b-a3b": (30.5, 3.3),
             "qwen3-235b-a22b": (235, 22), "gpt-oss-120b": (116.8, 5.7), "deepseek-v3": (671, 37)}
MOE_PRESETS = [name for name, p in MODEL_PRESETS.items() if "experts" in p and name in PUBLISHED]  # grok-1: test_any_architecture
SMALL_MOE = {"family": "qwen3_moe", "hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "seq_len": 128,
             "vocab": 1024, "experts": 8, "top_k": 2, "expert_ffn": 128}
SMALL_DSV3 = {"family": "deepseek_v3", "hidden": 256, "layers": 3, "heads": 4, "kv_heads": 4, "seq_len": 64,
              "vocab": 1000, "experts": 8, "top_k": 2, "expert_ffn": 128, "shared_experts": 1, "dense_layers": 1,
              "q_lora_rank": 64, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32}


def _spec(model: dict, gpus: int = 8, global_batch: int = 64, device: str = "h100", **training) -> object:
    return parse_spec({"model": model, "training": {"global_batch": global_batch, "framework": "megatron", **training},
                       "cluster": {"device": device, "nodes": max(gpus // 8, 1), "gpus_per_node": min(gpus, 8)}})


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_every_moe_preset_counts_the_built_models_parameters(name: str) -> None:
    model = ModelSpec(preset=name)
    total = param_count(build_model(model))  # the transformers model on the meta device
    published_total, published_active = PUBLISHED[name]
    assert total / 1e9 == pytest.approx(published_total, rel=0.01)
    assert active_params(total, model) / 1e9 == pytest.approx(published_active, rel=0.05)
    # the routed experts are what ep shards: E · (3·h·f) per MoE layer (GPT-OSS with biases)
    assert expert_params(model) < total


@pytest.mark.parametrize("model", [SMALL_MOE, SMALL_DSV3], ids=["qwen3_moe", "deepseek_v3"])
def test_graph_holds_every_parameter_and_the_active_flops(model: dict) -> None:
    spec = ModelSpec(**model)
    graph = graph_for(spec)
    assert graph.params == param_count(build_model(spec))
    experts = [n for n in graph.nodes if n.kind == "experts"]
    assert experts and all(n.tp == "experts" for n in experts)
    assert sum(n.count for n in experts) == spec.layers - spec.dense_layers
    # grouped GEMMs on the active experts only: 2 · tokens·top_k · hidden · 3 · expert_ffn forward FLOPs
    assert experts[0].fwd_flops == 2 * spec.seq_len * spec.top_k * spec.hidden * 3 * spec.expert_ffn
    assert [n.kind for n in graph.nodes].count("router") == 1


def test_all_to_all_against_its_closed_form() -> None:
    nvlink, ib = Link(450e9, 5e-6), Link(50e9, 10e-6)
    size = 64e6
    inside = Group(8, 1, nvlink, ib)
    assert alltoall(size, inside) == pytest.approx(size * 7 / 8 / 450e9 + 7 * 5e-6)
    across = Group(8, 4, nvlink, ib)  # ep=32 over 4 nodes: 24/32 of the bytes leave the node
    assert alltoall(size, across) == pytest.approx(max(size * 7 / 32 / 450e9 + 7 * 5e-6, size * 24 / 32 / 50e9 + 10e-6))
    assert alltoall(size, Group(1, 1, nvlink, ib)) == 0.0


def test_ep_comm_is_four_all_to_alls_per_moe_layer_and_micro_batch() -> None:
    spec = _spec(SMALL_MOE)
    graph = graph_for(spec.model)
    plan = Plan(dp=8, mbs=2, zero=1, ep=4, overlap="dp+param")
    pred = AnalyticalPredictor(AnalyticalConfig()).predict(spec, graph, [plan])[0]
    lay = apply_plan(spec, graph, plan, get_device("h100"))
    assert lay.groups["ep"].size == 4 and lay.groups["edp"].size == 2
    m = spec.model
    one = alltoall(m.seq_len * plan.mbs * m.top_k * m.hidden * 2, lay.groups["ep"])  # bf16 token-expert pairs
    assert pred.breakdown["ep_comm"] == pytest.approx(4 * m.layers * one * plan.microbatches(64), rel=1e-6)
    hidden = AnalyticalPredictor(AnalyticalConfig()).predict(spec, graph, [plan.with_(overlap="dp+param+ep")])[0]
    assert hidden.breakdown["ep_comm"] < pred.breakdown["ep_comm"] and hidden.hidden_comm["ep_comm"] > 0


def test_expert_states_are_divided_by_ep_and_sharded_over_expert_data_parallel() -> None:
    spec = _spec(SMALL_MOE)
    graph = graph_for(spec.model)
    model = AnalyticalPredictor(AnalyticalConfig())
    experts = expert_params(spec.model)
    dense = graph.params - experts
    gib = 2**30
    for ep in (1, 2, 8):
        pred = model.predict(spec, graph, [Plan(dp=8, zero=1, ep=ep)])[0]
        assert pred.memory_breakdown["weights"] == pytest.approx((dense + experts / ep) * 2 / gib)
        # the distributed optimizer shards dense states over dp=8, expert states over the 8/ep expert-dp ranks
        assert pred.memory_breakdown["optimizer"] == pytest.approx((dense / 8 + experts / ep / (8 / ep)) * 12 / gib)
    balanced, skewed = (AnalyticalPredictor(AnalyticalConfig(moe_imbalance=f)).predict(
        spec, graph, [Plan(dp=8, zero=1, ep=2)])[0].memory_breakdown["buffers"] for f in (1.0, 2.0))
    m = spec.model
    # the dispatch send and receive buffers: 2 · tokens·top_k·hidden bf16 elements, times the imbalance
    assert (skewed - balanced) * gib == pytest.approx(2 * m.seq_len * m.top_k * m.hidden * 2)


def test_ep_rules() -> None:
    spec = _spec(SMALL_MOE)
    assert Plan(dp=8, tp=2, pp=8, cp=1, ep=32).gpus == 128  # ep multiplies into no GPU count (Megatron-Core)
    assert plan_errors(Plan(dp=8, ep=8), spec) == []
    assert any("does not divide experts=8" in e for e in plan_errors(Plan(dp=8, ep=16), spec))
    assert "ep=4 does not divide the 2 ranks of a pipeline stage (tp=1, cp=1, dp=2) that the expert layers regroup" \
        in plan_errors(Plan(dp=2, pp=4, ep=4), spec)
    dense = _spec({"preset": "llama3-8b"})
    assert any("the model has none" in e for e in plan_errors(Plan(dp=8, ep=2), dense))
    assert any("sequence parallelism" in e for e in resolve(spec).framework.errors(Plan(dp=4, tp=2, ep=4), spec))
    assert resolve(spec).framework.errors(Plan(dp=4, tp=2, sp=True, ep=8), spec) == []  # ep over dp·tp ranks
    deepspeed = _spec(SMALL_MOE, framework="deepspeed")
    assert any("has no expert parallelism (ep=2)" in e for e in resolve(deepspeed).framework.errors(Plan(dp=8, ep=2), deepspeed))


def test_plan_string_writes_ep_only_when_it_is_not_one() -> None:
    assert "ep=" not in str(Plan(dp=8))
    plan = Plan.parse("dp=8,tp=2,pp=8,mbs=1,ep=32")
    assert plan.ep == 32 and str(plan).endswith(",ep=32") and Plan.parse(str(plan)) == plan


def test_moe_spec_needs_experts_and_top_k() -> None:
    with pytest.raises(SpecError, match="experts and top_k"):
        parse_spec({"model": {k: v for k, v in SMALL_MOE.items() if k != "top_k"}, "training": {"global_batch": 8},
                    "cluster": {"device": "h100"}})


def test_full_space_enumerates_ep_among_the_divisors_of_the_stage_ranks_and_the_experts() -> None:
    spec = _spec(SMALL_MOE, gpus=8, global_batch=16)
    space = load_space("full").model_copy(update={"recompute": ["none"], "overlap": ["auto"], "zero": [1],
                                                   "schedule": ["1f1b"], "placement": ["tp-dp-pp"], "max_mbs": 1})
    plans = enumerate_plans(spec, space).plans
    eps = {(p.dp * p.tp * p.cp, p.ep) for p in plans}
    assert {ep for _, ep in eps} == {1, 2, 4, 8}
    assert all(ranks % ep == 0 and 8 % ep == 0 for ranks, ep in eps)
    default = enumerate_plans(spec, load_space("megatron-3d")).plans
    assert {p.ep for p in default} == {1}  # a space that names no ep keeps ep=1


def _small_spec_file(tmp_path: Path, **search: object) -> str:
    data = {"model": SMALL_MOE, "training": {"global_batch": 16, "precision": "bf16"},
            "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}}
    if search:
        data["search"] = search
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_scaledl_predict_a_small_moe(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["predict", _small_spec_file(tmp_path), "--plan", "dp=8,mbs=2,zero=1,ep=4", "--plan", "dp=8,ep=3",
                 "--json", "--predictor", "analytical"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out[0]["plan"].endswith("ep=4") and out[0]["breakdown"]["ep_comm"] >= 0
    assert "does not divide experts=8" in out[1]["error"]


@pytest.mark.slow
def test_scaledl_plan_a_small_moe_searches_ep(scaledl, tmp_path: Path) -> None:
    spec = _small_spec_file(tmp_path, recompute=["none"], zero=[1], max_mbs=2)
    run = scaledl.run("plan", spec, "--out", str(tmp_path / "out"), "--space", "full", "--predictor", "analytical",
                      "--top-k", "3")
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert all(r["fields"]["ep"] in (1, 2, 4, 8) for r in report["ranked"])
    assert "--expert-model-parallel-size" in (tmp_path / "out" / "launch" / "megatron_args.txt").read_text()


def test_imbalance_stretches_the_experts() -> None:
    spec = _spec(SMALL_MOE)
    graph = graph_for(spec.model)
    plan = Plan(dp=8, mbs=2, zero=1, ep=4)
    balanced, skewed = (AnalyticalPredictor(AnalyticalConfig(moe_imbalance=f)).predict(spec, graph, [plan])[0]
                        for f in (1.0, 1.5))
    # a model this small is host-bound: the kernels' own time shows the busiest rank's longer experts
    assert skewed.extra["kernel_compute_s"] > balanced.extra["kernel_compute_s"]
    assert skewed.peak_memory_gib > balanced.peak_memory_gib
    assert np.isfinite(skewed.iter_time_s)
