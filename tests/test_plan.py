"""Plans: parsing, validity against a workload, and applying a plan to a layer graph."""

import numpy as np
import pytest

from predictor.costs.parallel import apply_plan, group_of, shard_nodes, stage_counts
from predictor.models.stage_costs import tp_node_collectives
from predictor.plan import Plan, PlanError, plan_errors
from predictor.plan.share import RankShare
from predictor.spec.resolver import get_device
from predictor.spec.workload import parse_spec
from tests.gpt_graph import gpt_graph

A100 = get_device("a100-80gb")


def _spec(gpus_per_node=8, nodes=1, layers=8, batch=64, heads=16):
    return parse_spec({
        "model": {"family": "gpt", "hidden": 1024, "layers": layers, "heads": heads, "seq_len": 512, "vocab": 50304},
        "training": {"global_batch": batch, "precision": "bf16"},
        "cluster": {"device": "a100-80gb", "nodes": nodes, "gpus_per_node": gpus_per_node}})


def test_parse_round_trip():
    text = "dp=16,tp=8,pp=8,mbs=1,zero=1,recompute=full,sp=true,schedule=interleaved,v=3"
    plan = Plan.parse(text)
    assert (plan.dp, plan.tp, plan.pp, plan.zero, plan.recompute, plan.sp, plan.v) == (16, 8, 8, 1, "full", True, 3)
    assert Plan.parse(str(plan)) == plan
    assert Plan.parse("dp=2") == Plan(dp=2)


def test_trusted_plan_is_the_checked_plan():
    plan = Plan.parse("dp=16,tp=8,pp=8,mbs=2,zero=1,recompute=full,sp=true,schedule=interleaved,v=3,cp=2,ep=2")
    trusted = Plan.trusted(dict(vars(plan)))
    assert trusted == plan and hash(trusted) == hash(plan) and str(trusted) == str(plan)
    assert trusted.gpus == plan.gpus and trusted.with_(v=2) == plan.with_(v=2)


@pytest.mark.parametrize("text, message", [
    ("dp=two", "'dp' must be an integer"),
    ("dq=2", "unknown plan field 'dq'"),
    ("dp=2,dp=4", "given twice"),
    ("sp=maybe", "'sp' must be true or false"),
    ("recompute=some", "'recompute' must be none, selective, full, or module names"),
    ("dp=0", "'dp' must be a positive integer"),
    ("pp=2,v=2", "'v' must be 1 unless schedule=interleaved"),
    ("", "empty plan"),
])
def test_parse_errors_name_the_field(text, message):
    with pytest.raises(PlanError, match=message):
        Plan.parse(text)


def test_plan_errors_explain_each_reason():
    spec = _spec()
    assert plan_errors(Plan(dp=2, tp=2, pp=2, mbs=2), spec) == []
    assert "cluster has 8 GPUs" in plan_errors(Plan(dp=4, tp=4, pp=1), spec)[0]
    assert any("tp=8 does not divide heads=4" in e for e in plan_errors(Plan(dp=1, tp=8, pp=1), _spec(heads=4)))
    assert any("divides neither the 12 transformer layers" in e for e in plan_errors(Plan(dp=1, tp=1, pp=8), _spec(layers=12)))
    assert any("does not divide global_batch" in e for e in plan_errors(Plan(dp=8, mbs=3), spec))
    assert any("zero=1" in e for e in plan_errors(Plan(dp=1, tp=8, zero=1), spec))
    assert any("sp=true needs tp > 1" in e for e in plan_errors(Plan(dp=8, sp=True), spec))
    cross = plan_errors(Plan(dp=1, tp=16), _spec(gpus_per_node=8, nodes=2))
    assert any("spans 16 consecutive GPUs" in e for e in cross)
    assert plan_errors(Plan(dp=1, tp=16), _spec(gpus_per_node=8, nodes=2), allow_cross_node_tp=True) == []


def test_placement_strides():
    plan = Plan(dp=4, tp=2, pp=2, placement="tp-dp-pp")
    assert (plan.stride("tp"), plan.stride("dp"), plan.stride("pp")) == (1, 2, 8)
    assert plan.group_span("dp") == 7
    plan = Plan(dp=4, tp=2, pp=2, placement="dp-tp-pp")
    assert (plan.stride("dp"), plan.stride("tp")) == (1, 4)


def test_groups_cross_nodes_by_placement():
    plan = Plan(dp=16, tp=8, pp=1)
    assert group_of(plan, "tp", 8, A100).n_inter == 1
    dp = group_of(plan, "dp", 8, A100)
    assert (dp.n_intra, dp.n_inter) == (1, 16)
    dp = group_of(Plan(dp=16, tp=2, pp=4), "dp", 8, A100)  # stride 2: 4 dp ranks per node, 4 nodes
    assert (dp.n_intra, dp.n_inter) == (4, 4)


def test_stages_split_blocks_pre_first_post_last():
    g = gpt_graph(1024, 16, 512, 8, 50304)
    counts, blocks = stage_counts(g, 4)
    assert blocks.tolist() == [2, 2, 2, 2]
    names = [n.name for n in g.nodes]
    assert counts[:, names.index("embed")].tolist() == [1, 0, 0, 0]
    assert counts[:, names.index("loss")].tolist() == [0, 0, 0, 1]
    assert counts[:, names.index("qkv")].tolist() == [2, 2, 2, 2]
    # every occurrence lands on exactly one stage
    assert np.allclose(counts.sum(axis=0), [n.count for n in g.nodes])


def test_interleaved_chunks_round_robin():
    g = gpt_graph(1024, 16, 512, 16, 50304)
    counts, blocks = stage_counts(g, 2, v=4)  # 8 chunks of 2 blocks; rank 0 holds chunks 0, 2, 4, 6
    assert blocks.tolist() == [8, 8]
    assert stage_counts(g, 2, v=4)[0] is counts  # cached per (graph, pp, v)


def test_tensor_parallel_sharding():
    g = gpt_graph(1024, 16, 512, 4, 50304)
    whole, half = shard_nodes(g, RankShare()), shard_nodes(g, RankShare.split({"tp": 2}))
    names = [n.name for n in g.nodes]
    i = {n: names.index(n) for n in ("qkv", "fc2", "ln1", "attn", "logits")}
    for n in ("qkv", "fc2", "attn", "logits"):
        assert half.fwd_flops[i[n]] == pytest.approx(whole.fwd_flops[i[n]] / 2)
    assert half.params[i["qkv"]] == pytest.approx(whole.params[i["qkv"]] / 2)
    assert half.fwd_flops[i["ln1"]] == whole.fwd_flops[i["ln1"]]  # replicated without sp
    seq = shard_nodes(g, RankShare.split({"tp": 2}, True))
    assert seq.fwd_flops[i["ln1"]] == pytest.approx(whole.fwd_flops[i["ln1"]] / 2)
    assert half.gemm_n[i["qkv"]] == 1536 and half.gemm_k[i["fc2"]] == 2048
    # Megatron: 2 all-reduces forward and 2 backward per block; +1 forward (embedding) and +1 backward (logits).
    (fwd, bwd, _), (none, _, _) = tp_node_collectives(half, 2), tp_node_collectives(whole, 1)
    assert fwd[[names.index(n) for n in names if n != "embed"]].sum() == 2
    assert fwd.sum() == 3 and bwd.sum() == 3
    assert none.sum() == 0


def test_apply_plan_layout():
    spec = _spec(gpus_per_node=8, nodes=2)
    g = gpt_graph(1024, 16, 512, 8, 50304)
    lay = apply_plan(spec, g, Plan(dp=2, tp=4, pp=2, mbs=2, sp=True), A100)
    assert lay.microbatches == 16
    assert lay.p2p_elems == 512 * 1024 * 2 / 4
    assert lay.groups["tp"].n_inter == 1 and lay.groups["dp"].n_inter == 1  # tp-dp-pp: tp and dp fill one node
    assert lay.stage_link_inter  # pp neighbours are 8 ranks apart: the next node
    inner = apply_plan(spec, g, Plan(dp=2, tp=4, pp=2, mbs=2, placement="tp-pp-dp"), A100)
    assert not inner.stage_link_inter and inner.groups["dp"].n_inter == 2


def test_kind_names_the_parallelism_a_plan_runs():
    assert Plan(mbs=4).kind == "single"
    assert Plan(dp=2, mbs=2).kind == "dp" and Plan(dp=2, mbs=2, zero=3).kind == "fsdp"
    assert Plan(tp=2, mbs=4).kind == "tp"
    assert Plan(pp=2, mbs=1, schedule="gpipe").kind == "pp-gpipe"
    assert Plan(dp=2, tp=2, pp=2, mbs=1).kind == "pp-1f1b"  # the pipeline names a mixed plan
