"""Architectures no family names, as presets over their transformers configs (and Grok-1 at its published
dimensions): built on the meta device with their published parameter counts, traced with one block of each kind
(Mamba-2, Gated DeltaNet, chunked/NoPE attention, dense and MoE MLPs), priced and planned end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from predictor.graph.cache import graph_for
from predictor.graph.modelzoo import build_model, param_count
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.spec.workload import SpecError, parse_spec

# preset: (published total parameters, published active parameters or None, source)
PUBLISHED = {
    "grok-1": (314e9, None),  # xai-org/grok-1 README: 314B parameters, 2 of 8 experts active
    "llama4-scout": (109e9, 17e9),  # Llama 4 model card: 17B active, 109B total (with the vision encoder)
    "llama4-maverick": (400e9, 17e9),  # Llama 4 model card: 17B active, 400B total
    "nemotron-h-8b": (8_100_852_736, None),  # nvidia/Nemotron-H-8B-Base-8K safetensors total
    "nemotron-h-56b": (56e9, None),  # Nemotron-H paper (arXiv 2504.03624): the 56B model
    "nemotron3-nano-30b-a3b": (31.6e9, 3.6e9),  # NVIDIA-Nemotron-3-Nano-30B-A3B card: 31.6B total, 3.6B active with
    # the embeddings (3.2B without)
    "deepseek-v4-flash": (284e9, 13e9),  # deepseek-ai/DeepSeek-V4-Flash card: 284B total, 13B activated
    "nemotron4-340b": (340e9, None),  # Nemotron-4 340B technical report
    "kimi-k2": (1.03e12, 32e9),  # moonshotai/Kimi-K2-Base: 1.03T parameters on its hub page (card: "1T"), 32B activated
    "moonlight-16b-a3b": (16e9, 3e9),  # moonshotai/Moonlight-16B-A3B model card: 16B total, 3B activated
    "qwen3-next-80b-a3b": (80e9, None),  # Qwen/Qwen3-Next-80B-A3B model card: 80B total (its "3B activated" leaves out
    # the embeddings active_params counts)
}


def _vision_encoder(preset: str) -> int:
    """Parameters of the vision encoder and projector a Llama 4 card counts beside the text decoder: transformers'
    Llama4ForConditionalGeneration at its default vision config, built on the meta device."""
    import torch
    from transformers import AutoConfig, Llama4ForConditionalGeneration

    from predictor.spec.presets import MODEL_PRESETS

    text = {k: v for k, v in MODEL_PRESETS[preset]["hf_config"].items() if k != "model_type"}
    with torch.device("meta"):
        model = Llama4ForConditionalGeneration(AutoConfig.for_model("llama4", text_config=text))
    return sum(p.numel() for n, p in model.named_parameters() if "vision_model" in n or "multi_modal_projector" in n)


# Scout's card counts its vision encoder (text decoder 107.8B + 0.46B: 0.7 % below its 109B); Maverick's 400B is
# already within 1 % of its text decoder.
WITH_VISION = {"llama4-scout"}


def _spec(preset: str, **model: object) -> object:
    return parse_spec({"model": {"preset": preset, **model}, "training": {"global_batch": 512, "precision": "bf16"},
                       "cluster": {"device": "h100", "nodes": 32, "gpus_per_node": 8}})


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_published_parameter_counts(preset: str) -> None:
    spec = _spec(preset)
    total, active = PUBLISHED[preset]
    counted = param_count(build_model(spec.model)) + (_vision_encoder(preset) if preset in WITH_VISION else 0)
    assert counted == pytest.approx(total, rel=0.01)
    graph = graph_for(spec.model)
    assert graph.params == param_count(build_model(spec.model))  # every parameter in a traced node
    table = AnalyticalPredictor().predict_table(spec, graph, [Plan(dp=64, tp=4, mbs=1, sp=True)])
    if active is not None:
        assert table.shared_extra["active_params"] == pytest.approx(active, rel=0.15)


def test_a_hybrid_is_traced_with_one_block_of_each_kind() -> None:
    graph = graph_for(_spec("nemotron-h-8b").model)
    mixers = {kind: sum(n.count for n in graph.nodes if n.name.endswith(".mixer") and n.kind == kind)
              for kind in ("ssm", "attention")}
    assert mixers == {"ssm": 24, "attention": 4}  # M and * of its 52-layer pattern
    assert sum(n.count for n in graph.nodes if n.name.endswith("mixer.down_proj")) == 24  # its 24 MLP layers
    ssm = next(n for n in graph.nodes if n.kind == "ssm")
    assert ssm.tp == "heads" and ssm.attrs["heads"] == 128 and ssm.attrs["state"] == 128
    assert graph.num_blocks == 52


def test_dense_reference_experts_are_priced_as_dispatched() -> None:
    """Llama 4's transformers experts run every token through every expert; the graph prices top-1 of 16."""
    spec = _spec("llama4-scout")
    graph = graph_for(spec.model)
    experts = next(n for n in graph.nodes if n.kind == "experts")
    rows = experts.fwd_flops / (6 * experts.attrs["d_in"] * experts.attrs["d_ffn"] * experts.attrs["experts"])
    assert experts.attrs["d_ffn"] == 8192 and rows == pytest.approx(graph.tokens * 1 / 16, rel=0.01)


def test_a_config_field_no_model_builds_is_refused() -> None:
    with pytest.raises(SpecError, match="hf_config.num_nextn_predict_layers 1: the transformers model builds no"):
        parse_spec({"model": {"hf_config": {"model_type": "deepseek_v3", "num_nextn_predict_layers": 1},
                              "seq_len": 4096}, "training": {"global_batch": 8}, "cluster": {"device": "h100"}})


def test_an_unknown_model_type_and_missing_dims_name_the_field() -> None:
    with pytest.raises(SpecError, match="hf_config.model_type 'no_such_model'"):
        parse_spec({"model": {"hf_config": {"model_type": "no_such_model"}}, "training": {"global_batch": 8},
                    "cluster": {"device": "h100"}})
    with pytest.raises(SpecError, match="needs seq_len: give them next to hf_config"):
        parse_spec({"model": {"hf_config": {"model_type": "mamba2", "num_hidden_layers": 2}},
                    "training": {"global_batch": 8}, "cluster": {"device": "h100"}})


# One of each kind planned in the default run (MLA + MoE, chunked attention, Mamba hybrid, linear-attention hybrid, a
# 1T MoE); the others, 3-5 s each, with -m slow.
PLANNED_BY_DEFAULT = {"deepseek-v4-flash", "kimi-k2", "llama4-scout", "nemotron-h-8b", "qwen3-next-80b-a3b"}


@pytest.mark.parametrize("preset", [p if p in PLANNED_BY_DEFAULT else pytest.param(p, marks=pytest.mark.slow)
                                    for p in sorted(PUBLISHED)])
def test_scaledl_plan_plans_it(scaledl, tmp_path: Path, preset: str) -> None:
    scaledl.plan_spec({"model": {"preset": preset}, "training": {"global_batch": 256},
                       "cluster": {"device": "h100", "nodes": 4, "gpus_per_node": 8}, "search": {"max_pp": 2}},
                      tmp_path / "out")


def test_launch_files_spell_a_family_and_refuse_an_architecture_none_spells() -> None:
    from predictor.frameworks import LaunchError
    from predictor.frameworks.launch import launch_files
    from predictor.spec.resolver import resolve

    plan = Plan(dp=32, tp=8, ep=8, sp=True)
    args = launch_files(plan, resolve(_spec("kimi-k2")))["megatron_args.txt"]  # DeepSeek-V3's family: MLA, 1 dense layer
    assert "--multi-latent-attention" in args and "--kv-lora-rank 512" in args and "([0]*1+[1]*60)" in args
    with pytest.raises(LaunchError, match="model_type 'llama4_text': no family record"):
        launch_files(Plan(dp=64, tp=4, sp=True), resolve(_spec("llama4-scout")))


@pytest.mark.parametrize("preset", ["nemotron-h-8b", "nemotron3-nano-30b-a3b"])
def test_megatron_writes_and_reads_back_the_hybrid_layer_pattern(preset: str, tmp_path: Path) -> None:
    """Megatron-LM's pretrain_mamba.py arguments spell the hybrid: --hybrid-override-pattern (checked with
    Megatron-Core's own allocate_layers), the Mamba-2 dims and the E layers' experts; read back, an edited pattern is
    refused."""
    from predictor.frameworks import LaunchError, as_run
    from predictor.frameworks.launch import launch_files, read_back
    from predictor.spec.resolver import resolve

    megatron_hybrid = pytest.importorskip("megatron.core.ssm.mamba_hybrid_layer_allocation")
    spec = _spec(preset)
    plan = Plan(dp=32, tp=2, pp=4, ep=8, sp=True) if "nano" in preset else Plan(dp=64, tp=4, sp=True)
    resolved = resolve(spec)
    files = launch_files(plan, resolved)
    args = files["megatron_args.txt"]
    pattern = spec.model.hf_config["hybrid_override_pattern"]
    assert f"--hybrid-override-pattern '{pattern}'" in args and "pretrain_mamba.py" in files["torchrun.sh"]
    assert megatron_hybrid.allocate_layers(len(pattern), 0.0, 0.0, pattern) == list(pattern)
    from tests.framework_checks import megatron_refusals  # TransformerConfig and parallel_state accept the file

    assert megatron_refusals(args, spec.cluster.gpus) == []
    assert ("--num-experts 128" in args) == ("E" in pattern)
    path = tmp_path / "megatron_args.txt"
    path.write_text(args)
    assert read_back(path, spec) == as_run(plan, resolved.framework, spec)
    path.write_text(args.replace(pattern, pattern.replace("*", "M", 1)))
    with pytest.raises(LaunchError, match="--hybrid-override-pattern"):
        read_back(path, spec)


def test_megatron_refuses_interleaved_and_uneven_pipelines_of_a_hybrid() -> None:
    from predictor.frameworks.launch import run_errors
    from predictor.spec.resolver import resolve

    resolved = resolve(_spec("nemotron-h-8b"))  # 52 layers
    assert any("interleaved" in e for e in run_errors(Plan(dp=32, tp=4, pp=2, v=2, schedule="interleaved", sp=True),
                                                      resolved))
    assert any("evenly over pp=8" in e for e in run_errors(Plan(dp=8, tp=4, pp=8, sp=True), resolved))
    assert run_errors(Plan(dp=16, tp=4, pp=4, sp=True), resolved) == []
