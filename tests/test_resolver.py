"""The one resolver (predictor.spec.resolver): a spec's device, generation, framework, NVLink domain, recipe and attention
kernel decided once, and the pricing and the launch file reading the same value."""

from __future__ import annotations

import pytest

from predictor.frameworks import FRAMEWORKS
from predictor.frameworks.launch import launch_files
from predictor.plan import Plan
from predictor.spec.hardware import DEVICES, RECIPES
from predictor.spec.resolver import Resolved, resolve
from predictor.spec.workload import SpecError, parse_spec


def _spec(device: str = "h100", precision: str = "bf16", recipe: str | None = None, **cluster) -> object:
    return parse_spec({"model": {"preset": "llama3-8b"},
                       "training": {"global_batch": 64, "precision": precision, "recipe": recipe,
                                    "framework": "megatron" if device != "cpu" else None},
                       "cluster": {"device": device, "gpus_per_node": 8, **cluster}})


def test_a_spec_is_resolved_into_one_frozen_value():
    resolved = resolve(_spec("b200", "fp8"))
    assert (resolved.framework, resolved.generation, resolved.nvlink_domain) == (FRAMEWORKS["megatron"], "blackwell", 8)
    assert resolved.device == DEVICES["b200"] and resolved.profile is None  # no kernel profile loaded yet
    assert resolved.kernels == FRAMEWORKS["megatron"].kernels.default("blackwell")  # cuDNN attention on Blackwell
    assert resolved.attention_backend == resolved.kernels.attention_kernel == "cudnn" and resolved.fused_attention
    with pytest.raises(AttributeError):
        resolved.framework = FRAMEWORKS["torchtitan"]  # type: ignore[misc]
    assert resolve(_spec("gb200")).nvlink_domain == 72  # an NVL72 rack, from the catalogue


def test_the_recipe_asked_for_and_the_kernels_that_run_it():
    assert resolve(_spec("h100")).recipe_name is None and resolve(_spec("h100")).recipe is None
    assert resolve(_spec("h100", "fp8")).recipe_name == "current"  # no block-scaled tensor cores on Hopper
    assert resolve(_spec("b200", "fp8")).recipe is RECIPES["mxfp8"]
    blockwise = resolve(_spec("b200", "fp8", "blockwise"))  # Blackwell emulates FP8 block scaling with MXFP8
    assert (blockwise.recipe_name, blockwise.recipe) == ("blockwise", RECIPES["mxfp8"])
    assert resolve(_spec("b200", "fp4")).recipe is RECIPES["nvfp4"]


def test_the_launch_file_names_the_recipe_the_resolver_decided():
    for spec, flag in ((_spec("b200", "fp8", "blockwise"), "blockwise"), (_spec("h100", "fp8"), "tensorwise"),
                       (_spec("b200", "fp8"), "mxfp8")):
        args = launch_files(Plan(dp=8), resolve(spec))["megatron_args.txt"].split()
        assert args[args.index("--fp8-recipe") + 1] == flag


def test_kernel_settings_the_framework_cannot_run_are_refused_by_the_resolver():
    spec = parse_spec({"model": {"preset": "llama3-8b"}, "training": {"global_batch": 64, "framework": "torchtitan",
                                                                       "kernels": {"cuda_graphs": True}},
                       "cluster": {"device": "h100", "gpus_per_node": 8}})
    with pytest.raises(SpecError, match="training.kernels.cuda_graphs"):
        resolve(spec)


def test_a_measured_device_is_measured_only_when_asked_for():
    resolved = resolve(_spec("cpu"))
    assert resolved.measured and resolved.framework is FRAMEWORKS["pytorch"] and "device" not in vars(resolved)
    with pytest.raises(SpecError, match="runs on GPUs"):
        resolve(parse_spec({"model": {"preset": "gpt2"}, "training": {"global_batch": 8, "framework": "deepspeed"},
                            "cluster": {"device": "cpu", "gpus_per_node": 2}}))


def test_a_device_given_prices_the_spec_in_place_of_its_own():
    resolved = resolve(_spec("h100"), DEVICES["a100-80gb"])
    assert isinstance(resolved, Resolved) and resolved.device is DEVICES["a100-80gb"] and resolved.generation == "ampere"
