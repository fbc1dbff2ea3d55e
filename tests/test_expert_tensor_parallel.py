"""Expert tensor parallelism (the plan's `etp`): each routed expert split over etp ranks inside the ep groups, its
token all-gathers and reduce-scatters priced, the expert states divided by ep·etp, written to and read back from
Megatron-LM's and torchtitan's launch files, and refused with the reason where a framework lacks it."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.costs.parallel import apply_plan, shard_nodes
from predictor.frameworks import FRAMEWORKS
from predictor.frameworks.base import as_run
from predictor.frameworks.launch import launch_files, read_back
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan, plan_errors
from predictor.plan.share import RankShare
from predictor.spec.resolver import get_device, resolve
from predictor.spec.workload import parse_spec


def _spec(preset: str = "qwen3-30b-a3b", framework: str = "megatron", nodes: int = 2):
    return parse_spec({"model": {"preset": preset, "seq_len": 4096},
                       "training": {"global_batch": 256, "precision": "bf16", "framework": framework},
                       "cluster": {"device": "h100", "nodes": nodes, "gpus_per_node": 8}})


def _layout(spec, plan: Plan):
    return apply_plan(spec, graph_for(spec.model), plan, get_device(spec.cluster.device))


def test_each_rank_holds_a_share_of_every_local_expert_over_the_gathered_tokens():
    spec = _spec()
    graph = graph_for(spec.model)
    one, two = shard_nodes(graph, RankShare.split({"ep": 8})), shard_nodes(graph, RankShare.split({"ep": 8, "etp": 2}))
    experts = one.experts
    assert np.allclose(two.params[experts], one.params[experts] / 2)
    assert np.allclose(two.gemm_m[experts], 2 * one.gemm_m[experts])  # the etp ranks' tokens
    assert np.allclose(two.gemm_n[experts], one.gemm_n[experts] / 2)  # half of each expert's FFN
    assert np.allclose(two.fwd_flops, one.fwd_flops) and np.allclose(two.gemm_batch, one.gemm_batch)


def test_groups_nest_etp_inside_ep_as_megatron_core_builds_them():
    spec = _spec()
    lay = _layout(spec, Plan(dp=16, ep=8, etp=2, zero=1))
    etp, ep, edp = lay.groups["etp"], lay.groups["ep"], lay.groups["edp"]
    assert (etp.size, etp.n_inter) == (2, 1)  # two neighbouring ranks
    assert (ep.size, ep.n_intra, ep.n_inter) == (8, 4, 2)  # every other rank of 16: over both nodes
    assert edp.size == 16 // (8 * 2)


def test_its_exchanges_are_priced_and_the_expert_states_shrink():
    spec = _spec()
    plain, split = AnalyticalPredictor().predict(spec, graph_for(spec.model), [
        Plan(dp=16, ep=8, zero=1, overlap="none"), Plan(dp=16, ep=8, etp=2, zero=1, overlap="none")])
    assert plain.breakdown["etp_comm"] == 0 < split.breakdown["etp_comm"]
    assert split.memory_breakdown["weights"] < plain.memory_breakdown["weights"]


@pytest.mark.parametrize("plan, words", [
    ("dp=16,ep=16,etp=2,zero=1", "ep*etp = 16*2 does not divide the 16 ranks"),
    ("dp=16,ep=8,etp=32,zero=1", "does not divide the 16 ranks"),
])
def test_rules(plan, words):
    assert any(words in e for e in plan_errors(Plan.parse(plan), _spec()))


def test_a_dense_model_has_no_experts_to_split():
    spec = parse_spec({"model": {"preset": "llama3-8b"}, "training": {"global_batch": 64},
                       "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}})
    assert any("etp=2 splits routed experts, but the model has none" in e
               for e in plan_errors(Plan.parse("dp=8,etp=2"), spec))


def test_megatron_writes_and_reads_it_back_and_refuses_what_megatron_core_refuses(tmp_path):
    spec = _spec()
    plan = Plan.parse("dp=8,tp=2,sp=true,ep=4,etp=2,zero=1")
    resolved = resolve(spec)
    files = launch_files(plan, resolved)
    args = files["megatron_args.txt"].split("\n")
    assert "--expert-tensor-parallel-size 2" in args
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert read_back(tmp_path / "megatron_args.txt", spec) == as_run(plan, FRAMEWORKS["megatron"], spec)
    # one etp rank unless asked: unset, Megatron-Core would take tp (parallel_state)
    assert "--expert-tensor-parallel-size 1" in launch_files(Plan.parse("dp=8,tp=2,sp=true,ep=8,zero=1"),
                                                             resolved)["megatron_args.txt"].split("\n")
    megatron = FRAMEWORKS["megatron"]
    oss = _spec("gpt-oss-120b", nodes=8)
    assert any("Bias in Moe is only supported when ETP==1" in e
               for e in megatron.errors(Plan.parse("dp=64,ep=8,etp=2,zero=1"), oss))
    # outside the pp-last order the experts' data-parallel size must be the dense layers': ep*etp = tp*cp
    piped = Plan.parse("dp=4,tp=2,pp=2,sp=true,etp=2,zero=1,placement=tp-pp-dp")
    assert not [e for e in megatron.errors(piped, spec) if "ep*etp = tp*cp" in e]
    assert any("ep*etp = tp*cp" in e for e in megatron.errors(piped.with_(ep=2), spec))


def test_torchtitan_runs_etp_1_or_tp_and_deepspeed_none(tmp_path):
    spec = _spec(framework="torchtitan")
    titan = FRAMEWORKS["torchtitan"]
    same = Plan.parse("dp=8,tp=2,sp=true,ep=4,etp=2,zero=3")
    assert not titan.errors(same, spec)
    assert any("ETP=TP or ETP=1" in e for e in titan.errors(Plan.parse("dp=4,tp=4,sp=true,ep=4,etp=2,zero=3"), spec))
    files = launch_files(same, resolve(spec))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    first = tmp_path / next(iter(files))
    assert "expert_tensor_parallel_degree = 2" in first.read_text()
    assert read_back(first, spec).etp == 2
    deepspeed = _spec(framework="deepspeed")
    assert any("etp" in e for e in FRAMEWORKS["deepspeed"].errors(Plan.parse("dp=16,etp=2,zero=1"), deepspeed))


def test_fc1_keeps_the_gathered_tokens():
    from predictor.memory.saved import Dims, moe_mlp_tensors

    spec = _spec()
    saved = [{s.name: s.per_token for s in moe_mlp_tensors(Dims.of(spec.model, RankShare.split({"etp": etp}), "bf16"))}
             for etp in (1, 2)]
    assert saved[1]["expert fc1 input (permuted tokens)"] == 2 * saved[0]["expert fc1 input (permuted tokens)"]
    assert saved[1]["expert activation input"] == saved[0]["expert activation input"]
