"""The composed runner runs the exact plan: numerics parity with one process, the shards the plan says, and
one table of tensor-parallel roles for the graph, the sharding model and the runner.

Every plan kind trains a tiny model for real (gloo, one process per rank) from the same seed and data as a
single process; its losses must match the single process's at every step (Adam, so a wrong gradient shows
from the second step on), as torchtitan tests its parallelisms. The ranks' shards are checked against the
plan: tp splits by the role table, pp holds its chunks' blocks, ZeRO-1/3 shard the optimizer state and
the weights. Dropout is off: its random masks differ between a shard and the whole.
"""

from __future__ import annotations

from functools import cache

import pytest

from predictor.graph.cache import graph_for
from predictor.graph.modelzoo import build_model
from predictor.graph.tp_roles import in_block, linear_role
from predictor.measure.compose import unsupported
from predictor.measure.iteration import WorkerPool
from predictor.measure.parallelize import tp_roles
from predictor.plan import Plan
from predictor.spec.workload import ModelSpec
from tests.composed_runs import assert_parity, run, tiny

@pytest.fixture(scope="module")
def pool():
    with WorkerPool(world=2, threads=1) as p:
        yield p


@pytest.fixture(scope="module")
def single(pool):
    """The single-process losses of each family (computed once)."""
    return cache(lambda family: run(pool, tiny(family), "dp=1,mbs=8")[0]["losses"])


def assert_plan_shards(plan: Plan, answers: list[dict]) -> None:
    """Each rank holds what the plan gives it: its pipeline chunks' blocks, tp splits, ZeRO-3 shards."""
    for a in answers:
        blocks = {int(n.split(".")[2]) for n in a["shards"] if n.startswith("model.layers.")}
        per_chunk = 4 // (plan.pp * plan.v)
        assert blocks == {i * per_chunk + b for i in a["chunks"] for b in range(per_chunk)}
        for name, (local, whole, tp_dim) in a["shards"].items():  # FSDP2 (ZeRO-2/3) keeps weights sharded at rest
            split = (plan.tp if tp_dim >= 0 else 1) * (plan.dp if plan.zero >= 2 else 1)
            assert local == -(-whole // split) or (plan.zero >= 2 and local <= -(-whole // split)), name
        if plan.tp > 1:
            dims = {n.split(".", 3)[3]: d for n, (_, _, d) in a["shards"].items() if n.startswith("model.layers.")}
            assert dims["mlp.gate_proj.weight"] == 0  # column: output features
            assert dims["mlp.down_proj.weight"] == 1  # row: input features
            assert dims["input_layernorm.weight"] == -1  # replicated
    if plan.zero == 1:  # ZeRO-1: the dp ranks of a shard split its Adam states (two per weight) between them
        groups: dict[tuple, list[dict]] = {}
        for a in answers:
            groups.setdefault((a["coords"]["tp"], a["coords"]["pp"]), []).append(a)
        for group in groups.values():
            held = sum(local for local, _, _ in group[0]["shards"].values())
            states = [a["optimizer_state_numel"] for a in group]
            assert sum(states) == pytest.approx(2 * held, rel=0.01) and max(states) < 0.6 * 2 * held


LLAMA_PLANS = [
    "tp=2,mbs=4,sp=true", "dp=2,mbs=2,zero=1,recompute=selective", "dp=2,mbs=2,zero=3",
    "pp=2,mbs=2,schedule=interleaved,v=2",
    pytest.param("tp=2,mbs=8", marks=pytest.mark.slow), pytest.param("dp=2,mbs=4", marks=pytest.mark.slow),
    pytest.param("dp=2,mbs=2,zero=2,recompute=full", marks=pytest.mark.slow),
    pytest.param("pp=2,mbs=2,schedule=gpipe", marks=pytest.mark.slow),
    pytest.param("pp=2,mbs=1,schedule=1f1b,recompute=selective", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("plan", LLAMA_PLANS)
def test_llama_plan_kinds_match_the_single_process(pool, single, plan: str) -> None:
    answers = run(pool, tiny("llama"), plan)
    assert_parity(answers, single("llama"))
    assert_plan_shards(Plan.parse(plan), answers)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt", "gpt2", "bert", "vit", "t5"])
@pytest.mark.parametrize("plan", ["tp=2,mbs=8", "tp=2,mbs=4,sp=true", "pp=2,mbs=2,schedule=1f1b",
                                  "dp=2,mbs=2,zero=1,recompute=selective"])
def test_every_family_matches_the_single_process(pool, single, family: str, plan: str) -> None:
    if unsupported(Plan.parse(plan), tiny(family)):
        pytest.skip(unsupported(Plan.parse(plan), tiny(family)))
    assert_parity(run(pool, tiny(family), plan), single(family))


def test_tied_embeddings_across_pipeline_stages_stay_one_weight(pool, single) -> None:
    """GPT's word embedding is also its LM head: on different stages their gradients are summed (Megatron's
    embedding group), or the two copies drift apart from the second step on."""
    assert_parity(run(pool, tiny("gpt"), "pp=2,mbs=2,schedule=interleaved,v=2"), single("gpt"))


@pytest.fixture(scope="module")
def pool4(pool):
    with WorkerPool(world=4, threads=1) as p:
        yield p


@pytest.mark.slow
@pytest.mark.parametrize("plan", [
    "dp=2,tp=2,mbs=2,zero=1,sp=true,recompute=selective",
    pytest.param("tp=2,pp=2,mbs=2,sp=true,schedule=interleaved,v=2", marks=pytest.mark.slow),
    pytest.param("dp=2,pp=2,mbs=2,zero=3,schedule=1f1b", marks=pytest.mark.slow),
    pytest.param("dp=2,pp=2,mbs=1,zero=1,schedule=interleaved,v=2", marks=pytest.mark.slow),  # two chunks a rank
])
def test_composed_4_rank_plans_match_the_single_process(pool4, single, plan: str) -> None:
    answers = run(pool4, tiny("llama"), plan)
    assert_parity(answers, single("llama"))
    assert_plan_shards(Plan.parse(plan), answers)
    coords = {tuple(sorted(a["coords"].items())) for a in answers}
    assert len(coords) == 4  # every rank a distinct point of the mesh


def _runner_role(kind: str, path: str, tp_dim: int) -> str:
    """The role a sharded parameter shows: the dimension its weight is split along over the tp ranks."""
    if tp_dim == -1:
        return "replicated"
    if kind == "embedding":
        return "vocab" if tp_dim == 0 else "heads"
    return "row" if tp_dim == 1 else ("column" if in_block(path) else "vocab")


@pytest.mark.parametrize("family", ["llama", *(pytest.param(f, marks=pytest.mark.slow)
                                                  for f in ("bert", "t5", "gpt", "gpt2", "vit", "deit"))])
def test_graph_table_and_runner_give_every_module_the_same_tp_role(pool, family: str) -> None:
    """One table of roles (predictor.graph.tp_roles): the layer graph's roles (which the sharding model prices), the
    table's answer for the real model, and how the runner's tp=2 ranks actually split each weight agree."""
    spec = tiny(family)
    graph = {n.name: (n.kind, n.tp) for n in graph_for(spec).nodes if n.kind in ("linear", "embedding")}
    table = tp_roles(build_model(spec, "meta"), spec)
    shards = run(pool, spec, "tp=2,mbs=8", steps=1, warmup=0)[0]["shards"]
    compared = 0
    for path, (kind, role) in graph.items():
        if path in table:  # the table names Linear/Conv1D/Embedding modules (not GPT's weightless LMHead, a rotary)
            assert table[path] == role, path
        if f"{path}.weight" in shards:  # tied weights are listed once, under their first owner
            assert _runner_role(kind, path, shards[f"{path}.weight"][2]) == role, path
            compared += 1
    assert compared >= 6 and {"column", "row"} <= {role for _, role in graph.values()}


def test_the_table_knows_gated_mlps_gqa_and_moe_names() -> None:
    block = "model.layers.0."
    for leaf in ("q_proj", "k_proj", "v_proj", "mlp.gate_proj", "mlp.up_proj", "block_sparse_moe.experts.3.w1",
                 "block_sparse_moe.experts.3.w3"):
        assert linear_role(block + leaf, True, 128, 256) == "column", leaf
    for leaf in ("o_proj", "mlp.down_proj", "block_sparse_moe.experts.3.w2"):
        assert linear_role(block + leaf, True, 64, 256) == "row", leaf
    assert linear_role(block + "block_sparse_moe.gate", True, 8, 256) == "replicated"  # the router
    assert linear_role("lm_head", False, 256, 256) == "vocab" and linear_role("classifier", False, 10, None) == "replicated"


def test_what_the_runner_refuses_it_names() -> None:
    assert "context_parallel" in unsupported(Plan(cp=2, dp=1), tiny("llama"))
    assert "at most 2 chunks" in unsupported(Plan(pp=4), tiny("t5"))
    assert "no layout" in unsupported(Plan(dp=2), ModelSpec(module="x:y", inputs=[{"shape": [4], "dtype": "float32"}]))
    assert unsupported(Plan.parse("dp=2,tp=2,pp=2,sp=true,schedule=interleaved,v=2,zero=1,recompute=selective"),
                       tiny("llama")) == ""
