"""Fused attention and memory-bound layers priced from the device facts (predictor.kernels.attention, roofline)."""

import numpy as np
import pytest

from predictor.graph.cache import graph_for
from predictor.kernels.attention import BWD_FLOPS, attention_curves
from predictor.kernels.profile import shipped_profile
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.roofline import device_config, framework_config, fused_attention_curves, layer_times
from predictor.plan.share import RankShare
from predictor.spec.hardware import GB, TFLOPS, device_facts
from predictor.spec.resolver import get_device

from predictor.plan import Plan
from predictor.spec.hardware import generation
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec


def _figure(kernel, head_dim, causal, pass_):
    """The H100 profile's published figure of the kernel, TFLOP/s by sequence length."""
    rows = shipped_profile("h100").attention[kernel].passes[("fwd" if pass_ == "forward" else "bwd")
                                                           + ("_causal" if causal else "")]
    return {int(s): r / TFLOPS for s, d, r in rows if d == head_dim}


def _spec(framework, device, precision="bf16", seq=8192):
    return parse_spec({"model": {"preset": "llama3-8b", "seq_len": seq},
                       "training": {"global_batch": 64, "precision": precision, "framework": framework},
                       "cluster": {"device": device, "nodes": 1, "gpus_per_node": 8}})


def test_throughput_rises_with_the_sequence_to_a_plateau():
    cudnn = attention_curves("hopper", "cudnn")
    seqs = [512, 1024, 2048, 4096, 8192, 16384, 32768, 131072]
    for backward in (False, True):
        rate = cudnn.rate(backward, True, 128, seqs)
        assert rate[0] < 0.7 * rate[4]  # short sequences amortise the kernel's prologue over few key tiles
        assert abs(rate[5] / rate[4] - 1) < 0.05 and rate[-1] == rate[-2] == rate[5]  # flat past the last figure
    # between the published lengths the rate lies between its neighbours'
    mid = cudnn.rate(False, False, 128, [1448])[0]
    assert 574 * TFLOPS < mid < 617 * TFLOPS  # 1k and 2k figures


def test_head_dimension_changes_the_rate_as_the_figures_say():
    fa3 = attention_curves("hopper", "flash-attention-3")
    for pass_ in ("forward", "backward"):
        d64, d128 = _figure("flash-attention-3", 64, False, pass_), _figure("flash-attention-3", 128, False, pass_)
        rate = fa3.rate(pass_ == "backward", False, [64, 128], [4096, 4096]) / TFLOPS
        assert rate == pytest.approx([d64[4096], d128[4096]])
        assert rate[1] / rate[0] == pytest.approx(d128[4096] / d64[4096])  # 638 / 476 forward, 542 / 453 backward
    # a head dimension between two figures lies between them; the causal rate is the figure's own
    assert 476 < fa3.rate(False, False, 96, 4096)[0] / TFLOPS < 638
    assert fa3.rate(False, True, 128, 4096)[0] / TFLOPS == pytest.approx(_figure("flash-attention-3", 128, True,
                                                                                  "forward")[4096])


def test_hopper_kernels_outrun_ampere_flash_attention_2_on_the_same_shape():
    ampere = attention_curves("ampere", "flash-attention-2")
    best = 0.73 * 312  # FlashAttention-2 paper: up to 73 % of A100's 312 TFLOPS
    assert ampere.rates.max() / TFLOPS == pytest.approx(best)
    for kernel in ("flash-attention-3", "cudnn", "flash-attention-2"):
        hopper = attention_curves("hopper", kernel)
        for backward in (False, True):
            for causal in (False, True):
                assert np.all(hopper.rate(backward, causal, [64, 128, 256], [1024, 4096, 16384])
                              > ampere.rate(backward, causal, [64, 128, 256], [1024, 4096, 16384]))


def test_fused_attention_prices_from_the_kernels_figures():
    spec = _spec("torchtitan", "h100")
    device, graph = get_device("h100"), graph_for(spec.model)
    curves = fused_attention_curves(resolve(spec, device))
    assert curves.kernel == "flash-attention-2" and curves.generation == "hopper"
    cfg = framework_config(resolve(spec, device).framework, generation(device), device.name)
    fwd, bwd = layer_times(resolve(spec, device), graph, RankShare(), 1, cfg)
    i = next(k for k, n in enumerate(graph.nodes) if n.kind == "attention")
    node = graph.nodes[i]
    a = node.attrs
    flops = 4 * a["seq"] ** 2 * a["head_dim"] * a["heads"] / 2  # causal: half the tiles
    assert node.fwd_flops / 2 == pytest.approx(flops)
    rate_f, rate_b = (curves.rate(b, True, a["head_dim"], a["seq"])[0] for b in (False, True))
    launch = cfg.launch_s
    share = cfg.compute_share  # torchtitan's recorded share of the facts' rates
    assert fwd[i] - launch == pytest.approx(flops / (rate_f * share))
    assert bwd[i] - 2 * launch == pytest.approx(BWD_FLOPS * flops / (rate_b * share))


def test_a_kernel_without_figures_is_flagged_and_priced_from_first_principles():
    def note(framework, device):
        spec = _spec(framework, device)
        plan = Plan(dp=8, mbs=1)
        return AnalyticalPredictor().predict(spec, graph_for(spec.model), [plan])[0].extra["attention_rate"]

    assert note("torchtitan", "h100").startswith("device facts: flash-attention-2 on hopper")
    assert note("torchtitan", "b200").startswith("first principles")  # no FlashAttention-2 figures on Blackwell
    assert "flash-attention-2" in note("torchtitan", "b200")
    assert note("torchtitan", "a100-80gb").startswith("device facts: flash-attention-2 on ampere")
    assert note("deepspeed", "a100-80gb").startswith("first principles: unfused")
    # Megatron-Core's constants fitted on Hopper were chosen with attention as GEMMs at their efficiency
    assert "not used" in note("megatron", "h100")
    assert note("megatron", "a100-80gb").startswith("device facts: flash-attention-2 on ampere")  # TE on Ampere
    assert fused_attention_curves(resolve(_spec("torchtitan", "h100", precision="fp32"), get_device("h100"))) is None


def test_memory_bound_layers_run_at_the_generations_measured_bandwidth():
    for gen, entries in (("ampere", 2), ("blackwell", 1)):
        streams = [e for e in device_facts()["memory_bound"] if e["generation"] == gen and e.get("stream")]
        assert len(streams) == entries
    assert device_config("ampere").bw_eff == pytest.approx(np.sqrt(1355 / 1555 * 1727 / 1935), abs=5e-4)
    assert device_config("blackwell").bw_eff == pytest.approx(6721 / 8000, abs=5e-4)
    assert device_config("hopper").bw_eff == 0.9  # no STREAM-like figure catalogued: the default
    spec = _spec("torchtitan", "b200")
    device, graph = get_device("b200"), graph_for(spec.model)
    cfg = framework_config(resolve(spec, device).framework, "blackwell", "b200")
    fwd, _ = layer_times(resolve(spec, device), graph, RankShare(), 1, cfg)
    i = next(k for k, n in enumerate(graph.nodes) if n.kind == "rmsnorm")
    node = graph.nodes[i]
    elems = float(np.prod(node.in_shape)) + node.out_elems
    seconds = (elems * 2 + node.params * 2) / (8000 * GB * cfg.bw_eff)
    assert fwd[i] == pytest.approx(max(seconds, node.fwd_flops / device.flops("fp32")) + cfg.launch_s)
