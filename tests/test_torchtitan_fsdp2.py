"""torchtitan's FSDP2 and async TP as their code runs them: the units `apply_fsdp` wraps (tok_embeddings, each block,
[norm, output]), the FP32 gradient reduce-scatter, the float8 all-gather, the copies around the collectives, the
"default" reshard policy in the launch file, and the share of the tensor-parallel traffic PyTorch's micro-pipeline TP
leaves exposed (pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py, pytorch/pytorch
torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py and torch/_inductor/fx_passes/micro_pipeline_tp.py)."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest

from predictor.costs import comm
from predictor.costs.parallel import apply_plan
from predictor.frameworks import FRAMEWORKS, as_run
from predictor.frameworks.launch import launch_files
from predictor.frameworks.torchtitan import TOML_FILE
from predictor.graph.cache import graph_for
from predictor.models import fsdp2
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import WorkloadSpec, parse_spec

TITAN = FRAMEWORKS["torchtitan"]


def _spec(precision: str = "bf16", framework: str = "torchtitan", nodes: int = 1, batch: int = 8) -> WorkloadSpec:
    return parse_spec({"model": {"preset": "llama3.1-8b", "seq_len": 8192},
                       "training": {"global_batch": batch, "precision": precision, "framework": framework,
                                    "compile": True},
                       "cluster": {"device": "h100", "nodes": nodes}})


def _layout(spec: WorkloadSpec, plan: Plan):
    return apply_plan(spec, graph_for(spec.model), plan, resolve(spec).device)


def test_the_units_are_the_embeddings_each_block_and_norm_with_output() -> None:
    spec = _spec()
    m = spec.model
    lay = _layout(spec, Plan(dp=8, mbs=1, zero=3))
    psi = lay.stage_counts @ lay.nodes.params
    u = fsdp2.units(lay, psi, float8_gather=False)
    assert u.embedding[0] == m.vocab * m.hidden
    assert u.output[0] == m.vocab * m.hidden + m.hidden  # the output layer and the final norm
    assert u.blocks[0] == m.num_blocks
    assert u.block[0] * m.num_blocks + u.embedding[0] + u.output[0] == pytest.approx(psi[0])
    assert u.float8_share[0] == 0.0


def test_gradients_reduce_in_fp32_and_float8_weights_gather_in_one_byte() -> None:
    lay = _layout(_spec(), Plan(dp=8, mbs=1, zero=2))
    psi = lay.stage_counts @ lay.nodes.params
    g = lay.sync_group
    grad, param, *_ = fsdp2.grad_sync_time(lay, psi, 1, 0.0, g, float8_gather=False, bandwidth=1e12)
    u = fsdp2.units(lay, psi, float8_gather=False)
    assert grad == pytest.approx(float(u.blocks[0] * comm.reduce_scatter(u.block[0] * 4, g)
                                       + comm.reduce_scatter(u.embedding[0] * 4, g)
                                       + comm.reduce_scatter(u.output[0] * 4, g)))
    low = fsdp2.units(lay, psi, float8_gather=True)
    assert 0.9 < low.float8_share[0] < 1.0  # the blocks' linears, not their norms
    _, param_fp8, *_ = fsdp2.grad_sync_time(lay, psi, 1, 0.0, g, float8_gather=True, bandwidth=1e12)
    assert param_fp8 < 0.75 * param
    assert fsdp2.float8_gathers("current", Plan(dp=8, mbs=1, zero=3))
    assert not fsdp2.float8_gathers("rowwise", Plan(dp=8, mbs=1, zero=3))


def test_the_default_policy_keeps_norm_and_output_gathered_for_backward_and_the_copies_are_priced() -> None:
    lay = _layout(_spec(), Plan(dp=8, mbs=1, zero=3))
    psi = lay.stage_counts @ lay.nodes.params
    _, param, _, grad_calls, gather_calls, grad_edge, gather_edge, copies = fsdp2.grad_sync_time(
        lay, psi, 1, 0.0, lay.sync_group, float8_gather=False, bandwidth=1e12)
    units = 32 + 2
    assert grad_calls == units and gather_calls == 2 * units - 1
    u = fsdp2.units(lay, psi, float8_gather=False)
    first = comm.allgather(u.embedding[0] * 2, lay.sync_group)
    assert gather_edge == pytest.approx(float(first) / 2)  # forward's embeddings; backward starts on gathered output
    assert grad_edge == pytest.approx(float(comm.reduce_scatter(u.embedding[0] * 4, lay.sync_group)))
    gathered = (2 * psi[0] - u.output[0]) * 2  # bf16 bytes, forward and backward
    assert copies == pytest.approx((2 * gathered + 6 * psi[0]) / 1e12)
    pipelined = _layout(_spec(nodes=2, batch=16), Plan(dp=8, pp=2, mbs=1, zero=3))
    assert fsdp2.reshards_output(pipelined.plan)


def test_a_torchtitan_prediction_pays_the_copies_and_fsdp2_only_prices_torchtitan() -> None:
    plan = Plan(dp=8, mbs=1, zero=3, recompute="selective")
    spec = _spec()
    graph = graph_for(spec.model)
    titan = AnalyticalPredictor().predict(spec, graph, [plan])[0]
    pieces = AnalyticalPredictor().pieces(spec, graph)
    assert pieces.fsdp2_units(plan) and not pieces.fsdp2_units(plan.with_(zero=0))
    megatron = AnalyticalPredictor().pieces(_spec(framework="megatron"), graph)
    assert not megatron.fsdp2_units(plan)
    assert titan.breakdown["dp_comm"] > 0.0


@pytest.mark.parametrize("plan, policy", [
    (Plan(dp=8, mbs=1, zero=3), "default"), (Plan(dp=8, mbs=1, zero=2), "never"),
    (Plan(dp=4, pp=2, mbs=1, zero=3), "always")])
def test_the_reshard_policy_is_written_and_read_back(plan: Plan, policy: str) -> None:
    spec = _spec(nodes=1, batch=8)
    written = launch_files(plan, resolve(spec))[TOML_FILE]
    assert tomllib.loads(written)["parallelism"]["fsdp_reshard_after_forward"] == policy
    assert TITAN.launch.read(written, spec).zero == plan.zero


@pytest.mark.parametrize("recompute, share", [("none", (2 + 2 / 8) / 8), ("selective", (2 + 2 / 8) / 10),
                                              ("full", (2 + 4 / 8) / 12)])
def test_async_tp_leaves_the_unfused_reduce_scatters_exposed(recompute: str, share: float) -> None:
    spec = _spec("fp8", nodes=8, batch=96)
    plan = as_run(Plan(dp=8, tp=8, sp=True, mbs=12, zero=3, recompute=recompute, overlap="dp+param+tp"), TITAN, spec)
    assert TITAN.exposed_shares["tp_comm"](plan) == pytest.approx(share)
    graph = graph_for(spec.model)
    hidden = AnalyticalPredictor().predict(spec, graph, [plan])[0]
    exposed = AnalyticalPredictor().predict(spec, graph, [plan.with_(overlap="dp+param")])[0]
    total = exposed.breakdown["tp_comm"]
    assert hidden.breakdown["tp_comm"] == pytest.approx(share * total, rel=1e-6)
    assert np.isclose(hidden.breakdown["tp_comm"] + hidden.hidden_comm["tp_comm"], total)
