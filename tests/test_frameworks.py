"""The framework registry: one module per framework, one rule for which applies, the spec's choices derived from it."""

from __future__ import annotations

import pytest

from predictor.device_resolver import spec_device
from predictor.frameworks import FRAMEWORK_NAMES, FRAMEWORKS, framework_for
from predictor.graph_cache import graph_for
from predictor.hardware import DEVICES
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.roofline import AnalyticalConfig, framework_config
from predictor.plan import Plan
from predictor.workload import SpecError, parse_spec

PROFILE = "predictor/data/cpu/device.json"


def _spec(device: str = "h100", framework: str | None = None, profile: str | None = None):
    training = {"global_batch": 8, **({"framework": framework} if framework else {})}
    cluster = {"device": device, "gpus_per_node": 2, **({"device_profile": profile} if profile else {})}
    return parse_spec({"model": {"preset": "gpt2"}, "training": training, "cluster": cluster})


def test_each_framework_is_one_module_holding_its_whole_profile():
    assert FRAMEWORK_NAMES == ("megatron", "torchtitan", "deepspeed", "pytorch")
    for name, framework in FRAMEWORKS.items():
        assert framework.name == name == framework.memory.framework
        assert type(framework).__module__ == "predictor.frameworks.base"
        assert (framework.launch is None) == (name == "pytorch")  # ScaleDL's runner runs plans itself
    # Megatron-Core's constants calibrated on Megatron-Bridge's Hopper and Blackwell recipes price those generations
    # only; A100s and the other frameworks keep first principles.
    megatron = FRAMEWORKS["megatron"].constants
    assert set(megatron) == {"hopper", "blackwell"}
    assert framework_config("megatron", "hopper") == AnalyticalConfig(**megatron["hopper"])
    assert megatron["hopper"]["gemm_eff_max"] < AnalyticalConfig().gemm_eff_max
    assert framework_config("megatron", "ampere") == AnalyticalConfig()
    assert framework_config("torchtitan", "hopper") == AnalyticalConfig()


def test_framework_for_decides_once_which_framework_applies():
    assert framework_for(_spec()).name == "megatron"  # the default on a catalogue GPU
    assert framework_for(_spec(framework="torchtitan")).name == "torchtitan"
    assert framework_for(_spec("cpu")).name == "pytorch"  # a measured device runs ScaleDL's runner
    assert framework_for(_spec("cpu", profile=PROFILE)).name == "pytorch"
    # A device given decides: a measured one prices any spec with ScaleDL's runner, a catalogue one with the spec's.
    measured = spec_device(_spec("cpu", profile=PROFILE))
    assert framework_for(_spec(framework="deepspeed"), measured).name == "pytorch"
    assert framework_for(_spec(framework="deepspeed"), DEVICES["h100"]).name == "deepspeed"


def test_the_analytical_predictor_prices_with_the_framework_framework_for_names():
    spec, predictor = _spec(framework="torchtitan"), AnalyticalPredictor()
    pieces = predictor.pieces(spec, graph_for(spec.model))
    assert pieces.framework is FRAMEWORKS["torchtitan"] and pieces.config == framework_config("torchtitan", "hopper")


def test_the_spec_takes_the_registrys_names_with_a_did_you_mean():
    for name in FRAMEWORK_NAMES[:-1]:
        assert _spec(framework=name).training.framework == name
    with pytest.raises(SpecError, match=r"training.framework: unknown framework; did you mean 'torchtitan'\? "
                                        r"frameworks: megatron, torchtitan, deepspeed, pytorch \(got 'torchtitn'\)"):
        _spec(framework="torchtitn")
    with pytest.raises(SpecError, match="frameworks: megatron"):
        _spec(framework="jax")
    with pytest.raises(SpecError, match="runs on GPUs"):
        _spec("cpu", framework="megatron")


def test_a_prediction_says_which_constants_price_it():
    notes = {}
    for device in ("h100", "a100-80gb"):
        spec = parse_spec({"model": {"preset": "gpt2"}, "training": {"global_batch": 8, "framework": "megatron"},
                           "cluster": {"device": device, "gpus_per_node": 8}})
        (pred,) = AnalyticalPredictor().predict(spec, graph_for(spec.model), [Plan.parse("dp=8")])
        notes[device] = pred.extra["constants"]
    assert notes["h100"] == "megatron constants calibrated on hopper"
    assert notes["a100-80gb"].startswith("first principles: megatron has no constants fitted on ampere")
