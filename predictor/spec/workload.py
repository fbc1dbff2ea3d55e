"""Workload specs: the YAML a user writes (model, training settings, cluster), validated at the boundary.

`load_spec(path)` returns a `WorkloadSpec` or raises `SpecError` whose message names the
field, the bad value and what is allowed, so the CLI can print it without a traceback. Whatever the
file holds (binary, megabytes, a YAML alias bomb, 10,000 nested lists, 10**100) it is refused in
bounded time and memory: the file, its nesting and values are bounded before anything walks them.
Model dimensions are always resolved here (from a preset, a HuggingFace config dict or
explicit dims) so every later stage can read `spec.model.hidden` and friends.
"""

from __future__ import annotations

import difflib
import json
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from predictor.spec.families import (FAMILIES, OPTIONAL_FIELDS, Family, by_hf_model_type, family as family_record,
                                names as family_names)
from predictor.spec.hardware import DEVICES, GENERATIONS, RECIPES, runs_recipe, tensor_core_facts
from predictor.spec.presets import MODEL_PRESETS

# Attribute names used by HuggingFace configs of the supported families, in lookup order.
_HF_KEYS: dict[str, tuple[str, ...]] = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads"),
    "ffn_hidden": ("intermediate_size", "n_inner", "d_ff", "ffn_dim"),
    "vocab": ("vocab_size",),
    "seq_len": ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"),
    "image_size": ("image_size",),
    "patch_size": ("patch_size",),
    "decoder_layers": ("num_decoder_layers",),
    "head_dim": ("head_dim",),
    "sliding_window": ("sliding_window",),
}
# What a family's launch file spells beyond the dims (DeepSeek-V3's multi-head latent attention, dense layers).
_HF_FAMILY_KEYS: dict[str, tuple[str, ...]] = {
    "dense_layers": ("first_k_dense_replace",), "q_lora_rank": ("q_lora_rank",), "kv_lora_rank": ("kv_lora_rank",),
    "qk_rope_head_dim": ("qk_rope_head_dim",), "qk_nope_head_dim": ("qk_nope_head_dim",),
    "v_head_dim": ("v_head_dim",),
}
# A mixture of experts in configs of architectures no family names (read only when both experts and top_k are).
_HF_MOE_KEYS: dict[str, tuple[str, ...]] = {
    "experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts"),
    "top_k": ("num_experts_per_tok", "moe_top_k", "num_experts_per_token"),
    "expert_ffn": ("moe_intermediate_size", "expert_intermediate_size"),
    "shared_experts": ("n_shared_experts", "num_shared_experts"),
}

# Upper bounds of model dimensions: far above any trained model (GPT-3 175B: hidden 12,288, 96 layers;
# vocabularies of 256k), far below what overflows a graph or its arithmetic: `layers: 1e12` is a typo, not a workload.
_MAX_WIDTH = 2**20  # hidden, heads, kv_heads; ffn_hidden may be 4x wider
_MAX_LAYERS = 10_000
_MAX_TOKENS = 2**24  # seq_len, vocab, an input dimension or integer id bound
# Cluster bounds: far past any machine built (the largest clusters have ~10^5 GPUs), small enough that rank
# groups and plan enumeration stay cheap.
_MAX_NODES = 100_000
_MAX_GPUS_PER_NODE = 1024
_MAX_IMAGE = 2**16  # image_size, patch_size
_MAX_ELEMENTS = 2**60  # of one tensor: torch counts its bytes in an int64

# Bounds of the spec file itself, so reading it takes bounded time and memory whatever it holds.
_MAX_BYTES = 1 << 20  # a spec is a few hundred bytes; an inline hf_config a few kB
_MAX_DEPTH = 32  # PyYAML composes recursively: 10,000 nested lists would end in a RecursionError
_MAX_VALUES = 10_000  # counted with aliases expanded: a "billion laughs" is refused before anything walks it
_MAX_NUMBER = 2**53  # beyond it floats skip integers and numpy's int64 arithmetic overflows
_MAX_STRING = 4096  # PATH_MAX: the longest string a spec needs (a device_profile path)
_MAX_ERRORS = 10  # validation errors listed; a spec of 2,000 unknown keys gets one screen, not 2,000 lines


def registered(name: str | None, registry: Mapping[str, Any], what: str, plural: str) -> str | None:
    """`name` if the registry holds it (or None), else a ValueError with the closest name: usually a typo."""
    if name is None or name in registry:
        return name
    close = difflib.get_close_matches(name, list(registry), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(f"unknown {what}; {hint}{plural}: {', '.join(registry)}")


class SpecError(ValueError):
    """A workload spec that cannot be used; the message is meant for the user as is."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Strict):
    """One forward argument of a user `module:` model, without the batch dimension."""

    shape: list[Annotated[int, Field(strict=True, gt=0, le=_MAX_TOKENS)]] = Field(max_length=8)
    dtype: Literal["int64", "float32", "float16", "bfloat16"] = "float32"
    high: int | None = Field(default=None, strict=True, gt=0, le=_MAX_TOKENS,
                             description="exclusive upper bound of random integer inputs")


class ModelSpec(_Strict):
    """The model: a family with dims, a preset, a HuggingFace config dict, or an opt-in `module:` factory."""

    family: str | None = None
    preset: str | None = None
    hf_config: dict[str, Any] | None = None
    module: str | None = Field(default=None, description="'package.module:factory' returning an nn.Module")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    inputs: list[InputSpec] | None = None

    hidden: int | None = Field(default=None, strict=True, gt=0, le=_MAX_WIDTH)
    layers: int | None = Field(default=None, strict=True, gt=0, le=_MAX_LAYERS,
                               description="transformer layers (encoder layers for t5)")
    decoder_layers: int | None = Field(default=None, strict=True, ge=0, le=_MAX_LAYERS,
                                       description="t5 decoder layers (default: layers)")
    heads: int | None = Field(default=None, strict=True, gt=0, le=_MAX_WIDTH)
    kv_heads: int | None = Field(default=None, strict=True, gt=0, le=_MAX_WIDTH,
                                 description="key/value heads for grouped-query attention")
    ffn_hidden: int | None = Field(default=None, strict=True, gt=0, le=4 * _MAX_WIDTH)
    seq_len: int | None = Field(default=None, strict=True, gt=0, le=_MAX_TOKENS)
    vocab: int | None = Field(default=None, strict=True, gt=0, le=_MAX_TOKENS)
    image_size: int | None = Field(default=None, strict=True, gt=0, le=_MAX_IMAGE)
    patch_size: int | None = Field(default=None, strict=True, gt=0, le=_MAX_IMAGE)
    # Mixture of experts (the MoE families; `llama` with experts is built as Mixtral, Llama with MoE MLPs).
    experts: int | None = Field(default=None, strict=True, gt=0, le=65536, description="routed experts per MoE layer")
    top_k: int | None = Field(default=None, strict=True, gt=0, le=64, description="experts each token is routed to")
    expert_ffn: int | None = Field(default=None, strict=True, gt=0, le=4 * _MAX_WIDTH,
                                   description="FFN width of one expert (default: ffn_hidden)")
    shared_experts: int = Field(default=0, strict=True, ge=0, le=64, description="experts every token passes (DeepSeek)")
    dense_layers: int = Field(default=0, strict=True, ge=0, le=_MAX_LAYERS,
                              description="leading layers with a dense MLP instead of experts (DeepSeek-V3: 3)")
    router: Literal["softmax", "sigmoid"] = Field(default="softmax", description="router score function")
    head_dim: int | None = Field(default=None, strict=True, gt=0, le=4096,
                                 description="attention head width when heads x head_dim != hidden (Qwen3, Gemma, "
                                             "GPT-OSS)")
    sliding_window: int | None = Field(default=None, strict=True, gt=0, le=_MAX_TOKENS,
                                       description="tokens a local attention layer attends to (Gemma 2: 4096, "
                                                   "Gemma 3: 1024)")
    global_every: int | None = Field(default=None, strict=True, gt=0, le=_MAX_LAYERS,
                                     description="with sliding_window: one layer in global_every attends to the whole "
                                                 "sequence (default: the family's, Gemma 2: 2, Gemma 3: 6; else none)")
    # Multi-head latent attention (deepseek_v3): low-rank query and key/value projections, rope/no-rope head parts.
    q_lora_rank: int | None = Field(default=None, strict=True, gt=0, le=_MAX_WIDTH)
    kv_lora_rank: int | None = Field(default=None, strict=True, gt=0, le=_MAX_WIDTH)
    qk_rope_head_dim: int | None = Field(default=None, strict=True, gt=0, le=4096)
    qk_nope_head_dim: int | None = Field(default=None, strict=True, gt=0, le=4096)
    v_head_dim: int | None = Field(default=None, strict=True, gt=0, le=4096)
    mtp_layers: int = Field(default=0, strict=True, ge=0, le=8,
                            description="multi-token prediction depth (DeepSeek-V3 trains with 1; its presets omit it)")
    # Whether the user let this spec's `module:` run (`--trust-module`, `trust_module=True`): never read from the spec
    # itself (a private attribute is no field), kept by copies and pickles, so the model zoo imports nothing without it.
    _module_trusted: bool = PrivateAttr(default=False)

    @property
    def module_trusted(self) -> bool:
        return self._module_trusted

    def trusting_module(self) -> "ModelSpec":
        """This model with its `module:` allowed to run: the caller's decision, as `--trust-module` is the user's."""
        trusted = self.model_copy()
        trusted._module_trusted = True
        return trusted

    @field_validator("family")
    @classmethod
    def _known_family(cls, name: str | None) -> str | None:
        """A name outside the registry (`predictor.spec.families.FAMILIES`, read now: a family registered after import is
        a choice too), with the closest one."""
        return registered(name, FAMILIES, "family", "families")

    @model_validator(mode="before")
    @classmethod
    def _resolve_sources(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        # One source defines the model: a preset, an HF config file, a module, or else family + dims.
        # Keys next to a preset or a config override it; a module's model has no family.
        bases = [k for k in ("preset", "hf_config", "module") if data.get(k) is not None]
        if "module" in bases and data.get("family") is not None:
            bases.append("family")
        if len(bases) > 1:
            raise ValueError(f"give one of family+dims, preset, hf_config or module, not {' and '.join(bases)}")
        if not bases and data.get("family") is None:
            raise ValueError("give one of: family (with hidden/layers/heads/...), preset, hf_config or module")
        if "preset" in bases:
            name = data["preset"]
            if name not in MODEL_PRESETS:
                raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(sorted(MODEL_PRESETS))}")
            preset = MODEL_PRESETS[name]
            if preset.get("hf_config") is not None:  # a preset that names a transformers config
                given = {k: v for k, v in data.items() if v is not None and k != "preset"}
                return {**_into_config({**preset, **given}), "preset": name}
            merged = dict(preset)
            merged.update({k: v for k, v in data.items() if v is not None})  # explicit keys override the preset
            return merged
        if "hf_config" in bases:
            return _into_config({k: v for k, v in data.items() if v is not None})
        return data

    @model_validator(mode="after")
    def _check_dims(self) -> "ModelSpec":
        if self.module is not None:
            if ":" not in self.module:
                raise ValueError(f"module must look like 'package.module:factory', got {self.module!r}")
            if not self.inputs:
                raise ValueError("a module: model needs inputs: [{shape: [...], dtype: ...}] to trace it")
            return self
        fam = self.family_entry
        missing = [k for k in ("hidden", "layers", "heads") if getattr(self, k) is None]
        if self.vision:
            missing += [k for k in ("image_size", "patch_size") if getattr(self, k) is None]
        else:
            missing += [k for k in ("seq_len", "vocab") if getattr(self, k) is None]
        if missing:
            what = self.family or f"hf_config {(self.hf_config or {}).get('model_type')!r}"
            raise ValueError(f"model {what} needs {', '.join(missing)}" +
                             (": give them next to hf_config" if self.hf_config else ""))
        assert self.hidden and self.heads
        if self.hidden % self.heads and not self.any_architecture:
            raise ValueError(f"heads={self.heads} must divide hidden={self.hidden}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        if (self.experts is None) != (self.top_k is None) or (fam is not None and fam.moe and self.experts is None):
            raise ValueError(f"a mixture of experts needs both experts and top_k (model {self.family})")
        if self.experts is not None and not ((self.any_architecture or (fam is not None and (fam.moe or fam.experts_as)))
                                             and self.top_k <= self.experts):
            with_experts = family_names(lambda f: f.moe or f.experts_as is not None)
            raise ValueError(f"experts={self.experts}, top_k={self.top_k}: experts need a decoder family "
                             f"({', '.join(with_experts)}) and top_k <= experts")
        if fam is not None and self.hf_config is None:  # an hf_config's fields are its config's (`_into_config`)
            self._check_honoured(fam)
        if self.global_every is not None and self.sliding_window is None:
            raise ValueError(f"global_every={self.global_every} needs a sliding_window for the other layers")
        if self.dense_layers >= (self.layers or 0) and self.experts is not None and self.hf_config is None:
            raise ValueError(f"dense_layers={self.dense_layers} leaves no MoE layer of layers={self.layers}")
        if self.vision and self.image_size % self.patch_size:  # type: ignore[operator]
            raise ValueError(f"patch_size={self.patch_size} must divide image_size={self.image_size}")
        scores = self.heads * self.tokens**2  # the largest tensor of one sample, which tracing builds
        if scores > _MAX_ELEMENTS:
            raise ValueError(f"{self.tokens:,} tokens per sample with heads={self.heads} make {scores:,} attention "
                             f"scores, more than the {_MAX_ELEMENTS:,} a tensor holds; give fewer tokens or heads")
        return self

    def _check_honoured(self, fam: Family) -> None:
        """Refuse a field the family's model does not build (gpt's kv_heads, mixtral's shared_experts), naming it."""
        plain = {"kv_heads": self.heads, "head_dim": (self.hidden or 0) // (self.heads or 1)}
        for name, unset in OPTIONAL_FIELDS.items():
            value = getattr(self, name)
            if name not in fam.honours and value != unset and value != plain.get(name, unset):
                builds = ", ".join(f for f in OPTIONAL_FIELDS if f in fam.honours) or "none of them"
                raise ValueError(f"{name}={_shown(value)}: family {fam.name} does not build it, so it would be "
                                 f"priced as a model it is not; remove it or use a family that does (its optional "
                                 f"fields: {builds})")

    @property
    def ffn_hidden_size(self) -> int:
        """FFN width: explicit, else the family's convention (LLaMA's SwiGLU 8h/3 rounded to 256, else 4h)."""
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        h = self.hidden or 0
        fam = self.family_entry
        if fam is not None and fam.gated_ffn:
            return 256 * ((int(8 * h / 3) + 255) // 256)
        return 4 * h

    @property
    def is_moe(self) -> bool:
        return self.experts is not None

    @property
    def local_layers(self) -> int:
        """Layers whose attention slides over the last `sliding_window` tokens (the rest attend globally): all but
        every `global_every`-th layer, the family's pattern by default (0 without a window)."""
        if self.sliding_window is None:
            return 0
        layers = self.layers or 0
        fam = self.family_entry
        every = self.global_every or (fam.global_every if fam is not None else None)
        return layers - layers // every if every else layers

    @property
    def family_entry(self) -> Family | None:
        """The family's record (None for a `module:` model)."""
        return family_record(self.family)

    @property
    def any_architecture(self) -> bool:
        """An `hf_config:` of an architecture no family names: built and traced as transformers defines it."""
        return self.hf_config is not None and self.family is None

    @property
    def decoder(self) -> bool:
        """A decoder: causal self-attention over one sequence (a decoder family, or any causal LM of an hf_config)."""
        fam = self.family_entry
        return self.any_architecture or (fam is not None and fam.decoder)

    @property
    def seq2seq(self) -> bool:
        """An encoder-decoder family: two block lists, `layers` and `decoder_layers`."""
        fam = self.family_entry
        return fam is not None and fam.kind == "seq2seq"

    @property
    def vision(self) -> bool:
        """A vision family: image_size and patch_size instead of seq_len and vocab."""
        fam = self.family_entry
        return fam is not None and fam.kind == "vision"

    @property
    def expert_ffn_size(self) -> int:
        return self.expert_ffn or self.ffn_hidden_size

    @property
    def num_blocks(self) -> int:
        """Transformer blocks a pipeline splits (encoder + decoder for t5)."""
        layers = self.layers or 0
        if self.seq2seq:
            return layers + (self.decoder_layers if self.decoder_layers is not None else layers)
        return layers

    @property
    def tokens(self) -> int:
        """Sequence positions per sample (patches + class/distillation tokens for vision models; a `module:`
        model's first input's leading dimension when it is a sequence: token ids, or a [positions, features]
        tensor; else one position)."""
        if self.module is not None:
            first = (self.inputs or [None])[0]
            if first is not None and first.shape and (first.dtype == "int64" or len(first.shape) >= 2):
                return int(first.shape[0])
            return 1
        if self.vision:
            patches = (self.image_size // self.patch_size) ** 2  # type: ignore[operator]
            return patches + self.family_entry.extra_tokens  # type: ignore[union-attr]
        return self.seq_len or 0


# Precisions whose linears' GEMMs run on low-precision tensor cores while the rest of the step stays in BF16.
LOW_PRECISIONS: tuple[str, ...] = ("fp8", "fp4")
# Transformer Engine's recipes (`hardware.RECIPES`, priced by predictor.models.lowprec), by the precision their GEMMs
# run in.
RECIPE_PRECISION: dict[str, str] = {name: recipe.precision for name, recipe in RECIPES.items()}


class KernelsSpec(_Strict):
    """Framework settings that change the kernels a layer runs (`predictor.frameworks.kernels`); unset: the
    framework's default."""

    attention: Literal["flash", "cudnn", "unfused"] | None = Field(
        default=None, description="attention backend: FlashAttention, cuDNN's fused attention (Transformer Engine) or "
                                  "unfused (QK^T GEMM, masked softmax over the scores, x V GEMM; Megatron-LM "
                                  "--attention-backend); default: the framework's (Megatron-Core: flash on Ampere, "
                                  "cuDNN on Hopper and later; torchtitan: flash; DeepSpeed: unfused)")
    cuda_graphs: bool | None = Field(default=None, description="replay parts of the step as CUDA graphs (default off)")
    cuda_graph_scope: str | None = Field(
        default=None, description="what the CUDA graphs capture: layer (each whole layer, the default), "
                                  "full_iteration, or attn, moe_router, moe_preprocess joined by '+' (Megatron-LM "
                                  "--cuda-graph-scope)")
    transformer_engine: bool | None = Field(
        default=None, description="Transformer Engine's layers (Megatron-Core's default) or the framework's own")
    fused_softmax: bool | None = Field(default=None, description="the masked-softmax fusion of unfused attention "
                                                                 "(default on)")
    fused_bias_gelu: bool | None = Field(default=None, description="the bias-GeLU fusion (default on)")
    fused_grad_accum: bool | None = Field(
        default=None, description="weight gradients accumulated into the fp32 main gradient by the GEMM (default on)")
    moe_permute_fusion: bool | None = Field(
        default=None, description="MoE token permutations as Transformer Engine's fused kernels (Megatron-LM "
                                  "--moe-permute-fusion; default: on in Megatron-Core, as Megatron-Bridge's MoE "
                                  "models set it; torchtitan and DeepSpeed permute with PyTorch operators)")
    moe_router_fusion: bool | None = Field(
        default=None, description="the MoE router's score, top-k and auxiliary-loss kernels fused (Megatron-LM "
                                  "--moe-router-fusion; default off)")


class TrainingSpec(_Strict):
    global_batch: int = Field(strict=True, gt=0, le=_MAX_TOKENS, description="samples per iteration over all data-parallel ranks")
    precision: Literal["fp32", "fp16", "bf16", "fp8", "fp4"] = "bf16"
    recipe: Literal[tuple(RECIPE_PRECISION)] | None = Field(
        default=None, description="fp8/fp4: Transformer Engine's scaling recipe (FP8 delayed or current per-tensor "
                                  "scaling, FP8 block scaling, MXFP8; torchao's row-wise float8, rowwise; NVFP4 for fp4); default MXFP8 for fp8 on a "
                                  "device with block-scaled tensor cores (Blackwell), else current scaling")
    optimizer: Literal["adam", "sgd", "muon"] = Field(
        default="adam", description="adam; sgd (momentum); muon: Muon on the matrices, Adam on the rest (Megatron-Core's "
                                    "muon, its layer-wise distributed dist_muon under zero=1; predictor.costs.muon)")
    lora_rank: int | None = Field(
        default=None, strict=True, gt=0, le=_MAX_WIDTH,
        description="LoRA fine-tuning: adapters of this rank on every block linear, the base model frozen "
                    "(Megatron-Bridge's PEFT LoRA; predictor.costs.lora); default: every weight trains")
    document_tokens: int | None = Field(
        default=None, strict=True, gt=0, le=_MAX_TOKENS,
        description="packed sequences (SFT): documents of about this many tokens packed into each sequence, attention "
                    "within each (a variable-length fused kernel); default: one document per sequence")
    bf16_first_layers: int = Field(
        default=0, strict=True, ge=0, le=_MAX_LAYERS,
        description="fp8/fp4: the first N transformer layers run their linears in BF16 (Megatron-Core's "
                    "--first-last-layers-bf16 --num-layers-at-start-in-bf16, torchtitan's filter_fqns)")
    bf16_last_layers: int = Field(
        default=0, strict=True, ge=0, le=_MAX_LAYERS,
        description="fp8/fp4: the last N transformer layers run their linears in BF16 (--num-layers-at-end-in-bf16)")
    kernels: KernelsSpec | None = Field(default=None, description="framework settings that change the kernels")
    moe_imbalance: float | None = Field(
        default=None, ge=1.0, le=1024.0,
        description="MoE routing: the tokens the busiest expert rank receives over the balanced share (measured, or "
                    "assumed), which stretches the experts' time, the dispatch and the dispatcher's buffers; default "
                    "balanced (1.0), as the published runs force it")
    compile: bool | None = Field(
        default=None, description="torch.compile of each transformer block and of the loss (torchtitan's [compile] "
                                  "enable, components model and loss); default: the framework's choice (torchtitan "
                                  "compiles where float8 or async TP need it to pay off; the others never compile)")
    framework: str | None = Field(
        default=None, description="what trains it: a framework registered in predictor.frameworks (its runnable plans "
                                  "and overlap), checked by predictor.spec.resolver.resolve; default Megatron-Core on a "
                                  "catalogue GPU, ScaleDL's own runner (pytorch) on a measured device")

    framework_version: str | None = Field(
        default=None, description="the framework release the job runs (its launch file and rules follow it); "
                                  "default: the newest each framework module names (predictor.frameworks: "
                                  "Framework.versions); checked by predictor.spec.resolver.resolve")


def _is_kernel_profile(path: str) -> bool:
    """Whether the JSON file at `path` is a kernel profile (it has GEMM points), not a CPU's device.json."""
    try:
        return "gemm" in json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False


class LinkSpec(_Strict):
    bandwidth_gbps: float = Field(gt=0, description="achievable bus bandwidth, GB/s one direction")
    latency_us: float = Field(ge=0)


class ClusterSpec(_Strict):
    device: str
    nodes: int = Field(default=1, strict=True, gt=0, le=_MAX_NODES)
    gpus_per_node: int = Field(default=8, strict=True, gt=0, le=_MAX_GPUS_PER_NODE)
    nvlink_domain: int | None = Field(
        default=None, strict=True, gt=0, le=_MAX_NODES, description="GPUs that share one NVLink domain, a multiple of gpus_per_node (default: "
                                        "the device's, e.g. 72 for an NVL72 rack, else gpus_per_node)")
    intra_node: LinkSpec | None = None
    inter_node: LinkSpec | None = None
    device_profile: str | None = Field(
        default=None, description="a measured device profile to price the workload with: for cpu a device.json from "
                                  "`scaledl profile` or a dataset, or a kernel profile (`scaledl profile --kernels`) "
                                  "instead of measuring this machine; for a GPU a kernel profile of the cluster")

    @model_validator(mode="after")
    def _known_device(self) -> "ClusterSpec":
        if self.device not in DEVICES:
            raise ValueError(f"unknown device {self.device!r}; known devices: {', '.join(DEVICES)}")
        if self.device_profile is not None:
            if not Path(self.device_profile).is_file():
                raise ValueError(f"device_profile {self.device_profile!r} does not exist; give the path of a device.json "
                                 f"written by `scaledl profile` (or remove it to measure this machine)")
            if DEVICES[self.device] is not None and not _is_kernel_profile(self.device_profile):
                raise ValueError(f"device_profile {self.device_profile!r} is not a kernel profile; a GPU ({self.device!r}) "
                                 f"takes one written by `scaledl profile --device cuda --kernels PATH` on its cluster")
        return self

    @model_validator(mode="after")
    def _whole_nodes_per_nvlink_domain(self) -> "ClusterSpec":
        # A domain is whole nodes (an NVL72 rack is 18 trays of 4 GPUs): a node never straddles two domains.
        domain = self.nvlink_domain_gpus
        if domain % self.gpus_per_node:
            given = "nvlink_domain" if self.nvlink_domain is not None else f"the {self.device} NVLink domain"
            raise ValueError(f"{given} ({domain} GPUs) must be a positive multiple of gpus_per_node "
                             f"({self.gpus_per_node}); set nvlink_domain or gpus_per_node so nodes tile it")
        return self

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nvlink_domain_gpus(self) -> int:
        """GPUs one NVLink fabric joins (collectives inside it run at NVLink speed): the spec's, else the
        device's (72 on GB200/GB300 NVL72 racks), else one node. Not capped at the cluster's GPUs."""
        if self.nvlink_domain is not None:
            return self.nvlink_domain
        device = DEVICES.get(self.device)
        domain = device.extra.get("nvlink_domain") if device is not None else None
        return int(domain) if domain is not None else self.gpus_per_node


class WorkloadSpec(_Strict):
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    search: dict[str, Any] | None = Field(default=None, description="optional narrowing of the plan search space")

    @model_validator(mode="after")
    def _bf16_layers(self) -> "WorkloadSpec":
        t = self.training
        kept = t.bf16_first_layers + t.bf16_last_layers
        if kept and t.precision not in LOW_PRECISIONS:
            raise ValueError(f"training.bf16_first_layers/bf16_last_layers keep layers in BF16 out of FP8 or FP4: "
                             f"training.precision {t.precision!r} runs every layer in it already; remove them")
        if kept > self.model.num_blocks:
            raise ValueError(f"training.bf16_first_layers + bf16_last_layers = {kept} exceeds the model's "
                             f"{self.model.num_blocks} layers")
        return self

    @model_validator(mode="after")
    def _precision_on_device(self) -> "WorkloadSpec":
        # Refused here rather than priced at another precision's peak later.
        precision, name = self.training.precision, self.cluster.device
        device = DEVICES[name]
        if device is None:  # measured (cpu): its profile times fp32/fp16/bf16 matmuls, never fp8 or fp4
            if precision in ("fp8", "fp4"):
                raise ValueError(f"training.precision {precision!r} is not available on device {name!r}: it is "
                                 f"measured in fp32, fp16 and bf16 only")
        elif precision not in device.peak_flops:
            raise ValueError(f"training.precision {precision!r} is not available on device {name!r}; its "
                             f"precisions: {', '.join(device.peak_flops)}: set training.precision to one of them")
        recipe = self.training.recipe
        if recipe is not None:
            wanted = RECIPE_PRECISION[recipe]
            if wanted != precision:
                fits = [r for r, p in RECIPE_PRECISION.items() if p == precision]
                fix = f"a recipe of {precision} ({', '.join(fits)})" if fits else "no recipe"
                raise ValueError(f"training.recipe {recipe!r} runs {wanted} GEMMs, not {precision}: set "
                                 f"training.precision to {wanted}, or {fix}")
            runs = tensor_core_facts(GENERATIONS[name])["recipes"]
            if not runs_recipe(recipe, GENERATIONS[name]):
                raise ValueError(f"training.recipe {recipe!r} needs block-scaled tensor cores (Blackwell); device "
                                 f"{name!r} has none: set training.recipe to one it runs ({', '.join(runs)}) or use a "
                                 f"Blackwell device")
        return self


def _dims_from_hf(config: Any) -> dict[str, Any]:
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError(_NOT_A_CONFIG)
    if config.get("num_nextn_predict_layers"):  # DeepSeek's config field; its transformers models build no MTP
        raise ValueError(f"hf_config.num_nextn_predict_layers {config['num_nextn_predict_layers']!r}: the transformers "
                         f"model builds no multi-token prediction layers from it, so they would go unpriced; remove "
                         f"it, or give a DeepSeek-V3-shaped model as family deepseek_v3 (or preset deepseek-v3) with "
                         f"mtp_layers")
    model_type = config["model_type"]
    fam = by_hf_model_type(model_type)
    if fam is not None:  # the family's dims from the config given, its defaults filled in where it gives none
        try:
            resolved: Any = _resolved_hf_config(config)
        except ValueError:  # a family registered under a model_type transformers does not know: the config given
            resolved = config
        dims: dict[str, Any] = {"family": fam.name, **_read_keys(resolved, _HF_KEYS), **_read_keys(config, _HF_KEYS)}
        if fam.global_every is None:  # Qwen's configs carry a window that use_sliding_window leaves off
            dims.pop("sliding_window", None)
        if fam.moe:  # its experts and what else of them the family's launch files spell (MLA, leading dense layers)
            dims.update(_read_keys(resolved, _HF_MOE_KEYS), router=fam.router)
            dims.update(_read_keys(resolved, _HF_FAMILY_KEYS))
        return {k: v for k, v in dims.items() if k not in OPTIONAL_FIELDS or k in fam.honours}  # what it builds
    # Any other architecture transformers defines: its dims read from the whole config (defaults and derived fields
    # included), the layer graph traced from the model itself (predictor.graph.build).
    resolved = _resolved_hf_config(config)
    text = resolved.get_text_config() if hasattr(resolved, "get_text_config") else resolved  # a multimodal config's
    dims = {k: v for k, v in _read_keys(text, {**_HF_KEYS, **_HF_MOE_KEYS}).items()
            if k != "sliding_window" and (k not in _HF_MOE_KEYS or v)}
    dims.update(_local_attention(text))
    dims.setdefault("heads", 1)  # a recurrent model (RWKV) has no attention heads: tensor parallelism cannot split them
    if ("experts" in dims) != ("top_k" in dims) or not _has_moe_layers(text):
        dims = {k: v for k, v in dims.items() if k not in _HF_MOE_KEYS}
    return dims


_NOT_A_CONFIG = "hf_config must be a mapping with a model_type (e.g. {model_type: gpt2, n_layer: 12, ...})"
# Fields beside an hf_config that are not the config's: the training sequence and what names the model.
_BESIDE_CONFIG = ("hf_config", "seq_len", "preset", "family")


def _into_config(data: dict[str, Any]) -> dict[str, Any]:
    """An hf_config spec whose explicit dims (`layers: 24` beside a preset's config) are written into the config, so
    the model built is the one the spec names; a field no config key holds is an error naming it."""
    if not isinstance(data["hf_config"], dict) or "model_type" not in data["hf_config"]:
        raise ValueError(_NOT_A_CONFIG)
    config = dict(data["hf_config"])
    keys = {**_HF_KEYS, **_HF_MOE_KEYS}
    for field, value in data.items():
        if field in _BESIDE_CONFIG:
            continue
        if field not in keys:
            raise ValueError(f"{field}: an hf_config model is built from its config alone; set the config's own "
                             f"field in hf_config instead")
        config[next((k for k in keys[field] if k in config), keys[field][0])] = value
    return {**_dims_from_hf(config), "hf_config": config,
            **{k: data[k] for k in ("seq_len", "family") if data.get(k) is not None}}


def _read_keys(config: Any, keys: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """Each spec field from the first of its config keys the config (a dict, or a config object: its derived
    properties too) holds and sets: a None is no value."""
    def get(key: str) -> Any:
        try:  # a config may refuse a field that differs per layer (AmbiguousGlobalPerLayerAttributeError)
            value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
        except Exception:  # noqa: BLE001 - such a field has no one value: none is read
            return None
        return None if isinstance(value, (list, dict)) else value  # a per-layer width (Gemma 3n) is no one value

    return {field: get(key) for field, names in keys.items()
            for key in [next((k for k in names if get(k) is not None), None)] if key is not None}


def _local_attention(config: Any) -> dict[str, Any]:
    """The window of the layers whose attention is local (sliding or chunked: Llama 4's chunks of 8,192 tokens) as
    `sliding_window` and `global_every`, where the config's layer_types interleave them with global layers at a
    regular step (one in N global, or none); a fused kernel computes only their band (`sliding_window_work`)."""
    layers = getattr(config, "num_hidden_layers", None)
    kinds = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None)
    if not isinstance(kinds, list) or len(kinds) != layers or not isinstance(window, int) or not layers:
        return {}
    local = sum(isinstance(k, str) and ("sliding" in k or "chunked" in k) for k in kinds)
    if not local:
        return {}
    every = layers // (layers - local) if local < layers else None
    if every is not None and layers - layers // every != local:
        return {}  # an irregular pattern: its attention priced as global
    return {"sliding_window": window, **({"global_every": every} if every else {})}


def _has_moe_layers(config: Any) -> bool:
    """False where the config's per-layer pattern names its MLPs and none is a mixture of experts (a hybrid whose
    config carries expert defaults it does not use: Nemotron-H's layers_block_type without 'moe')."""
    layers = getattr(config, "num_hidden_layers", None)
    for value in vars(config).values():
        if isinstance(value, (list, str)) and len(value) == layers and all(isinstance(v, str) for v in value):
            kinds = {v.lower() for v in value}
            if "mlp" in kinds or any("moe" in k for k in kinds):
                return any("moe" in k for k in kinds)
    return True


def _resolved_hf_config(config: dict[str, Any]) -> Any:
    """The config object transformers builds from `config` (its class's defaults filled in); nothing is
    downloaded. A model_type transformers does not know is an error naming it."""
    from transformers import AutoConfig  # only for an architecture no family record names

    rest = {k: v for k, v in config.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(config["model_type"], **rest)
    except (ValueError, KeyError, TypeError) as err:
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"hf_config.model_type {config['model_type']!r}: transformers cannot build its config "
                         f"({first})") from None


def _shown(value: Any) -> str:
    """A value quoted in a message, cut short: the message is one screen, whatever the spec holds."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _section(annotation: Any) -> type[BaseModel] | None:
    """The spec section a field holds (`LinkSpec | None` -> LinkSpec, `list[InputSpec]` -> InputSpec), if any."""
    if typing.get_origin(annotation) is None:
        return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return next(filter(None, map(_section, typing.get_args(annotation))), None)


def _unknown_key(loc: tuple[int | str, ...]) -> str:
    """'unknown key' with the closest allowed key of its section (a typo), else the allowed keys."""
    section: type[BaseModel] | None = WorkloadSpec
    for part in loc[:-1]:
        if isinstance(part, str) and section is not None:
            field = section.model_fields.get(part)
            section = _section(field.annotation) if field is not None else None
    known = list(section.model_fields) if section is not None else []
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    if close:
        return f"unknown key; did you mean {close[0]!r}?"
    return f"unknown key; known keys: {', '.join(known)}" if known else "unknown key"


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    errors = err.errors()
    for e in errors[:_MAX_ERRORS]:
        where = ".".join(str(p) for p in e["loc"]) or "spec"
        if e["type"] == "extra_forbidden":
            lines.append(f"{where}: {_unknown_key(e['loc'])}")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        given = e.get("input")
        shown = "" if isinstance(given, dict) or given is None else f" (got {_shown(given)})"
        lines.append(f"{where}: {msg}{shown}")
    if len(errors) > _MAX_ERRORS:
        lines.append(f"... and {len(errors) - _MAX_ERRORS} more")
    return "invalid workload spec:\n  " + "\n  ".join(lines)


def _check_values(data: Any) -> None:
    """Refuse a number or string no spec needs, naming where it is: fields without bounds of their own
    (and free-form ones: kwargs, hf_config, search) would otherwise overflow numpy or flood the message."""
    stack: list[tuple[Any, str]] = [(data, "spec")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            stack.extend((k, where) for k in value)  # a key is checked where it stands
            stack.extend((v, str(k) if where == "spec" else f"{where}.{k}") for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{where}.{i}") for i, v in enumerate(value))
        elif isinstance(value, str) and len(value) > _MAX_STRING:
            raise SpecError(f"{where}: a string of {len(value):,} characters; at most {_MAX_STRING:,}")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and not abs(value) <= _MAX_NUMBER:
            raise SpecError(f"{where}: {_shown(value)} is out of range; a spec's numbers lie between "
                            f"-{_MAX_NUMBER:,} and {_MAX_NUMBER:,}")  # `not <=`: NaN too


# The command-line flag that lets a spec's `module:` run; named by every refusal.
TRUST_FLAG = "--trust-module"


def parse_spec(data: Any, trust_module: bool = False) -> WorkloadSpec:
    """Validate an already-parsed mapping (e.g. from YAML or JSON). `trust_module`: the caller lets a `module:` model
    import and call its factory (the model zoo refuses it otherwise)."""
    if not isinstance(data, dict):
        raise SpecError("a workload spec is a mapping with the keys model, training and cluster")
    _check_values(data)
    try:
        spec = WorkloadSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_format_validation_error(err)) from None
    spec.model._module_trusted = trust_module
    return spec


def untrusted_module_error(model: ModelSpec) -> str:
    """Why a `module:` model may not run: the message every refusal prints, naming the flag that allows it."""
    return (f"model.module {model.module!r} would import and run Python code named by the spec; pass {TRUST_FLAG} "
            f"(scaledl plan / predict, python -m orchestrator.job) if you wrote or checked that module")


class _SpecLoader(yaml.SafeLoader):
    """safe_load that refuses, with the line, what would make a spec take unbounded time or memory to read:
    nesting deeper than _MAX_DEPTH (PyYAML composes recursively), more than _MAX_VALUES values counting what
    aliases repeat (a "billion laughs" is a few lines), a recursive alias; and names the line of a scalar
    that does not convert (`!!int x`, an integer of 5,000 digits) instead of raising a bare ValueError."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values = 0
        self._sizes: dict[str, int] = {}  # anchor -> values it stands for, once composed

    def _refuse(self, mark: yaml.Mark, problem: str) -> SpecError:
        return SpecError(f"line {mark.line + 1}, column {mark.column + 1}: {problem}")

    def _count(self, values: int, mark: yaml.Mark) -> None:
        self._values += values
        if self._values > _MAX_VALUES:
            raise self._refuse(mark, f"the spec holds more than {_MAX_VALUES:,} values, counting what aliases "
                                     f"repeat (a YAML alias bomb?); a workload spec needs a few dozen")

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.anchors and event.anchor not in self._sizes:
                raise self._refuse(event.start_mark, f"alias *{event.anchor} refers to a node that contains it")
            self._count(self._sizes.get(event.anchor, 0), event.start_mark)
            return super().compose_node(parent, index)
        if self._depth >= _MAX_DEPTH:
            raise self._refuse(event.start_mark, f"nested deeper than {_MAX_DEPTH} levels")
        before = self._values
        self._count(1, event.start_mark)
        self._depth += 1
        node = super().compose_node(parent, index)
        self._depth -= 1
        if event.anchor is not None:
            self._sizes[event.anchor] = self._values - before
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """A mapping whose keys are each given once: YAML would keep the last of a repeated key silently, so a
        spec's second `tp:` or `module:` would win unseen (keys a `<<` merge brings in may be overridden)."""
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise self._refuse(key_node.start_mark, f"key {_shown(key)} is given twice (first on line "
                                                        f"{seen[key]}); keep one")
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except SpecError:
            raise
        except ValueError as err:
            kind = node.tag.rsplit(":", 1)[-1]
            raise self._refuse(node.start_mark, f"{kind} {_shown(node.value)} does not convert: {err}") from None


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of the user's `what` file (a spec, a plans file), at most _MAX_BYTES: a SpecError naming
    the file otherwise, so a binary or endless file (/dev/zero) is refused rather than decoded or read whole."""
    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_BYTES + 1)
    except OSError as err:
        raise SpecError(f"cannot read {what} {path}: {err.strerror}") from None
    if len(raw) > _MAX_BYTES:
        raise SpecError(f"{what} {path} is larger than {_MAX_BYTES // 1024:,} KiB; it should be a short text file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"{what} {path} is not a text file: byte {err.object[err.start]:#04x} at offset {err.start} "
                        f"is not UTF-8") from None


def _parse_yaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_SpecLoader)  # a SafeLoader: nothing is imported or run
    except yaml.reader.ReaderError as err:  # a control character; it has an offset, not a mark
        line = text.count("\n", 0, err.position) + 1
        raise SpecError(f"YAML syntax error at line {line}: character #x{err.character:04x} is not allowed "
                        f"({err.reason})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"YAML syntax error{where}: {getattr(err, 'problem', err)}") from None


def load_spec(path: str | Path, trust_module: bool = False) -> WorkloadSpec:
    """Read and validate a YAML workload spec (safe_load only; nothing is imported or run). A `module:` model is
    refused unless `trust_module` (the user's `--trust-module`): a spec file, which may come from anyone (a `ray job
    submit` runs it on the cluster's head node), never decides by itself to run code."""
    path = Path(path)
    text = read_text(path, "spec")
    try:
        data = _parse_yaml(text)
        cluster = data.get("cluster") if isinstance(data, dict) else None
        if isinstance(cluster, dict) and isinstance(cluster.get("device_profile"), str):
            # a relative profile path is relative to the spec file, wherever the command runs
            cluster["device_profile"] = str(path.parent / Path(cluster["device_profile"]).expanduser())
        spec = parse_spec(data, trust_module)
        if spec.model.module is not None and not trust_module:
            raise SpecError(untrusted_module_error(spec.model))
        return spec
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from None
