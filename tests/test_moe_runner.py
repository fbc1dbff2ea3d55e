"""A small mixture of experts trained for real on CPU with expert parallelism (gloo, one process per rank).

ep=2 over dp=2 must train the model the dp=2 run trains (the same balanced routing, the same batch slices):
equal losses at every Adam step, each rank holding half of every experts module's experts."""

from __future__ import annotations

import pytest

from predictor.measure.compose import unsupported
from predictor.measure.iteration import WorkerPool
from predictor.plan import Plan
from predictor.spec.workload import ModelSpec
from tests.composed_runs import PARITY_RTOL, run

SPEC = ModelSpec(family="qwen3_moe", hidden=64, layers=2, heads=4, kv_heads=2, seq_len=32, vocab=256, experts=4,
                 top_k=2, expert_ffn=32)


@pytest.mark.slow
def test_expert_parallel_training_matches_data_parallel() -> None:
    with WorkerPool(world=2, threads=1) as pool:
        dp = run(pool, SPEC, "dp=2,mbs=4")
        ep = run(pool, SPEC, "dp=2,mbs=4,ep=2")
    assert ep[0]["losses"] == pytest.approx(dp[0]["losses"], rel=PARITY_RTOL)
    assert all(a["median"] > 0 for a in ep)
    for rank in ep:
        experts = {k: v for k, v in rank["shards"].items() if k.endswith(("gate_up_proj", "down_proj"))
                   and ".experts." in k}
        assert experts and all(local * 2 == whole for local, whole, _ in experts.values())


def test_runner_refuses_the_expert_parallelism_it_does_not_run() -> None:
    assert unsupported(Plan.parse("dp=2,ep=2"), SPEC) == ""
    assert "ep = dp" in unsupported(Plan.parse("dp=4,ep=2"), SPEC)
    assert "zero=0" in unsupported(Plan.parse("dp=2,zero=1,ep=2"), SPEC)


def test_per_layer_times_include_the_experts() -> None:
    import torch

    from predictor.measure.layers import time_layers

    rows = {r["node"]: r for r in time_layers(SPEC, 2, torch.device("cpu"), repeats=1, warmup=0)}
    experts = rows["model.layers.0.mlp.experts"]
    assert experts["kind"] == "experts" and experts["fwd_s"] > 0 and experts["bwd_s"] > 0
    assert "model.layers.0.mlp.experts.act_fn" not in rows  # timed inside its experts module
