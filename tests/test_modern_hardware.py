"""Hopper fp8 and Blackwell (fp8 + fp4) catalogue entries, precision refused at the spec boundary, NVLink
domains larger than a node (NVL72 racks), and the Llama 3.1 405B preset."""

import pytest

from predictor.graph.modelzoo import build_model, param_count
from predictor.spec.hardware import DEVICES, GB, TFLOPS, UnsupportedPrecision
from predictor.spec.resolver import get_device
from predictor.spec.workload import ModelSpec, SpecError, parse_spec

BLACKWELL = ("b200", "gb200", "b300", "gb300")
HOPPER = ("h100", "h200", "h20")


def _spec(device: str, precision: str = "bf16", **cluster) -> dict:
    return {"model": {"preset": "gpt3-1.3b"}, "training": {"global_batch": 8, "precision": precision},
            "cluster": {"device": device, **cluster}}


@pytest.mark.parametrize("name", BLACKWELL)
def test_blackwell_figures_present_and_positive(name: str) -> None:
    dev = get_device(name)
    assert set(dev.peak_flops) == {"fp16", "bf16", "fp32", "fp8", "fp4"}
    assert all(v > 0 for v in dev.peak_flops.values())
    assert dev.mem_bandwidth > 0 and dev.mem_capacity > 0 and dev.extra["sms"] > 0
    assert dev.intra_node.bandwidth == 900 * GB  # NVLink 5: 1.8 TB/s bidirectional
    assert dev.inter_node.bandwidth in (50 * GB, 100 * GB)  # ConnectX-7 400 Gb/s / ConnectX-8 800 Gb/s
    assert dev.source and dev.intra_node.source and dev.inter_node.source


def test_dense_blackwell_peaks() -> None:
    b200 = get_device("b200")
    assert b200.flops("bf16") == 2250 * TFLOPS and b200.flops("fp8") == 4500 * TFLOPS  # not 4.5 / 9 PF sparse
    assert b200.flops("fp4") == 9000 * TFLOPS and b200.mem_capacity == 180 * GB
    assert get_device("gb300").flops("fp4") == 15000 * TFLOPS  # 1,080 PFLOPS dense / 72 GPUs
    assert get_device("gb300").mem_capacity == 288 * GB


@pytest.mark.parametrize("name", HOPPER + BLACKWELL)
def test_fp8_beats_bf16(name: str) -> None:
    dev = get_device(name)
    assert dev.flops("fp8") == pytest.approx(2 * dev.flops("bf16"), rel=0.01)
    if "fp4" in dev.peak_flops:
        assert dev.flops("fp4") > dev.flops("fp8")


def test_fp4_only_on_blackwell() -> None:
    with_fp4 = {name for name, dev in DEVICES.items() if dev is not None and "fp4" in dev.peak_flops}
    assert with_fp4 == set(BLACKWELL)
    assert get_device("h100").flops("fp8") == 1979 * TFLOPS


def test_flops_names_the_device_and_its_precisions() -> None:
    with pytest.raises(UnsupportedPrecision, match=r"'a100-80gb' has no fp8 peak; its precisions: fp16, bf16, fp32"):
        get_device("a100-80gb").flops("fp8")
    with pytest.raises(ValueError, match="'h100' has no fp4 peak"):
        get_device("h100").flops("fp4")


def test_precision_refused_at_the_boundary() -> None:
    with pytest.raises(SpecError, match=r"training\.precision 'fp8' is not available on device 'a100-80gb'; "
                                        r"its precisions: fp16, bf16, fp32"):
        parse_spec(_spec("a100-80gb", "fp8"))
    with pytest.raises(SpecError, match=r"training\.precision 'fp4' is not available on device 'h200'"):
        parse_spec(_spec("h200", "fp4"))
    with pytest.raises(SpecError, match=r"training\.precision 'fp8' is not available on device 'cpu'"):
        parse_spec(_spec("cpu", "fp8"))
    assert parse_spec(_spec("h100", "fp8")).training.precision == "fp8"
    assert parse_spec(_spec("gb200", "fp4", gpus_per_node=4)).training.precision == "fp4"


def test_nvlink_domain_defaults() -> None:
    assert parse_spec(_spec("h100", gpus_per_node=8)).cluster.nvlink_domain_gpus == 8
    assert parse_spec(_spec("cpu", gpus_per_node=2)).cluster.nvlink_domain_gpus == 2
    gb200 = parse_spec(_spec("gb200", nodes=2, gpus_per_node=4)).cluster
    assert gb200.nvlink_domain is None and gb200.nvlink_domain_gpus == 72  # the rack, not the 8 GPUs asked for
    assert parse_spec(_spec("gb300", nodes=36, gpus_per_node=4)).cluster.nvlink_domain_gpus == 72
    assert parse_spec(_spec("h100", nodes=4, gpus_per_node=8, nvlink_domain=32)).cluster.nvlink_domain_gpus == 32


@pytest.mark.parametrize("cluster,match", [
    ({"device": "h100", "gpus_per_node": 8, "nvlink_domain": 12}, r"nvlink_domain \(12 GPUs\) must be a positive "
                                                                  r"multiple of gpus_per_node \(8\)"),
    ({"device": "h100", "gpus_per_node": 8, "nvlink_domain": 4}, r"nvlink_domain \(4 GPUs\)"),
    ({"device": "gb200", "gpus_per_node": 16}, r"the gb200 NVLink domain \(72 GPUs\) must be a positive multiple"),
    ({"device": "h100", "nvlink_domain": 0}, r"cluster\.nvlink_domain: Input should be greater than 0"),
])
def test_nvlink_domain_validation(cluster: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        parse_spec({**_spec("h100"), "cluster": cluster})


def test_llama31_405b_preset() -> None:
    model = ModelSpec(preset="llama3.1-405b")
    assert (model.hidden, model.layers, model.heads, model.kv_heads, model.ffn_hidden_size, model.vocab,
            model.seq_len) == (16384, 126, 128, 8, 53248, 128256, 8192)
    module = build_model(model)
    assert all(p.is_meta for p in module.parameters())
    assert param_count(module) == pytest.approx(405.9e9, rel=0.005)  # Meta: 405B (untied 128,256-token embeddings)


def test_preset_seq_len_override() -> None:
    spec = parse_spec({"model": {"preset": "llama3-70b", "seq_len": 4096}, "training": {"global_batch": 8},
                       "cluster": {"device": "h100"}})
    assert spec.model.seq_len == 4096 and spec.model.tokens == 4096
    assert spec.model.hidden == 8192 and spec.model.layers == 80 and spec.model.kv_heads == 8
    assert parse_spec({"model": {"preset": "llama3-70b"}, "training": {"global_batch": 8},
                       "cluster": {"device": "h100"}}).model.seq_len == 8192
