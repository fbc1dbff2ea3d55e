"""A mixture of experts' permutation and router kernels (`training.kernels.moe_permute_fusion`, `moe_router_fusion`):
each framework's defaults and refusals, what the unfused operators cost over Transformer Engine's fused kernels, and
the round trip through Megatron-LM's arguments."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.costs.parallel import apply_plan
from predictor.frameworks import FRAMEWORKS
from predictor.frameworks.kernels import Kernels, kernels_of
from predictor.frameworks.launch import kernels_back, launch_files
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.moe_kernels import moe_kernel_costs
from predictor.plan import Plan
from predictor.spec.resolver import get_device, resolve
from predictor.spec.workload import SpecError, parse_spec

PLAN = Plan(dp=8, ep=8, zero=1)


def _spec(kernels: dict | None = None, framework: str = "megatron"):
    training = {"global_batch": 64, "precision": "bf16", "framework": framework,
                **({"kernels": kernels} if kernels is not None else {})}
    return parse_spec({"model": {"preset": "qwen3-30b-a3b", "seq_len": 4096}, "training": training,
                       "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}})


def _nodes(spec, plan: Plan = PLAN):
    return apply_plan(spec, graph_for(spec.model), plan, get_device(spec.cluster.device)).nodes


def _predict(spec, plan: Plan = PLAN):
    return AnalyticalPredictor().predict(spec, graph_for(spec.model), [plan])[0]


def test_megatron_fuses_the_permutations_and_not_the_router_as_the_bridge_recipes_run():
    megatron = FRAMEWORKS["megatron"].kernels.default("hopper")
    assert megatron.moe_permute_fusion and not megatron.moe_router_fusion
    # both are Transformer Engine's kernels: without it they are off, and asking for them is refused
    assert not kernels_of(_spec({"transformer_engine": False}), FRAMEWORKS["megatron"].kernels, "hopper").moe_permute_fusion
    with pytest.raises(SpecError, match="moe_permute_fusion=true: the fused MoE kernels are Transformer Engine's"):
        resolve(_spec({"transformer_engine": False, "moe_permute_fusion": True}))


@pytest.mark.parametrize("framework, words", [("torchtitan", "permutes MoE tokens with PyTorch operators"),
                                              ("deepspeed", "dispatches tokens by its gating's einsum")])
def test_frameworks_without_the_fused_kernels_refuse_them(framework, words):
    with pytest.raises(SpecError, match="training.kernels.moe_permute_fusion") as err:
        resolve(_spec({"moe_permute_fusion": True}, framework))
    assert words in str(err.value)


def test_unfused_operators_cost_what_they_add_over_the_fused_kernels():
    spec = _spec()
    nodes = _nodes(spec)
    experts, routers = np.asarray(nodes.experts), np.asarray(nodes.kind) == "router"

    def costs(kernels: Kernels, dispatcher: str = "alltoall"):
        return moe_kernel_costs(nodes, 1, 8, kernels, dispatcher, 2.0, 3.0e12, 3e-6)

    fused_s, fused_ops = costs(Kernels(moe_permute_fusion=True, moe_router_fusion=True))
    assert not fused_s.any() and not fused_ops.any()
    permute_s, permute_ops = costs(Kernels(moe_permute_fusion=False, moe_router_fusion=True))
    assert (permute_s[experts] > 0).all() and not permute_s[~experts].any() and (permute_ops[experts] > 0).all()
    # the alltoall dispatcher also sorts its chunks by local expert, twice, each unfused a split and a cat
    assert (costs(Kernels(moe_router_fusion=True), "deepep")[1][experts] == permute_ops[experts] - 2).all()
    router_s, router_ops = costs(Kernels(moe_permute_fusion=True, moe_router_fusion=False))
    assert (router_s[routers] > 0).all() and not router_s[~routers].any() and (router_ops[routers] >= 9).all()


def test_the_fused_kernels_make_the_step_faster():
    fast = _predict(_spec({"moe_permute_fusion": True, "moe_router_fusion": True}))
    default = _predict(_spec())
    slow = _predict(_spec({"moe_permute_fusion": False}))
    assert fast.iter_time_s < default.iter_time_s < slow.iter_time_s
    assert slow.extra["framework_s"]["host"] >= default.extra["framework_s"]["host"]


@pytest.mark.parametrize("kernels", [{}, {"moe_permute_fusion": False, "moe_router_fusion": True}])
def test_megatron_writes_and_reads_back_the_fusions(tmp_path, kernels):
    spec = _spec(kernels)
    files = launch_files(PLAN, resolve(spec))
    args = files["megatron_args.txt"].split("\n")
    want = kernels_of(spec, FRAMEWORKS["megatron"].kernels, "hopper")
    assert ("--moe-permute-fusion" in args) == want.moe_permute_fusion
    assert ("--moe-router-fusion" in args) == want.moe_router_fusion
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    got = kernels_back(tmp_path / "megatron_args.txt")
    assert (got["moe_permute_fusion"], got["moe_router_fusion"]) == (want.moe_permute_fusion, want.moe_router_fusion)
