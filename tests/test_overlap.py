"""Framework overlap, context parallelism and FP8 in the analytical model, and each framework's plan rules."""

import pytest

from predictor.frameworks import FRAMEWORKS
from predictor.frameworks.launch import launch_files
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.overlap import COMM_SMS, slowdown
from predictor.models.roofline import AnalyticalConfig
from predictor.plan import Plan
from predictor.plan.axes import OPTION_AXIS
from predictor.spec.hardware import DEVICES
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec
from search_spaces import enumerate_plans, load_space

CFG = AnalyticalConfig()


def _spec(framework="megatron", precision="bf16", nodes=4, seq=4096, device="h100"):
    return parse_spec({"model": {"preset": "llama3-8b", "seq_len": seq},
                       "training": {"global_batch": 64, "precision": precision, "framework": framework},
                       "cluster": {"device": device, "nodes": nodes, "gpus_per_node": 8}})


SPEC = _spec()
GRAPH = graph_for(SPEC.model)


def _predict(text, spec=SPEC, cfg=CFG):
    return AnalyticalPredictor(cfg).predict(spec, GRAPH, [Plan.parse(text)])[0]


def test_overlap_hides_communication_and_charges_the_slowdown():
    """Switching overlap off exposes exactly what was hidden; each hidden second costs the share of the SMs the
    communication kernel holds."""
    text = "dp=4,tp=4,pp=2,mbs=1,zero=1,sp=true,schedule=interleaved,v=2"
    on, off = _predict(text), _predict(text + ",overlap=none")
    assert off.hidden_comm == {}
    assert set(on.hidden_comm) == {"tp_comm", "dp_grad", "dp_param", "pp_p2p"}
    hidden = sum(on.hidden_comm.values())
    lost = slowdown(DEVICES["h100"])
    assert lost == pytest.approx(COMM_SMS / 132)
    assert off.iter_time_s - on.iter_time_s == pytest.approx(hidden * (1 - lost), rel=1e-9)
    assert on.breakdown["compute"] - off.breakdown["compute"] == pytest.approx(lost * hidden)
    assert on.peak_memory_gib == off.peak_memory_gib


def test_what_is_hidden_is_bounded_by_its_window():
    """Gradient reduction hides behind the last micro-batch's backward, less its last bucket; the first and last
    collectives of a pass have nothing beside them."""
    pred = _predict("dp=32,mbs=1,zero=1")
    full = _predict("dp=32,mbs=1,zero=1,overlap=none")
    m = 64 // 32
    assert 0 < pred.hidden_comm["dp_grad"] < full.breakdown["compute"] / m  # backward of one micro-batch < its fwd + bwd
    assert pred.hidden_comm["dp_grad"] < full.breakdown["dp_comm"]  # the last bucket is exposed
    assert pred.breakdown["dp_comm"] > 0


def test_zero3_gathers_hide_per_pass_and_never_more_than_the_computation():
    """ZeRO-3 gathers every unit again in every micro-batch's forward and backward: each pass hides all but its first
    gather, at most its own computation, and all hidden communication together at most the computation beside it."""
    for text in ("dp=32,mbs=1,zero=3", "dp=8,tp=4,mbs=1,zero=3,sp=true"):
        on, off = _predict(text), _predict(text + ",overlap=none")
        lost = slowdown(DEVICES["h100"])
        assert sum(on.hidden_comm.values()) <= off.breakdown["compute"] * (1 + 1e-12)
        assert on.hidden_comm["dp_param"] < off.breakdown["dp_comm"]
        assert on.breakdown["compute"] == pytest.approx(off.breakdown["compute"] + lost * sum(on.hidden_comm.values()))


def test_each_framework_overlaps_what_its_recipes_do():
    plan = Plan(dp=4, tp=4, pp=2, zero=1, sp=True, schedule="interleaved", v=2)
    assert FRAMEWORKS["megatron"].overlap(plan) == {"dp", "param", "tp", "pp"}
    assert FRAMEWORKS["deepspeed"].overlap(Plan(dp=8, zero=3)) == {"dp", "param"}
    assert FRAMEWORKS["deepspeed"].overlap(Plan(dp=8, zero=1)) == frozenset()
    assert FRAMEWORKS["pytorch"].overlap(plan) == frozenset()
    assert resolve(parse_spec({"model": {"preset": "gpt2"}, "training": {"global_batch": 8},
                                    "cluster": {"device": "h100"}})).framework.name == "megatron"


def test_frameworks_refuse_what_they_cannot_run():
    deepspeed, megatron, titan = (FRAMEWORKS[n] for n in ("deepspeed", "megatron", "torchtitan"))
    assert any("ZeRO stage 0 or 1" in e for e in deepspeed.errors(Plan(dp=8, pp=4, zero=2), SPEC))
    assert any("no context parallelism" in e for e in deepspeed.errors(Plan(dp=4, cp=2), SPEC))
    assert any("GPipe" in e for e in megatron.errors(Plan(dp=4, pp=8, schedule="gpipe"), SPEC))
    assert any("orders ranks" in e for e in megatron.errors(Plan(dp=4, tp=8, placement="dp-tp-pp"), SPEC))
    assert any("ZeRO-1" in e for e in titan.errors(Plan(dp=32, zero=1), SPEC))
    assert any("sequence-parallel" in e for e in titan.errors(Plan(dp=8, tp=4, zero=3), SPEC))
    assert any("does not train in fp8" in e for e in deepspeed.errors(Plan(dp=32), _spec("deepspeed", "fp8")))


@pytest.mark.parametrize("name", ["megatron", "torchtitan", "deepspeed"])
def test_values_a_framework_never_runs_are_refused_by_its_rules(name):
    """The search drops `never` values before generating plans: each must fail the rules whatever else is set."""
    framework = FRAMEWORKS[name]
    for option, values in framework.never.items():
        for value in values:
            field, value = ("placement", "-".join(value)) if option == "orders" else (option, value)
            for base in (Plan(dp=4, tp=2, pp=2, zero=1, sp=True), Plan(dp=16, zero=3), Plan(dp=8, pp=2)):
                if value == "interleaved" and base.pp == 1:
                    continue  # not a plan at all
                changes = {field: value, **({"v": 2} if value == "interleaved" else {})}
                if option in OPTION_AXIS:  # an axis option means something only above degree 1 (ep for the dispatcher)
                    plan = base.with_(**changes, **{OPTION_AXIS[option]: 2})
                    assert framework.option_errors(plan), (name, field, value, plan)
                    continue
                assert framework.errors(base.with_(**changes), SPEC), (name, field, value, base)


def test_the_search_proposes_only_what_the_framework_runs():
    spec = _spec("deepspeed", nodes=2)
    plans = enumerate_plans(spec, load_space("full")).plans
    assert plans and all(FRAMEWORKS["deepspeed"].errors(p, spec) == [] for p in plans)
    assert not any(p.pp > 1 and p.zero > 1 for p in plans)
    assert {p.zero for p in plans if p.pp == 1} == {0, 1, 2, 3}


def test_cp_ring_hides_behind_attention_and_the_allgather_does_not():
    """cp=2 halves each rank's tokens; the ring's K/V exchange hides behind attention, the all-gather is exposed."""
    long = _spec(seq=32768, nodes=1)
    graph = graph_for(long.model)
    ring, gather, none = (AnalyticalPredictor(CFG).predict(long, graph, [Plan.parse(t)])[0] for t in (
        "dp=4,cp=2,mbs=1", "dp=4,cp=2,mbs=1,cp_comm=allgather", "dp=8,mbs=1"))
    assert ring.hidden_comm["cp_comm"] > 0 and "cp_comm" not in gather.hidden_comm
    assert gather.breakdown["cp_comm"] > ring.breakdown["cp_comm"]
    assert ring.breakdown["compute"] < 0.6 * none.breakdown["compute"] * 2  # half the tokens, twice the micro-batches
    assert ring.memory_breakdown["activations"] < none.memory_breakdown["activations"]


def test_fp8_runs_the_linears_on_the_fp8_peak_and_keeps_an_fp8_weight_copy():
    bf16, fp8 = _spec(precision="bf16", nodes=1), _spec(precision="fp8", nodes=1)
    cfg = AnalyticalConfig()
    a = AnalyticalPredictor(cfg).predict(bf16, GRAPH, [Plan(dp=8, zero=1)])[0]
    b = AnalyticalPredictor(cfg).predict(fp8, GRAPH, [Plan(dp=8, zero=1)])[0]
    assert 0.5 < b.breakdown["compute"] / a.breakdown["compute"] < 0.8  # attention and the rest stay in bf16
    # Megatron-Core with --fp8-param-gather (which its launch files write) keeps each transformer-layer linear's FP8
    # weight and transpose in place of the BF16 weight: 2 bytes per parameter either way
    assert b.memory_breakdown["weights"] == pytest.approx(a.memory_breakdown["weights"], rel=1e-9)
    assert "--fp8-param-gather" in launch_files(Plan(dp=8, zero=1), resolve(fp8))["megatron_args.txt"]
    slower = AnalyticalPredictor(AnalyticalConfig(fp8_gemm_eff=0.5)).predict(fp8, GRAPH, [Plan(dp=8, zero=1)])[0]
    assert slower.breakdown["compute"] > b.breakdown["compute"]
    with pytest.raises(Exception, match="training.precision 'fp8' is not available on device 'a100-80gb'"):
        _spec(precision="fp8", device="a100-80gb")


def test_fused_attention_saves_no_scores():
    """Megatron-Core's fused attention keeps no s² scores; DeepSpeed's unfused attention does."""
    long = _spec(seq=16384, nodes=1)
    graph = graph_for(long.model)
    fused = AnalyticalPredictor(CFG).predict(long, graph, [Plan(dp=8)])[0]
    unfused = AnalyticalPredictor(CFG).predict(_spec("deepspeed", seq=16384, nodes=1), graph, [Plan(dp=8)])[0]
    assert fused.memory_breakdown["activations"] < 0.5 * unfused.memory_breakdown["activations"]
    assert fused.breakdown["compute"] < unfused.breakdown["compute"]
