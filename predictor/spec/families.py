"""Model families, one entry each: what ScaleDL knows of a family is its `Family` record, every family list is derived.

A record bundles a model the way torchtitan's `ModelSpec` does (torchtitan/protocols/train_spec.py): how the model
is built (its transformers model class and the config it is built from, or ScaleDL's Megatron-style GPT), what kind
of model it is (a decoder, whose causal self-attention context parallelism splits; an encoder; an encoder-decoder;
a vision classifier), whether it is a mixture of experts, the tensor-parallel roles of module names of its own, how
each framework's launch file spells it, and the runner's pipeline layout. A family defined elsewhere is one
`register(Family(...))` call (tests/test_toy_family.py).

No torch here: the spec types import this module. The config builders import transformers when called.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

Kind = Literal["decoder", "encoder", "seq2seq", "vision"]
# The runner's pipeline layouts (`predictor.measure.parallelize.layout`), by the module structure they cut.
Layout = Literal["megatron", "hf_decoder", "transformer_h", "masked_lm", "vision", "seq2seq"]
ConfigBuilder = Callable[[Any, dict[str, Any]], Any]  # (ModelSpec, extra config fields) -> transformers config


@dataclass(frozen=True)
class Family:
    """One model family.

    model_class / config: the transformers model class (by name) and the builder of its config from a spec's dims;
        no config: ScaleDL's Megatron-style GPT (`predictor.graph.modelzoo.GPTModel`).
    hf_model_type: the `model_type` of an `hf_config:` spec that builds it.
    moe: a mixture of experts (needs experts and top_k); experts_as: the family a spec of this one with experts is
        built as (Llama with MoE MLPs is Mixtral).
    gated_ffn: its MLP is gated (SwiGLU): the default ffn_hidden is 8h/3 rounded up to 256, else 4h.
    global_every: local-global attention with a sliding window: one layer in N attends to the whole sequence.
    llama_args: Megatron-LM spells it with its Llama flags (SwiGLU, RMSNorm, RoPE, untied embeddings, no biases).
    qk_norm: its attention normalises each head's queries and keys (`--qk-layernorm`).
    extra_parts: what of its architecture no Megatron-style argument list spells (built by Megatron-Bridge's own
        layer specs), named for the refusal.
    launch_names: a framework's name for its model in the launch file; None: that framework ships no such model.
    layout: how the runner cuts it into pipeline units (None: no layout).
    roles: tensor-parallel roles of module names of its own (`predictor.graph.tp_roles` holds the common ones).
    config_defaults: fields its transformers config needs beyond the dims (T5's special token ids).
    expert_biases: its experts' projections carry biases (GPT-OSS).
    eager_attention: traced with transformers' eager attention (no SDPA path: attention sinks, soft-capping).
    loss_type: transformers' loss name where its class name does not name one.
    extra_tokens: positions beyond the patches of a vision model (class, distillation tokens).
    honours: the optional model fields (`OPTIONAL_FIELDS`) its built model and its pricing follow; a spec that sets
        another is refused, naming the field, rather than priced as a model it does not build.
    """

    name: str
    kind: Kind
    model_class: str | None = None
    config: ConfigBuilder | None = None
    hf_model_type: str | None = None
    moe: bool = False
    experts_as: str | None = None
    gated_ffn: bool = False
    global_every: int | None = None
    llama_args: bool = False
    qk_norm: bool = False
    extra_parts: tuple[str, ...] = ()
    launch_names: Mapping[str, str | None] = field(default_factory=dict)
    layout: Layout | None = None
    roles: Mapping[str, str] = field(default_factory=dict)
    config_defaults: Mapping[str, Any] = field(default_factory=dict)
    expert_biases: bool = False
    eager_attention: bool = False
    loss_type: str | None = None
    extra_tokens: int = 0
    honours: frozenset[str] = frozenset()
    router: str = "softmax"  # the score function of its transformers model's router

    @property
    def decoder(self) -> bool:
        """Causal self-attention over one sequence: what context parallelism splits and a fused kernel halves."""
        return self.kind == "decoder"

    @property
    def generative(self) -> bool:
        """A transformers model whose forward takes `use_cache` (traced with it off)."""
        return self.model_class is not None and self.kind in ("decoder", "seq2seq")


# Model fields beyond the dims every family has (hidden, layers, heads, seq_len, vocab), with the value that asks
# for nothing (None: unset; kv_heads equal to heads and head_dim of hidden / heads are plain attention).
OPTIONAL_FIELDS: dict[str, Any] = {
    "kv_heads": None, "head_dim": None, "ffn_hidden": None, "kwargs": {}, "decoder_layers": None,
    "image_size": None, "patch_size": None, "sliding_window": None, "global_every": None, "experts": None,
    "top_k": None, "expert_ffn": None, "shared_experts": 0, "dense_layers": 0, "router": "softmax",
    "q_lora_rank": None, "kv_lora_rank": None, "qk_rope_head_dim": None, "qk_nope_head_dim": None,
    "v_head_dim": None, "mtp_layers": 0,
}
_TEXT = frozenset({"ffn_hidden", "kwargs"})
_DECODER = _TEXT | {"kv_heads", "head_dim", "sliding_window"}
_ROUTED = frozenset({"experts", "top_k", "expert_ffn"})
_MLA = frozenset({"q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"})

FAMILIES: dict[str, Family] = {}
# The families `scaledl profile` measures on the design grids (`predictor.measure.design`), in its order: the ScaleDL paper's.
PROFILED: tuple[str, ...] = ("t5", "gpt2", "bert", "vit", "deit")


def register(family: Family) -> Family:
    """Add a family (replacing one of the same name); the spec types accept it from then on."""
    FAMILIES[family.name] = family
    return family


def family(name: str | None) -> Family | None:
    """The record of a family name (None for a `module:` model, which has no family)."""
    return FAMILIES.get(name) if name is not None else None


def by_hf_model_type(model_type: str) -> Family | None:
    return next((f for f in FAMILIES.values() if f.hf_model_type == model_type), None)


def names(where: Callable[[Family], bool] = lambda f: True) -> tuple[str, ...]:
    """The registered family names for which `where` holds, in registration order."""
    return tuple(f.name for f in FAMILIES.values() if where(f))


# ------------------------------------------------------------------------------------ config builders


def _tf() -> Any:
    import transformers

    return transformers


def _gpt2_config(m: Any, extra: dict[str, Any]) -> Any:
    for key in ("bos_token_id", "eos_token_id"):  # GPT-2's are its last token (50256 of 50257)
        extra.setdefault(key, m.vocab - 1)
    return _tf().GPT2Config(vocab_size=m.vocab, n_positions=m.seq_len, n_embd=m.hidden, n_layer=m.layers,
                            n_head=m.heads, n_inner=m.ffn_hidden_size, **extra)


def _bert_config(m: Any, extra: dict[str, Any]) -> Any:
    return _tf().BertConfig(vocab_size=m.vocab, hidden_size=m.hidden, num_hidden_layers=m.layers,
                            num_attention_heads=m.heads, intermediate_size=m.ffn_hidden_size,
                            max_position_embeddings=max(512, m.seq_len or 0), **extra)


def _t5_config(m: Any, extra: dict[str, Any]) -> Any:
    extra.setdefault("d_kv", m.hidden // m.heads)
    return _tf().T5Config(vocab_size=m.vocab, d_model=m.hidden, d_ff=m.ffn_hidden_size, num_layers=m.layers,
                          num_decoder_layers=m.decoder_layers if m.decoder_layers is not None else m.layers,
                          num_heads=m.heads, feed_forward_proj="relu", **extra)


def _vision_config(config_class: str) -> ConfigBuilder:
    def build(m: Any, extra: dict[str, Any]) -> Any:
        return getattr(_tf(), config_class)(
            hidden_size=m.hidden, num_hidden_layers=m.layers, num_attention_heads=m.heads,
            intermediate_size=m.ffn_hidden_size, image_size=m.image_size, patch_size=m.patch_size,
            num_labels=m.vocab or IMAGENET_CLASSES, **extra)
    return build


IMAGENET_CLASSES = 1000  # a vision model's classes without a `vocab`


def _decoder_config(config_class: str) -> ConfigBuilder:
    """A dense decoder of Llama's shape (Llama, Qwen3, Gemma 2/3): the dims, the head width where the config's
    default is one model's, and Gemma's local-global layer pattern."""
    def build(m: Any, extra: dict[str, Any]) -> Any:
        fam = FAMILIES[m.family]
        if config_class != "LlamaConfig":
            extra.setdefault("head_dim", m.head_dim or m.hidden // m.heads)  # their configs' defaults are one model's
        if fam.global_every is not None:
            extra.update(_local_global(m, fam.global_every))
        return getattr(_tf(), config_class)(
            vocab_size=m.vocab, hidden_size=m.hidden, intermediate_size=m.ffn_hidden_size, num_hidden_layers=m.layers,
            num_attention_heads=m.heads, num_key_value_heads=m.kv_heads or m.heads, max_position_embeddings=m.seq_len,
            **({"head_dim": m.head_dim} if config_class == "LlamaConfig" else {}), **extra)
    return build


def _local_global(m: Any, global_every: int) -> dict[str, Any]:
    """Gemma's local-global layer pattern as its config's layer_types (every `global_every`-th layer global), or all
    layers global without a window (its config's default window would otherwise apply)."""
    layers = m.layers or 0
    if m.sliding_window is None:
        return {"layer_types": ["full_attention"] * layers}
    every = m.global_every or global_every
    return {"sliding_window": m.sliding_window,
            "layer_types": ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]}


def _moe_common(m: Any, extra: dict[str, Any]) -> dict[str, Any]:
    return dict(vocab_size=m.vocab, hidden_size=m.hidden, num_hidden_layers=m.layers, num_attention_heads=m.heads,
                num_key_value_heads=m.kv_heads or m.heads, max_position_embeddings=m.seq_len,
                num_experts_per_tok=m.top_k, **extra)


def _mixtral_config(m: Any, extra: dict[str, Any]) -> Any:
    return _tf().MixtralConfig(intermediate_size=m.expert_ffn_size, num_local_experts=m.experts, head_dim=m.head_dim,
                               **_moe_common(m, extra))


def _qwen3_moe_config(m: Any, extra: dict[str, Any]) -> Any:
    return _tf().Qwen3MoeConfig(intermediate_size=m.ffn_hidden_size, moe_intermediate_size=m.expert_ffn_size,
                                num_experts=m.experts, head_dim=m.head_dim or m.hidden // m.heads,
                                mlp_only_layers=list(range(m.dense_layers)), norm_topk_prob=True,
                                **_moe_common(m, extra))


def _gpt_oss_config(m: Any, extra: dict[str, Any]) -> Any:
    return _tf().GptOssConfig(intermediate_size=m.expert_ffn_size, num_local_experts=m.experts,
                              head_dim=m.head_dim or m.hidden // m.heads, **_moe_common(m, extra))


def _deepseek_v3_config(m: Any, extra: dict[str, Any]) -> Any:
    """Multi-head latent attention, shared experts, leading dense layers, grouped sigmoid routing."""
    groups = 8 if m.experts % 8 == 0 and m.experts >= 64 else 1
    return _tf().DeepseekV3Config(
        intermediate_size=m.ffn_hidden_size, moe_intermediate_size=m.expert_ffn_size, n_routed_experts=m.experts,
        n_shared_experts=m.shared_experts, first_k_dense_replace=m.dense_layers, q_lora_rank=m.q_lora_rank,
        kv_lora_rank=m.kv_lora_rank or 512, qk_rope_head_dim=m.qk_rope_head_dim or 64,
        qk_nope_head_dim=m.qk_nope_head_dim or 128, v_head_dim=m.v_head_dim or 128, n_group=groups,
        topk_group=min(4, groups), **_moe_common(m, extra))


# ------------------------------------------------------------------------------------ the families

_GEMMA_PARTS = ("GeGLU with tanh GELU", "the post-attention and post-MLP RMSNorms")
for _family in (
    Family("gpt", "decoder", layout="megatron", honours=frozenset({"ffn_hidden"})),  # ScaleDL's GPT: MHA, no kwargs
    Family("gpt2", "decoder", "GPT2LMHeadModel", _gpt2_config, "gpt2", layout="transformer_h", loss_type="ForCausalLM",
           honours=_TEXT),
    Family("bert", "encoder", "BertForMaskedLM", _bert_config, "bert", layout="masked_lm", honours=_TEXT),
    Family("t5", "seq2seq", "T5ForConditionalGeneration", _t5_config, "t5", layout="seq2seq",
           config_defaults={"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0},  # google-t5 configs
           honours=_TEXT | {"decoder_layers"}),
    Family("vit", "vision", "ViTForImageClassification", _vision_config("ViTConfig"), "vit", layout="vision",
           extra_tokens=1, honours=_TEXT | {"image_size", "patch_size"}),
    Family("deit", "vision", "DeiTForImageClassification", _vision_config("DeiTConfig"), "deit", layout="vision",
           extra_tokens=2, honours=_TEXT | {"image_size", "patch_size"}),
    Family("llama", "decoder", "LlamaForCausalLM", _decoder_config("LlamaConfig"), "llama", experts_as="mixtral",
           gated_ffn=True, llama_args=True, layout="hf_decoder", launch_names={"torchtitan": "llama3"},
           honours=_DECODER | _ROUTED),
    Family("qwen3", "decoder", "Qwen3ForCausalLM", _decoder_config("Qwen3Config"), "qwen3", gated_ffn=True,
           llama_args=True, qk_norm=True, layout="hf_decoder", launch_names={"torchtitan": "qwen3"}, honours=_DECODER),
    Family("gemma2", "decoder", "Gemma2ForCausalLM", _decoder_config("Gemma2Config"), "gemma2", global_every=2,
           extra_parts=(*_GEMMA_PARTS, "logit soft-capping"), launch_names={"torchtitan": None}, eager_attention=True,
           honours=_DECODER | {"global_every"}),
    Family("gemma3", "decoder", "Gemma3ForCausalLM", _decoder_config("Gemma3TextConfig"), "gemma3_text",
           global_every=6, qk_norm=True, extra_parts=_GEMMA_PARTS, launch_names={"torchtitan": None},
           honours=_DECODER | {"global_every"}),
    Family("mixtral", "decoder", "MixtralForCausalLM", _mixtral_config, "mixtral", moe=True, gated_ffn=True,
           layout="hf_decoder", launch_names={"torchtitan": "llama4"},  # torchtitan's MoE of Mixtral's shape
           honours=_DECODER | _ROUTED),
    Family("qwen3_moe", "decoder", "Qwen3MoeForCausalLM", _qwen3_moe_config, "qwen3_moe", moe=True, gated_ffn=True,
           qk_norm=True, layout="hf_decoder", launch_names={"torchtitan": "qwen3"},
           honours=_DECODER | _ROUTED | {"dense_layers"}),
    Family("deepseek_v3", "decoder", "DeepseekV3ForCausalLM", _deepseek_v3_config, "deepseek_v3", moe=True,
           gated_ffn=True, launch_names={"torchtitan": "deepseek_v3"}, router="sigmoid",
           honours=_TEXT | _ROUTED | _MLA | {"kv_heads", "shared_experts", "dense_layers", "router", "mtp_layers"}),
    Family("gpt_oss", "decoder", "GptOssForCausalLM", _gpt_oss_config, "gpt_oss", moe=True, gated_ffn=True,
           expert_biases=True, eager_attention=True, launch_names={"torchtitan": "gpt_oss"},
           honours=_TEXT | _ROUTED | {"kv_heads", "head_dim"}),
):
    register(_family)
