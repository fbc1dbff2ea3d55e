"""predictor.graph.modelzoo: every family builds (meta for any size, CPU for small dims) and trains one step."""

from __future__ import annotations

import math
import time

import pytest
import torch

from predictor.graph.modelzoo import (
    GPTModel, build_model, example_inputs, module_args, param_count, training_loss,
)
from predictor.spec.workload import ModelSpec
from tests.model_specs import HF_GPT2, SMALL, TOY, Toy


@pytest.mark.parametrize("family", sorted(SMALL))
def test_family_trains_one_step_on_cpu(family: str) -> None:
    spec = ModelSpec(**SMALL[family])
    torch.manual_seed(0)
    model = build_model(spec, device="cpu")
    assert all(p.device.type == "cpu" for p in model.parameters())
    inputs = example_inputs(spec, 2, device="cpu")
    assert "labels" in inputs
    if family in ("gpt2", "t5", "llama"):
        assert inputs["use_cache"] is False
    before = [p.detach().clone() for p in model.parameters()]
    loss = training_loss(model, inputs, spec)
    assert loss.dim() == 0 and math.isfinite(float(loss.detach()))
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_gpt_initial_loss_is_near_uniform() -> None:
    """Megatron init (std 0.02, tied logits): the first loss is about ln(V)."""
    spec = ModelSpec(**SMALL["gpt"])
    torch.manual_seed(0)
    model = build_model(spec, device="cpu")
    loss = float(training_loss(model, example_inputs(spec, 4, device="cpu"), spec).detach())
    assert abs(loss - math.log(128)) < 0.5


def test_gpt2_below_its_own_vocabulary_keeps_special_tokens_and_loss_in_range() -> None:
    """GPT-2's defaults (tokens 50256, no loss type) made transformers warn on every smaller vocabulary."""
    module = build_model(ModelSpec(**SMALL["gpt2"]))
    assert module.config.bos_token_id == module.config.eos_token_id == SMALL["gpt2"]["vocab"] - 1
    assert module.loss_type == "ForCausalLM"


def test_gpt_parameter_count_closed_form() -> None:
    h, l, s, V = 64, 2, 16, 128
    model = build_model(ModelSpec(**SMALL["gpt"]))
    assert isinstance(model, GPTModel)
    assert param_count(model) == l * (12 * h * h + 13 * h) + V * h + s * h + 2 * h


@pytest.mark.parametrize("preset,expected", [
    ("gpt3-175b", 174.6e9), ("llama2-70b", 68.98e9), ("gpt2-xl", 1.558e9), ("bert-large", 0.335e9),
    ("t5-3b", 2.85e9), ("t5-11b", 11.3e9), ("vit-h14", 0.632e9), ("deit-base", 0.0866e9),
])
def test_presets_build_on_meta_with_published_sizes(preset: str, expected: float) -> None:
    t0 = time.perf_counter()
    model = build_model(ModelSpec(preset=preset))
    assert all(p.is_meta for p in model.parameters())
    assert param_count(model) == pytest.approx(expected, rel=0.01)
    assert time.perf_counter() - t0 < 30


def test_dtype_and_meta_forward() -> None:
    spec = ModelSpec(**SMALL["llama"])
    model = build_model(spec, device="cpu", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    vit = ModelSpec(**SMALL["vit"])
    inputs = example_inputs(vit, 3, device="cpu", dtype=torch.bfloat16)
    assert inputs["pixel_values"].shape == (3, 3, 32, 32) and inputs["pixel_values"].dtype == torch.bfloat16
    assert inputs["labels"].shape == (3,)


def test_hf_config_spec() -> None:
    spec = ModelSpec(**HF_GPT2)
    model = build_model(spec, device="cpu")
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert model.config.n_layer == 2 and model.config.vocab_size == 100
    inputs = example_inputs(spec, 2, device="cpu")
    assert int(inputs["input_ids"].max()) < 100
    training_loss(model, inputs, spec).backward()


def test_module_spec_is_imported_and_called() -> None:
    spec = ModelSpec(**TOY).trusting_module()
    model = build_model(spec, device="cpu")
    assert isinstance(model, Toy) and len(model.blocks) == 3
    inputs = example_inputs(spec, 4, device="cpu")
    assert inputs["input_0"].shape == (4, 8, 16)
    args, kwargs = module_args(spec, inputs)
    assert len(args) == 1 and not kwargs
    loss = training_loss(model, inputs, spec)
    assert loss.dim() == 0
    loss.backward()


def test_bad_module_spec_names_the_problem() -> None:
    with pytest.raises(ValueError, match="cannot import"):
        build_model(ModelSpec(module="no_such_pkg_xyz.mod:f", inputs=[{"shape": [4]}]).trusting_module())
    with pytest.raises(ValueError, match="no callable"):
        build_model(ModelSpec(module="tests.model_specs:nothing_here", inputs=[{"shape": [4]}]).trusting_module())
