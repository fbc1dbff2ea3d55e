"""The dense presets users type (Llama 3.1/3.2/3.3, Qwen2.5, Qwen3, Mistral): their dims are the published configs'
and the models the zoo builds from them (on meta) have the published parameter counts."""

from __future__ import annotations

import pytest

from predictor.modelzoo import build_model, param_count
from predictor.workload import ModelSpec

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
    # Qwen3's per-head q and k RMSNorms (2 x 128 weights a layer) are left out.
    "qwen3-8b": (4096, 36, 32, 8, 12288, 151936, 128, False, 8_190_735_360, -36 * 256),
    "qwen3-32b": (5120, 64, 64, 8, 25600, 151936, 128, False, 32_762_123_264, -64 * 256),
    "mistral-7b": (4096, 32, 32, 8, 14336, 32000, 128, False, 7_241_732_096, 0),
    "mistral-nemo-12b": (5120, 40, 32, 8, 14336, 131072, 128, False, 12_247_782_400, 0),
}


@pytest.mark.parametrize("preset", sorted(DENSE))
def test_dense_preset_dims_and_parameters(preset: str) -> None:
    hidden, layers, heads, kv, ffn, vocab, head_dim, tied, published, architecture = DENSE[preset]
    model = ModelSpec(preset=preset)
    assert (model.family, model.hidden, model.layers, model.heads, model.kv_heads, model.ffn_hidden_size,
            model.vocab) == ("llama", hidden, layers, heads, kv, ffn, vocab)
    assert (model.head_dim or model.hidden // model.heads) == head_dim
    module = build_model(model)
    assert all(p.is_meta for p in module.parameters())
    assert module.config.head_dim == head_dim and module.config.tie_word_embeddings is tied
    assert param_count(module) == published + architecture
