"""Model presets: dimensions of well-known models, from their papers and public configs.

Each entry is a `model:` mapping as a user would write it. Sources:
GPT-3: Brown et al. 2020, Table 2.1 (vocab padded to 51,200 as Megatron does).
GPT-2: Radford et al. 2019 / HF `gpt2*` configs. BERT: Devlin et al. 2019.
T5: Raffel et al. 2020 (t5-3b and t5-11b use 32/128 heads with d_kv=128).
ViT: Dosovitskiy et al. 2021, Table 1. DeiT: Touvron et al. 2021, Table 1.
LLaMA-2: Touvron et al. 2023 (70B uses GQA with 8 kv heads). LLaMA-3: Meta model card.
LLaMA-3.1 405B: Meta's HF config (meta-llama/Llama-3.1-405B), as Megatron-Bridge's Llama31ModelProvider405B;
seq_len 8192 as its pretraining recipe (the model's 131,072-token context is for long-context extension).
Llama 3.1 8B/70B and 3.3 70B share Llama 3's dims (HF configs); Llama 3.2 1B/3B tie their embeddings (HF
config.json `tie_word_embeddings: true`); all at 8,192 tokens, their pretraining context.
Dense Qwen and Mistral as Llama-architecture decoders, from Megatron-Bridge's model providers and the HF configs:
Qwen2.5 7B/72B (Qwen25ModelProvider7B/72B: QKV bias, untied, vocab 152,064; LlamaConfig's attention_bias also
gives the output projection a bias, hidden weights a layer more), Qwen3 8B/32B (Qwen3ModelProvider8B/32B:
kv channels 128, 8 query groups, vocab 151,936),
Mistral 7B v0.1 (HF: vocab 32,000, 4,096-token sliding window) and Mistral NeMo 12B (MistralNeMoConfig12B,
HF Mistral-Nemo-Base-2407: kv channels 128, vocab 131,072); seq_len 4,096 as Megatron-Bridge's Qwen3 pretraining
recipe (and Mistral 7B's window, so its full causal attention is the sliding one). Qwen3 dense is its own family
(transformers' Qwen3Config): the per-head q/k RMSNorms are in the built model.
Gemma 2 (2B/9B/27B; Gemma Team 2024, Table 1, and the HF configs google/gemma-2-*: head_dim 256, 27B's 128, 4,096-token
local window on every other layer, 8,192-token context) and Gemma 3 text decoders (1B/4B/12B/27B; Gemma Team 2025 and
the HF text configs: five local layers to one global, window 1,024, the 1B's 512, 27B's head_dim 128, vocab 262,208,
the 1B's 262,144, pre-trained at 32,768 tokens) from transformers' Gemma2Config / Gemma3TextConfig: tied embeddings,
GeGLU (tanh GELU), head_dim != hidden/heads, the sandwich (pre and post) RMSNorms, Gemma 3's q/k norms and the
embedding scale are in the built model, so in the graph. What prices differently: a local layer's fused attention
computes only its window's band (`predictor.models.roofline.sliding_window_work`); unfused attention computes the
whole masked product, as it does. Not priced: Gemma 2's soft-capping of the attention scores inside a fused kernel
(a tanh per score; the eager trace, which unfused frameworks are priced by, has it, and the logits' soft-capping is
traced with the loss), and Gemma 3's vision encoder (its presets are the text decoders). Megatron-LM's arguments
cannot spell Gemma's GeGLU or soft-capping: its launch is refused, saying so. MFU counts the traced FLOPs, every
layer's whole s×s product as for every model, so a local layer's band makes Gemma's MFU read above its useful work.
Mixtures of experts, from each model's HF config.json (mistralai/Mixtral-8x7B-v0.1, mistralai/Mixtral-8x22B-v0.1,
Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B, openai/gpt-oss-120b, deepseek-ai/DeepSeek-V3), cross-checked against
Megatron-Bridge's model providers (Qwen3 235B: 94 layers, 64 heads, 4 query groups, kv channels 128, MoE FFN 1536,
128 experts, top-8); seq_len 4096 as the Megatron-Bridge MoE recipes train them. `deepseek-v3` omits
multi-token prediction, as the recipes' "w/o MTP" rows; `mtp_layers: 1` adds it.

Architectures no family names are presets over their transformers configs (`hf_config:`, traced as transformers
defines them; `predictor.graph.layer_kinds`), each config's fields from the model's published config.json:
Llama 4 Scout and Maverick (meta-llama/Llama-4-Scout-17B-16E, Llama-4-Maverick-17B-128E text_config: every layer MoE
with a shared expert in Scout, every other layer in Maverick, chunked attention of 8,192 tokens with a NoPE global
layer in four), Nemotron-H 8B (nvidia/Nemotron-H-8B-Base-8K: 52 layers of Mamba-2, attention and squared-ReLU MLP in
its hybrid_override_pattern), Nemotron-4 340B (nvidia/Nemotron-4-340B-Base, transformers' NemotronConfig: squared-ReLU
MLP, half-rotary attention), Kimi K2 and Moonlight 16B-A3B (moonshotai/Kimi-K2-Base, moonshotai/Moonlight-16B-A3B:
DeepSeek-V3's architecture, 384 and 64 experts), and Qwen3-Next 80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct: Gated
DeltaNet linear attention in three layers of four, 512 experts). Grok-1 has no transformers class: it is Mixtral's
architecture at its published dimensions (xai-org/grok-1 run.py: 64 layers, 6,144 wide, 48 query and 8 key/value
heads, 8 experts of 32,768, top-2, vocabulary 131,072, embeddings tied to the output). Nemotron-H 56B and Nemotron 3
Nano 30B-A3B are Megatron-Bridge's NemotronHModelProvider56B and Nemotron3NanoProvider (layer patterns, Mamba-2 and
expert dims) as transformers' NemotronHConfig; DeepSeek-V4-Flash is transformers' DeepseekV4Config at its defaults
(deepseek-ai/DeepSeek-V4-Flash-Base: compressed sparse and heavily compressed attention, hash-routed leading MoE
layers, hyper-connections), without its multi-token prediction layer, which the transformers model does not build.
"""

from __future__ import annotations

from typing import Any


def _gpt(hidden: int, layers: int, heads: int) -> dict[str, Any]:
    return {"family": "gpt", "hidden": hidden, "layers": layers, "heads": heads, "seq_len": 2048, "vocab": 51200}


def _gpt2(hidden: int, layers: int, heads: int) -> dict[str, Any]:
    return {"family": "gpt2", "hidden": hidden, "layers": layers, "heads": heads, "seq_len": 1024, "vocab": 50257}


def _bert(hidden: int, layers: int, heads: int) -> dict[str, Any]:
    return {"family": "bert", "hidden": hidden, "layers": layers, "heads": heads, "seq_len": 512, "vocab": 30522}


def _t5(hidden: int, layers: int, heads: int, ffn: int, d_kv: int | None = None) -> dict[str, Any]:
    spec = {"family": "t5", "hidden": hidden, "layers": layers, "heads": heads, "ffn_hidden": ffn, "seq_len": 512,
            "vocab": 32128}
    if d_kv is not None:  # heads × d_kv ≠ hidden: passed to T5Config through kwargs
        spec["kwargs"] = {"d_kv": d_kv}
    return spec


def _vision(family: str, hidden: int, layers: int, heads: int, patch: int, image: int = 224) -> dict[str, Any]:
    return {"family": family, "hidden": hidden, "layers": layers, "heads": heads, "patch_size": patch, "image_size": image}


def _llama(hidden: int, layers: int, heads: int, kv: int, ffn: int, seq: int, vocab: int, head_dim: int | None = None,
           family: str = "llama", sliding_window: int | None = None, **config: Any) -> dict[str, Any]:
    """A dense decoder of Llama's shape (a Llama, Qwen3 or Gemma family); `config`: its transformers config's fields
    beyond the dims (tied embeddings, QKV bias, Gemma's query scale)."""
    spec = {"family": family, "hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv,
            "ffn_hidden": ffn, "seq_len": seq, "vocab": vocab}
    if head_dim is not None:
        spec["head_dim"] = head_dim
    if sliding_window is not None:
        spec["sliding_window"] = sliding_window
    if config:
        spec["kwargs"] = config
    return spec


def _gemma(family: str, hidden: int, layers: int, heads: int, kv: int, ffn: int, seq: int, vocab: int, head_dim: int,
           window: int, **config: Any) -> dict[str, Any]:
    return _llama(hidden, layers, heads, kv, ffn, seq, vocab, head_dim, family=family, sliding_window=window, **config)


def _moe(family: str, hidden: int, layers: int, heads: int, kv: int, ffn: int, vocab: int, experts: int, top_k: int,
         expert_ffn: int | None = None, **extra: Any) -> dict[str, Any]:
    spec = {"family": family, "hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv, "ffn_hidden": ffn,
            "seq_len": 4096, "vocab": vocab, "experts": experts, "top_k": top_k}
    if expert_ffn is not None:
        spec["expert_ffn"] = expert_ffn
    return {**spec, **extra}


def _hf(seq_len: int, **config: Any) -> dict[str, Any]:
    """A preset over a transformers config, trained at `seq_len` tokens."""
    return {"hf_config": config, "seq_len": seq_len}


_LLAMA4 = dict(model_type="llama4_text", hidden_size=5120, num_hidden_layers=48, num_attention_heads=40,
               num_key_value_heads=8, head_dim=128, intermediate_size=8192, intermediate_size_mlp=16384,
               vocab_size=202048, num_experts_per_tok=1, attention_chunk_size=8192, no_rope_layer_interval=4)
_KIMI = dict(model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61, num_attention_heads=64,
             num_key_value_heads=64, intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=384,
             num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=1536, kv_lora_rank=512,
             qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, vocab_size=163840, n_group=1, topk_group=1)
_NEMOTRON_H_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
_NEMOTRON_H_56B = ("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                   "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-")
_NEMOTRON_H = dict(model_type="nemotron_h", num_key_value_heads=8, head_dim=128, mamba_head_dim=64, n_groups=8,
                   conv_kernel=4, vocab_size=131072)

MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "gpt3-125m": _gpt(768, 12, 12),
    "gpt3-350m": _gpt(1024, 24, 16),
    "gpt3-760m": _gpt(1536, 24, 16),
    "gpt3-1.3b": _gpt(2048, 24, 32),
    "gpt3-2.7b": _gpt(2560, 32, 32),
    "gpt3-6.7b": _gpt(4096, 32, 32),
    "gpt3-13b": _gpt(5120, 40, 40),
    "gpt3-175b": _gpt(12288, 96, 96),
    "gpt2": _gpt2(768, 12, 12),
    "gpt2-medium": _gpt2(1024, 24, 16),
    "gpt2-large": _gpt2(1280, 36, 20),
    "gpt2-xl": _gpt2(1600, 48, 25),
    "bert-base": _bert(768, 12, 12),
    "bert-large": _bert(1024, 24, 16),
    "t5-small": _t5(512, 6, 8, 2048),
    "t5-base": _t5(768, 12, 12, 3072),
    "t5-large": _t5(1024, 24, 16, 4096),
    "t5-3b": _t5(1024, 24, 32, 16384, d_kv=128),
    "t5-11b": _t5(1024, 24, 128, 65536, d_kv=128),
    "vit-b16": _vision("vit", 768, 12, 12, 16),
    "vit-l16": _vision("vit", 1024, 24, 16, 16),
    "vit-h14": _vision("vit", 1280, 32, 16, 14),
    "deit-tiny": _vision("deit", 192, 12, 3, 16),
    "deit-small": _vision("deit", 384, 12, 6, 16),
    "deit-base": _vision("deit", 768, 12, 12, 16),
    "llama2-7b": _llama(4096, 32, 32, 32, 11008, 4096, 32000),
    "llama2-13b": _llama(5120, 40, 40, 40, 13824, 4096, 32000),
    "llama2-70b": _llama(8192, 80, 64, 8, 28672, 4096, 32000),
    "llama3-8b": _llama(4096, 32, 32, 8, 14336, 8192, 128256),
    "llama3-70b": _llama(8192, 80, 64, 8, 28672, 8192, 128256),
    "llama3.1-8b": _llama(4096, 32, 32, 8, 14336, 8192, 128256),
    "llama3.1-70b": _llama(8192, 80, 64, 8, 28672, 8192, 128256),
    "llama3.1-405b": _llama(16384, 126, 128, 8, 53248, 8192, 128256),
    "llama3.2-1b": _llama(2048, 16, 32, 8, 8192, 8192, 128256, tie_word_embeddings=True),
    "llama3.2-3b": _llama(3072, 28, 24, 8, 8192, 8192, 128256, tie_word_embeddings=True),
    "llama3.3-70b": _llama(8192, 80, 64, 8, 28672, 8192, 128256),
    "qwen2.5-7b": _llama(3584, 28, 28, 4, 18944, 4096, 152064, attention_bias=True),
    "qwen2.5-72b": _llama(8192, 80, 64, 8, 29568, 4096, 152064, attention_bias=True),
    "qwen3-8b": _llama(4096, 36, 32, 8, 12288, 4096, 151936, head_dim=128, family="qwen3"),
    "qwen3-32b": _llama(5120, 64, 64, 8, 25600, 4096, 151936, head_dim=128, family="qwen3"),
    "mistral-7b": _llama(4096, 32, 32, 8, 14336, 4096, 32000),
    "mistral-nemo-12b": _llama(5120, 40, 32, 8, 14336, 4096, 131072, head_dim=128),
    "gemma2-2b": _gemma("gemma2", 2304, 26, 8, 4, 9216, 8192, 256000, 256, 4096),
    "gemma2-9b": _gemma("gemma2", 3584, 42, 16, 8, 14336, 8192, 256000, 256, 4096),
    "gemma2-27b": _gemma("gemma2", 4608, 46, 32, 16, 36864, 8192, 256000, 128, 4096, query_pre_attn_scalar=144),
    "gemma3-1b": _gemma("gemma3", 1152, 26, 4, 1, 6912, 32768, 262144, 256, 512),
    "gemma3-4b": _gemma("gemma3", 2560, 34, 8, 4, 10240, 32768, 262208, 256, 1024),
    "gemma3-12b": _gemma("gemma3", 3840, 48, 16, 8, 15360, 32768, 262208, 256, 1024),
    "gemma3-27b": _gemma("gemma3", 5376, 62, 32, 16, 21504, 32768, 262208, 128, 1024, query_pre_attn_scalar=168),
    "mixtral-8x7b": _moe("mixtral", 4096, 32, 32, 8, 14336, 32000, 8, 2),
    "mixtral-8x22b": _moe("mixtral", 6144, 56, 48, 8, 16384, 32000, 8, 2),
    "qwen3-30b-a3b": _moe("qwen3_moe", 2048, 48, 32, 4, 6144, 151936, 128, 8, 768, head_dim=128),
    "qwen3-235b-a22b": _moe("qwen3_moe", 4096, 94, 64, 4, 12288, 151936, 128, 8, 1536, head_dim=128),
    "gpt-oss-120b": _moe("gpt_oss", 2880, 36, 64, 8, 2880, 201088, 128, 4, head_dim=64),
    "deepseek-v3": _moe("deepseek_v3", 7168, 61, 128, 128, 18432, 129280, 256, 8, 2048, shared_experts=1,
                        dense_layers=3, router="sigmoid", q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
                        qk_nope_head_dim=128, v_head_dim=128),
    "grok-1": _moe("mixtral", 6144, 64, 48, 8, 32768, 131072, 8, 2, head_dim=128, seq_len=8192,
                   kwargs={"tie_word_embeddings": True}),
    "llama4-scout": _hf(8192, **_LLAMA4, num_local_experts=16, interleave_moe_layer_step=1),
    "llama4-maverick": _hf(8192, **_LLAMA4, num_local_experts=128, interleave_moe_layer_step=2, use_qk_norm=False),
    "nemotron-h-8b": _hf(8192, **_NEMOTRON_H, hidden_size=4096, hybrid_override_pattern=_NEMOTRON_H_8B,
                         num_attention_heads=32, intermediate_size=21504, mamba_num_heads=128, ssm_state_size=128),
    "nemotron-h-56b": _hf(8192, **_NEMOTRON_H, hidden_size=8192, hybrid_override_pattern=_NEMOTRON_H_56B,
                          num_attention_heads=64, intermediate_size=32768, mamba_num_heads=256, ssm_state_size=256),
    "nemotron3-nano-30b-a3b": _hf(8192, **{**_NEMOTRON_H, "num_key_value_heads": 2}, hidden_size=2688,
                                  hybrid_override_pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
                                  num_attention_heads=32, intermediate_size=1856, mamba_num_heads=64,
                                  ssm_state_size=128, n_routed_experts=128, moe_intermediate_size=1856,
                                  moe_shared_expert_intermediate_size=3712, n_shared_experts=1, num_experts_per_tok=6,
                                  routed_scaling_factor=2.5),
    "deepseek-v4-flash": _hf(4096, model_type="deepseek_v4", num_nextn_predict_layers=0),
    "nemotron4-340b": _hf(4096, model_type="nemotron", hidden_size=18432, num_hidden_layers=96,
                          num_attention_heads=96, num_key_value_heads=8, intermediate_size=73728, vocab_size=256000,
                          partial_rotary_factor=0.5, tie_word_embeddings=False),
    "kimi-k2": _hf(4096, **_KIMI),
    "moonlight-16b-a3b": _hf(8192, **{**_KIMI, "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
                                      "num_key_value_heads": 16, "intermediate_size": 11264, "moe_intermediate_size": 1408,
                                      "n_routed_experts": 64, "num_experts_per_tok": 6, "n_shared_experts": 2,
                                      "q_lora_rank": None}),
    "qwen3-next-80b-a3b": _hf(4096, model_type="qwen3_next", hidden_size=2048, num_hidden_layers=48,
                              num_attention_heads=16, num_key_value_heads=2, head_dim=256, intermediate_size=5120,
                              moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts=512,
                              num_experts_per_tok=10, linear_num_value_heads=32, linear_num_key_heads=16,
                              linear_key_head_dim=128, linear_value_head_dim=128, vocab_size=151936),
}
