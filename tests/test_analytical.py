"""The analytical predictor: breakdown consistency, schedule and recomputation effects, efficiency curve."""

import pytest

from predictor.costs.prediction import MEMORY_PARTS, TIME_PARTS
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.roofline import AnalyticalConfig, gemm_efficiency, layer_times
from predictor.plan import Plan, plan_errors
from predictor.plan.share import RankShare
from predictor.spec.resolver import get_device
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec
from tests.gpt_graph import gpt_graph

S, H, A, L, V = 2048, 12288, 96, 96, 51200
A100 = get_device("a100-80gb")
GRAPH = gpt_graph(H, A, S, L, V)


def _spec(nodes=128, batch=1536, framework=None):
    training = {"global_batch": batch, "precision": "bf16", "framework": framework}
    return parse_spec({"model": {"preset": "gpt3-175b"}, "training": training,
                       "cluster": {"device": "a100-80gb", "nodes": nodes, "gpus_per_node": 8}})


SPEC = _spec()
PLAIN = _spec(framework="pytorch")  # nothing overlapped: every collective on the critical path


def _predict(text, spec=SPEC):
    plan = Plan.parse(text)
    assert plan_errors(plan, spec) == []
    return AnalyticalPredictor().predict(spec, GRAPH, [plan])[0]


def test_breakdown_sums_and_figures_are_consistent():
    p = _predict("dp=16,tp=8,pp=8,mbs=1,recompute=full,sp=true")
    assert set(p.breakdown) == set(TIME_PARTS) and set(p.memory_breakdown) == set(MEMORY_PARTS)
    assert sum(p.breakdown.values()) == pytest.approx(p.iter_time_s, rel=0.01)
    assert all(v >= 0 for v in p.breakdown.values())
    model_flops = (GRAPH.fwd_flops + GRAPH.bwd_flops) * 1536
    assert p.tflops_per_gpu == pytest.approx(model_flops / p.iter_time_s / 1024 / 1e12)
    assert p.mfu == pytest.approx(p.tflops_per_gpu * 1e12 / 312e12)
    assert 0.1 < p.mfu < 0.8  # a roofline with efficiency < 1 can never reach the peak
    assert len(p.memory_per_stage_gib) == 8 and p.peak_memory_gib == max(p.memory_per_stage_gib)
    assert sum(p.memory_breakdown.values()) == pytest.approx(p.peak_memory_gib)


def test_pipeline_bubble_is_the_other_stages_time():
    """Fill and drain cost the other stages' time per micro-batch, over v: about (p-1)/(v·m) of the ideal for
    GPT-3's 96 nearly balanced layers; and for two stages, one micro-batch through both costs what it costs
    unpipelined, however unbalanced the stages (a 4-layer model whose output layer outweighs a block)."""
    for text, p, v in (("dp=16,tp=8,pp=8,mbs=1", 8, 1), ("dp=16,tp=8,pp=8,mbs=1,schedule=interleaved,v=3", 8, 3)):
        pred = _predict(text)
        m = 1536 // 16
        ideal = pred.breakdown["compute"] + pred.breakdown["tp_comm"]
        balanced = ideal * (p - 1) / (v * m)
        assert 0.95 * balanced < pred.breakdown["pp_bubble"] < balanced  # the last stage also holds the head
    # unfused attention at the first-principles host cost keeps this small model device-bound
    spec = _spec(nodes=1, batch=8, framework="deepspeed")
    graph = gpt_graph(1024, 16, 512, 4, 51200)
    whole, piped = AnalyticalPredictor(AnalyticalConfig()).predict(spec, graph, [Plan.parse("mbs=1"),
                                                                                 Plan.parse("pp=2,mbs=1")])
    per_mb = piped.breakdown["compute"] / 8
    assert piped.breakdown["pp_bubble"] < 0.8 * per_mb
    assert per_mb + piped.breakdown["pp_bubble"] == pytest.approx(whole.breakdown["compute"] / 8, rel=1e-9)


def test_full_recompute_adds_a_forward():
    none = _predict("dp=16,tp=8,pp=8,mbs=1")
    full = _predict("dp=16,tp=8,pp=8,mbs=1,recompute=full")
    ratio = full.breakdown["compute"] / none.breakdown["compute"]
    assert 1.25 < ratio < 1.34  # forward ≈ 1/3 of forward + backward; the output layer is not recomputed
    assert full.peak_memory_gib < none.peak_memory_gib
    assert full.mfu < none.mfu  # MFU counts model FLOPs only


def test_data_parallel_sync_grows_with_zero3():
    z0 = _predict("dp=16,tp=8,pp=8,mbs=1", PLAIN)
    z1 = _predict("dp=16,tp=8,pp=8,mbs=1,zero=1", PLAIN)
    z3 = _predict("dp=16,tp=8,pp=8,mbs=1,zero=3", PLAIN)
    assert z1.breakdown["dp_comm"] == pytest.approx(z0.breakdown["dp_comm"], rel=0.05)
    # ZeRO-3 gathers the weights again in each of the 96 micro-batches' forward and backward passes:
    # (1 + 2·96)/2 times ZeRO-1's volume, in 13 units per stage instead of 210 buckets (fewer latencies)
    assert 0.8 * 96.5 < z3.breakdown["dp_comm"] / z1.breakdown["dp_comm"] < 96.5
    assert z3.breakdown["optimizer"] == pytest.approx(z0.breakdown["optimizer"] / 16)
    assert z3.memory_breakdown["optimizer"] < z1.memory_breakdown["optimizer"] * 1.01


def _slow_link_spec(latency_us: float):
    """One node of 8 A100s, global batch 8, whose NVLink latency is `latency_us` (1,000: a CPU's gloo in a step);
    the tests pair it with small hand-built GPT graphs; nothing overlapped (ScaleDL's runner)."""
    training = {"global_batch": 8, "precision": "bf16", "framework": "pytorch"}
    return parse_spec({"model": {"preset": "gpt3-175b"}, "training": training,
                       "cluster": {"device": "a100-80gb", "nodes": 1, "gpus_per_node": 8,
                                   "intra_node": {"bandwidth_gbps": 300, "latency_us": latency_us}}})


def test_each_sync_call_pays_the_link_latency():
    """FSDP syncs per unit (block + the rest) and DDP per 25 MiB bucket: with a 1 ms link latency the
    extra calls cost 1 ms each (2 ranks: one latency step per all-reduce, gather and scatter)."""
    graph = gpt_graph(1024, 16, 512, 6, 4096)
    plans = [Plan.parse("dp=2,mbs=4"), Plan.parse("dp=2,mbs=4,zero=2"), Plan.parse("dp=2,mbs=2,zero=3")]
    preds = {}
    for latency in (0.0, 1000.0):
        preds[latency] = AnalyticalPredictor().predict(_slow_link_spec(latency), graph, plans)
    extra = [b.breakdown["dp_comm"] - a.breakdown["dp_comm"] for a, b in zip(preds[0.0], preds[1000.0])]
    buckets = -(-graph.params * 2 // (25 * 2**20))
    units = 6 + 1
    assert extra[0] == pytest.approx(buckets * 1e-3, rel=1e-6)  # one all-reduce per bucket
    assert extra[1] == pytest.approx(units * 2 * 1e-3, rel=1e-6)  # reduce-scatter + one gather per unit
    assert extra[2] == pytest.approx(units * (1 + 2 * 2) * 1e-3, rel=1e-6)  # + a gather per pass of 2 micro-batches


def test_measured_in_step_costs_are_added_per_call():
    """A measured device's in-step costs (CPU: `predictor.measure.contention`) land once per collective
    call, p2p message and DTensor-sharded linear (column/row; not the attention core or the norms)."""
    from dataclasses import replace

    graph, spec = gpt_graph(1024, 16, 512, 6, 4096), _slow_link_spec(5.0)
    plans = [Plan.parse(t) for t in ("tp=2,mbs=2", "dp=2,mbs=2,zero=3", "pp=2,mbs=2")]
    measured = replace(A100, measured=True)  # synchronous, like a CPU: nothing hides behind the collectives
    costs = {"tp_linear_s": 1e-3, "collective_call_s": 1e-2, "p2p_call_s": 1e-1}
    base = AnalyticalPredictor(device=measured).predict(spec, graph, plans)
    costly = AnalyticalPredictor(device=replace(measured, extra=costs)).predict(spec, graph, plans)
    extra = [{k: c.breakdown[k] - b.breakdown[k] for k in b.breakdown} for b, c in zip(base, costly)]
    m = 4  # micro-batches of the tp and pp plans (batch 8, mbs 2)
    tp_calls = m * (6 * (2 + 2) + 2)  # per block 2 forward all-reduces and 2 backward; the vocab-parallel ends 2
    assert extra[0]["tp_comm"] == pytest.approx(m * 6 * 4 * 1e-3 + tp_calls * 1e-2, rel=1e-6)
    assert extra[1]["dp_comm"] == pytest.approx((6 + 1) * (1 + 2 * 2) * 1e-2, rel=1e-6)  # 2 micro-batches
    assert extra[2]["pp_p2p"] == pytest.approx(2 * (m + 1) * 1e-1, rel=1e-6)
    assert all(e["compute"] == 0 for e in extra)
    # A GPU's fitted call cost (AnalyticalConfig.call_s, predictor.models.calibration) lands on the same calls;
    # the measured step costs of a device take precedence over it.
    gpu = AnalyticalPredictor().predict(spec, graph, plans)
    fitted = AnalyticalPredictor(AnalyticalConfig(call_s=1e-2)).predict(spec, graph, plans)
    assert fitted[0].breakdown["tp_comm"] - gpu[0].breakdown["tp_comm"] == pytest.approx(tp_calls * 1e-2, rel=1e-6)
    assert fitted[1].breakdown["dp_comm"] - gpu[1].breakdown["dp_comm"] == pytest.approx(extra[1]["dp_comm"], rel=1e-6)
    assert fitted[2].breakdown["pp_p2p"] - gpu[2].breakdown["pp_p2p"] == pytest.approx(2 * (m + 1) * 1e-2, rel=1e-6)
    overridden = AnalyticalPredictor(AnalyticalConfig(call_s=5.0), device=replace(measured, extra=costs))
    assert [p.iter_time_s for p in overridden.predict(spec, graph, plans)] == [p.iter_time_s for p in costly]
    # Without step_p2p (ScaleDL's composition) a send/recv is charged the configured call cost instead of the
    # measured in-step one; the collectives and sharded linears keep theirs.
    plain = AnalyticalPredictor(AnalyticalConfig(step_p2p=False), device=replace(measured, extra=costs)).predict(
        spec, graph, plans)
    assert plain[2].breakdown["pp_p2p"] == pytest.approx(base[2].breakdown["pp_p2p"], rel=1e-12)
    assert [p.breakdown for p in plain[:2]] == [p.breakdown for p in costly[:2]]


def test_tensor_parallel_across_nodes_is_slower():
    spec = _spec(nodes=2, batch=64)
    plan = Plan(dp=1, tp=16, pp=1, mbs=1, recompute="full")
    inside = Plan(dp=2, tp=8, pp=1, mbs=1, recompute="full")
    pred = AnalyticalPredictor().predict(spec, gpt_graph(H, A, S, 4, V), [plan, inside])
    # per micro-batch (64 vs 32 of them); NVLink 300 GB/s vs 8 NICs x 25 GB/s per node across: ~1.8x
    assert pred[0].breakdown["tp_comm"] / 64 > 1.5 * pred[1].breakdown["tp_comm"] / 32


def test_gemm_efficiency_curve():
    cfg = AnalyticalConfig()
    big = gemm_efficiency(8192, 8192, 8192, 1, cfg)
    assert big < cfg.gemm_eff_max and big > 0.9 * cfg.gemm_eff_max
    assert gemm_efficiency(128, 8192, 8192, 1, cfg) < 0.6 * big  # skinny GEMMs are far less efficient
    # wave quantisation: 109 tiles on 108 SMs need two waves
    full = gemm_efficiency(128 * 108, 128, 4096, 1, cfg, sms=108)
    spill = gemm_efficiency(128 * 109, 128, 4096, 1, cfg, sms=108)
    assert spill < 0.6 * full


def test_layer_times_exposed_and_cached():
    fwd, bwd = layer_times(resolve(SPEC, A100), GRAPH, RankShare.split({"tp": 8}, True), 1)
    assert fwd.shape == (len(GRAPH.nodes),) and (fwd > 0).all() and (bwd > fwd).all()
    assert layer_times(resolve(SPEC, A100), GRAPH, RankShare.split({"tp": 8}, True), 1)[0] is fwd
    fwd2, _ = layer_times(resolve(SPEC, A100), GRAPH, RankShare.split({"tp": 8}, True), 2)
    assert (fwd2 > fwd).all()
    names = [n.name for n in GRAPH.nodes]
    # a large GEMM is compute bound: its time is FLOPs / (peak · efficiency)
    i = names.index("fc1")
    eff = gemm_efficiency(S, 4 * H / 8, H, 1, AnalyticalConfig(), sms=108)
    assert fwd[i] == pytest.approx(GRAPH.nodes[i].fwd_flops / 8 / (312e12 * eff) + 3e-6)


def test_a_16_bit_runs_linears_take_bf16_gemm_eff_max():
    """bf16_gemm_eff_max prices the linears of a bf16 run only: its attention keeps gemm_eff_max, and an fp8 run's
    linears keep fp8_gemm_eff · gemm_eff_max."""
    own = AnalyticalConfig(bf16_gemm_eff_max=0.4)
    fc1 = [n.name for n in GRAPH.nodes].index("fc1")
    attention = [n.kind for n in GRAPH.nodes].index("attention")
    base, _ = layer_times(resolve(SPEC, A100), GRAPH, RankShare.split({"tp": 8}, True), 1, AnalyticalConfig())
    slow, _ = layer_times(resolve(SPEC, A100), GRAPH, RankShare.split({"tp": 8}, True), 1, own)
    assert slow[fc1] - 3e-6 == pytest.approx((base[fc1] - 3e-6) * AnalyticalConfig().gemm_eff_max / 0.4)
    assert slow[attention] == base[attention]
    fp8 = parse_spec({"model": {"preset": "gpt3-175b"}, "training": {"global_batch": 1536, "precision": "fp8"},
                      "cluster": {"device": "h100", "nodes": 128, "gpus_per_node": 8}})
    h100 = get_device("h100")
    assert (layer_times(resolve(fp8, h100), GRAPH, RankShare.split({"tp": 8}, True), 1, own)[0] == layer_times(resolve(fp8, h100), GRAPH, RankShare.split({"tp": 8}, True), 1)[0]).all()


def test_a_measured_device_prices_each_collective_on_its_own_link():
    """DDP all-reduces on the all-reduce link, ZeRO-3 on the reduce-scatter and all-gather links, and
    pipeline messages on the send/recv link (a measured CPU's gloo ops differ 3-8x)."""
    from dataclasses import replace

    from predictor.spec.hardware import Link

    graph, spec = gpt_graph(1024, 16, 512, 6, 4096), _slow_link_spec(5.0)
    plans = [Plan.parse(t) for t in ("dp=2,mbs=4", "dp=2,mbs=4,zero=3", "pp=2,mbs=2")]
    measured = replace(A100, measured=True)
    slow = Link(1e9, 1e-3)
    base = AnalyticalPredictor(device=measured).predict(spec, graph, plans)
    for op, plan_index, part in (("all_reduce", 0, "dp_comm"), ("reduce_scatter", 1, "dp_comm"),
                                 ("all_gather", 1, "dp_comm"), ("send_recv", 2, "pp_p2p")):
        own = AnalyticalPredictor(device=replace(measured, op_links={op: slow})).predict(spec, graph, plans)
        for i in range(3):
            changed = own[i].breakdown[part] != pytest.approx(base[i].breakdown[part])
            assert changed == (i == plan_index), (op, i)
