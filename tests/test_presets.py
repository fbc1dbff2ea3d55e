"""The dense presets users type (Llama 3.1/3.2/3.3, Qwen2.5, Qwen3, Mistral, Gemma 2/3) and Mixtral: their dims are the
published configs' and the models the zoo builds from them (on meta) have the published parameter counts."""

from __future__ import annotations

import pytest

from predictor.frameworks import LaunchError
from predictor.frameworks.launch import launch_files
from predictor.graph.modelzoo import build_model, param_count
from predictor.models.roofline import sliding_window_work
from predictor.plan import Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import ModelSpec, parse_spec

# preset: (hidden, layers, heads, kv heads, ffn, vocab, head width, tied embeddings, the HF checkpoint's parameters,
# what the Llama architecture adds (+) or leaves out (-) of it).
DENSE = {
    "llama3.1-8b": (4096, 32, 32, 8, 14336, 128256, 128, False, 8_030_261_248, 0),
    "llama3.1-70b": (8192, 80, 64, 8, 28672, 128256, 128, False, 70_553_706_496, 0),
    "llama3.2-1b": (2048, 16, 32, 8, 8192, 128256, 64, True, 1_235_814_400, 0),
    "llama3.2-3b": (3072, 28, 24, 8, 8192, 128256, 128, True, 3_212_749_824, 0),
    "llama3.3-70b": (8192, 80, 64, 8, 28672, 128256, 128, False, 70_553_706_496, 0),
    # Qwen2.5 biases q, k and v; LlamaConfig's attention_bias biases the output projection too (hidden a layer).
    "qwen2.5-7b": (3584, 28, 28, 4, 18944, 152064, 128, False, 7_615_616_512, 28 * 3584),
    "qwen2.5-72b": (8192, 80, 64, 8, 29568, 152064, 128, False, 72_706_203_648, 80 * 8192),
    "qwen3-8b": (4096, 36, 32, 8, 12288, 151936, 128, False, 8_190_735_360, 0),
    "qwen3-32b": (5120, 64, 64, 8, 25600, 151936, 128, False, 32_762_123_264, 0),
    "mistral-7b": (4096, 32, 32, 8, 14336, 32000, 128, False, 7_241_732_096, 0),
    "mistral-nemo-12b": (5120, 40, 32, 8, 14336, 131072, 128, False, 12_247_782_400, 0),
}


@pytest.mark.parametrize("preset", sorted(DENSE))
def test_dense_preset_dims_and_parameters(preset: str) -> None:
    hidden, layers, heads, kv, ffn, vocab, head_dim, tied, published, architecture = DENSE[preset]
    model = ModelSpec(preset=preset)
    family = "qwen3" if preset.startswith("qwen3") else "llama"  # Qwen3's per-head q/k RMSNorms: transformers' Qwen3
    assert (model.family, model.hidden, model.layers, model.heads, model.kv_heads, model.ffn_hidden_size,
            model.vocab) == (family, hidden, layers, heads, kv, ffn, vocab)
    assert (model.head_dim or model.hidden // model.heads) == head_dim
    module = build_model(model)
    assert all(p.is_meta for p in module.parameters())
    assert module.config.head_dim == head_dim and module.config.tie_word_embeddings is tied
    assert param_count(module) == published + architecture


# Gemma: (family, hidden, layers, heads, kv heads, ffn, vocab, head width, local window, global layers, the reports'
# non-embedding parameters). Gemma 2's are exact (Gemma Team 2024, Table 1); Gemma 3's are rounded to millions
# (Gemma Team 2025, Table 1: text decoder only, no vision encoder).
GEMMA = {
    "gemma2-2b": ("gemma2", 2304, 26, 8, 4, 9216, 256000, 256, 4096, 13, 2_024_517_888),
    "gemma2-9b": ("gemma2", 3584, 42, 16, 8, 14336, 256000, 256, 4096, 21, 8_324_201_984),
    "gemma2-27b": ("gemma2", 4608, 46, 32, 16, 36864, 256000, 128, 4096, 23, 26_047_480_320),
    "gemma3-1b": ("gemma3", 1152, 26, 4, 1, 6912, 262144, 256, 512, 4, 698e6),
    "gemma3-4b": ("gemma3", 2560, 34, 8, 4, 10240, 262208, 256, 1024, 5, 3_209e6),
    "gemma3-12b": ("gemma3", 3840, 48, 16, 8, 15360, 262208, 256, 1024, 8, 10_759e6),
    "gemma3-27b": ("gemma3", 5376, 62, 32, 16, 21504, 262208, 128, 1024, 10, 25_600e6),
}


@pytest.mark.parametrize("preset", sorted(GEMMA))
def test_gemma_preset_dims_layers_and_parameters(preset: str) -> None:
    family, hidden, layers, heads, kv, ffn, vocab, head_dim, window, global_layers, published = GEMMA[preset]
    model = ModelSpec(preset=preset)
    assert (model.family, model.hidden, model.layers, model.heads, model.kv_heads, model.ffn_hidden_size,
            model.vocab, model.head_dim, model.sliding_window) == (family, hidden, layers, heads, kv, ffn, vocab,
                                                                   head_dim, window)
    module = build_model(model)
    cfg = module.config
    assert cfg.tie_word_embeddings and cfg.head_dim == head_dim and cfg.sliding_window == window
    assert cfg.layer_types.count("full_attention") == global_layers == layers - model.local_layers
    assert cfg.hidden_activation == "gelu_pytorch_tanh"  # GeGLU
    non_embedding = param_count(module) - vocab * hidden  # tied: the embedding is the output layer
    if family == "gemma2":
        assert non_embedding == published
    else:
        assert round(non_embedding / 1e6) == published / 1e6


def test_local_layers_do_their_windows_band_of_fused_attention() -> None:
    """Gemma 3 27B at 32,768 tokens: 52 local layers of window 1,024 do 2w - w^2 of their causal work (w = 1/32), the
    10 global ones all of it; a window as long as the sequence, or no window, leaves attention whole."""
    model = ModelSpec(preset="gemma3-27b")
    w = 1024 / 32768
    assert sliding_window_work(model) == pytest.approx((10 + 52 * (2 * w - w * w)) / 62)
    assert sliding_window_work(model.model_copy(update={"seq_len": 1024})) == 1.0
    assert sliding_window_work(ModelSpec(preset="llama3-8b")) == 1.0
    every_other = ModelSpec(preset="gemma2-9b").model_copy(update={"global_every": 3})
    assert every_other.local_layers == 42 - 14


# Mixtral's totals: the safetensors index of mistralai/Mixtral-8x7B-v0.1 and of Mixtral-8x22B-v0.1 (vocab 32,000;
# its Instruct and v0.3 releases have 32,768), as bf16 bytes / 2.
MIXTRAL = {"mixtral-8x7b": 46_702_792_704, "mixtral-8x22b": 140_620_634_112}


@pytest.mark.parametrize("preset", sorted(MIXTRAL))
def test_mixtral_presets_have_the_published_parameters(preset: str) -> None:
    assert param_count(build_model(ModelSpec(preset=preset))) == MIXTRAL[preset]


def _spec(framework: str, preset: str) -> object:
    return parse_spec({"model": {"preset": preset}, "training": {"global_batch": 64, "framework": framework},
                       "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}})


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "torchtitan"])
def test_no_launch_file_trains_gemma_as_another_model(framework: str) -> None:
    """Megatron-LM's pretrain_gpt.py, Megatron-DeepSpeed's GPT and torchtitan cannot build Gemma: a launch is refused
    with what is missing, while the plan is still predicted."""
    with pytest.raises(LaunchError, match="gemma2"):
        launch_files(Plan(dp=8, mbs=1), resolve(_spec(framework, "gemma2-9b")))


def test_a_window_is_read_from_a_gemma_config_only() -> None:
    """An hf_config's sliding_window prices local layers for Gemma (its layer pattern); Qwen's configs carry one that
    use_sliding_window leaves off, so it is not read."""
    dims = {"hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 128, "sliding_window": 32,
            "head_dim": 64}
    gemma = ModelSpec(hf_config={"model_type": "gemma3_text", **dims})
    qwen = ModelSpec(hf_config={"model_type": "qwen3", **dims, "use_sliding_window": False})
    assert (gemma.family, gemma.sliding_window, gemma.local_layers, gemma.head_dim) == ("gemma3", 32, 5, 64)
    assert (qwen.family, qwen.sliding_window, qwen.local_layers) == ("qwen3", None, 0)
