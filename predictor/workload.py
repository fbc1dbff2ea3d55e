"""Workload specs: the YAML a user writes (model, training settings, cluster), validated at the boundary.

`load_spec(path)` returns a `WorkloadSpec` or raises `SpecError` whose message names the
field, the bad value and what is allowed, so the CLI can print it without a traceback.
Model dimensions are always resolved here (from a preset, a HuggingFace config dict or
explicit dims) so every later stage can read `spec.model.hidden` and friends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from predictor.hardware import DEVICES
from predictor.presets import MODEL_PRESETS

Family = Literal["gpt", "gpt2", "bert", "t5", "vit", "deit", "llama"]
FAMILIES: tuple[str, ...] = ("gpt", "gpt2", "bert", "t5", "vit", "deit", "llama")
VISION_FAMILIES = ("vit", "deit")

# Attribute names used by HuggingFace configs of the supported families, in lookup order.
_HF_KEYS: dict[str, tuple[str, ...]] = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads"),
    "kv_heads": ("num_key_value_heads",),
    "ffn_hidden": ("intermediate_size", "n_inner", "d_ff"),
    "vocab": ("vocab_size",),
    "seq_len": ("max_position_embeddings", "n_positions"),
    "image_size": ("image_size",),
    "patch_size": ("patch_size",),
    "decoder_layers": ("num_decoder_layers",),
}
_HF_FAMILY = {"gpt2": "gpt2", "bert": "bert", "t5": "t5", "vit": "vit", "deit": "deit", "llama": "llama"}


class SpecError(ValueError):
    """A workload spec that cannot be used; the message is meant for the user as is."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Strict):
    """One forward argument of a user `module:` model, without the batch dimension."""

    shape: list[int]
    dtype: Literal["int64", "float32", "float16", "bfloat16"] = "float32"
    high: int | None = Field(default=None, gt=0, description="exclusive upper bound of random integer inputs")


class ModelSpec(_Strict):
    """The model: a family with dims, a preset, a HuggingFace config dict, or an opt-in `module:` factory."""

    family: Family | None = None
    preset: str | None = None
    hf_config: dict[str, Any] | None = None
    module: str | None = Field(default=None, description="'package.module:factory' returning an nn.Module")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    inputs: list[InputSpec] | None = None

    hidden: int | None = Field(default=None, gt=0)
    layers: int | None = Field(default=None, gt=0, description="transformer layers (encoder layers for t5)")
    decoder_layers: int | None = Field(default=None, ge=0, description="t5 decoder layers (default: layers)")
    heads: int | None = Field(default=None, gt=0)
    kv_heads: int | None = Field(default=None, gt=0, description="key/value heads for grouped-query attention")
    ffn_hidden: int | None = Field(default=None, gt=0)
    seq_len: int | None = Field(default=None, gt=0)
    vocab: int | None = Field(default=None, gt=0)
    image_size: int | None = Field(default=None, gt=0)
    patch_size: int | None = Field(default=None, gt=0)

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
            merged = dict(MODEL_PRESETS[name])
            merged.update({k: v for k, v in data.items() if v is not None})  # explicit keys override the preset
            return merged
        if "hf_config" in bases:
            return {**_dims_from_hf(data["hf_config"]), **{k: v for k, v in data.items() if v is not None}}
        return data

    @model_validator(mode="after")
    def _check_dims(self) -> "ModelSpec":
        if self.module is not None:
            if ":" not in self.module:
                raise ValueError(f"module must look like 'package.module:factory', got {self.module!r}")
            if not self.inputs:
                raise ValueError("a module: model needs inputs: [{shape: [...], dtype: ...}] to trace it")
            return self
        missing = [k for k in ("hidden", "layers", "heads") if getattr(self, k) is None]
        if self.family in VISION_FAMILIES:
            missing += [k for k in ("image_size", "patch_size") if getattr(self, k) is None]
        else:
            missing += [k for k in ("seq_len", "vocab") if getattr(self, k) is None]
        if missing:
            raise ValueError(f"model {self.family} needs {', '.join(missing)}")
        assert self.hidden and self.heads
        if self.hidden % self.heads:
            raise ValueError(f"heads={self.heads} must divide hidden={self.hidden}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.family in VISION_FAMILIES and self.image_size % self.patch_size:  # type: ignore[operator]
            raise ValueError(f"patch_size={self.patch_size} must divide image_size={self.image_size}")
        return self

    @property
    def ffn_hidden_size(self) -> int:
        """FFN width: explicit, else the family's convention (LLaMA's SwiGLU 8h/3 rounded to 256, else 4h)."""
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        h = self.hidden or 0
        if self.family == "llama":
            return 256 * ((int(8 * h / 3) + 255) // 256)
        return 4 * h

    @property
    def num_blocks(self) -> int:
        """Transformer blocks a pipeline splits (encoder + decoder for t5)."""
        layers = self.layers or 0
        if self.family == "t5":
            return layers + (self.decoder_layers if self.decoder_layers is not None else layers)
        return layers

    @property
    def tokens(self) -> int:
        """Sequence positions per sample (patches + class/distillation tokens for vision models)."""
        if self.family in VISION_FAMILIES:
            patches = (self.image_size // self.patch_size) ** 2  # type: ignore[operator]
            return patches + (2 if self.family == "deit" else 1)
        return self.seq_len or 0


class TrainingSpec(_Strict):
    global_batch: int = Field(gt=0, description="samples per iteration over all data-parallel ranks")
    precision: Literal["fp32", "fp16", "bf16", "fp8", "fp4"] = "bf16"
    optimizer: Literal["adam", "sgd"] = "adam"
    framework: Literal["megatron", "torchtitan", "deepspeed", "pytorch"] | None = Field(
        default=None, description="what trains it (predictor.frameworks): its runnable plans and overlap; default "
                                  "megatron on a catalogue GPU, pytorch (ScaleDL's own runner) on a measured device")


class LinkSpec(_Strict):
    bandwidth_gbps: float = Field(gt=0, description="achievable bus bandwidth, GB/s one direction")
    latency_us: float = Field(ge=0)


class ClusterSpec(_Strict):
    device: str
    nodes: int = Field(default=1, gt=0)
    gpus_per_node: int = Field(default=8, gt=0)
    nvlink_domain: int | None = Field(
        default=None, gt=0, description="GPUs that share one NVLink domain, a multiple of gpus_per_node (default: "
                                        "the device's, e.g. 72 for an NVL72 rack, else gpus_per_node)")
    intra_node: LinkSpec | None = None
    inter_node: LinkSpec | None = None
    device_profile: str | None = Field(
        default=None, description="cpu only: a measured device profile (a device.json from `scaledl profile` or a "
                                  "dataset) to price the workload with, instead of measuring this machine")

    @model_validator(mode="after")
    def _known_device(self) -> "ClusterSpec":
        if self.device not in DEVICES:
            raise ValueError(f"unknown device {self.device!r}; known devices: {', '.join(DEVICES)}")
        if self.device_profile is not None:
            if DEVICES[self.device] is not None:
                raise ValueError(f"device_profile is for measured devices (cpu); {self.device!r} is priced from its "
                                 f"data sheet: remove device_profile or set device: cpu")
            if not Path(self.device_profile).is_file():
                raise ValueError(f"device_profile {self.device_profile!r} does not exist; give the path of a device.json "
                                 f"written by `scaledl profile` (or remove it to measure this machine)")
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
                             f"precisions: {', '.join(device.peak_flops)}")
        framework = self.training.framework
        if framework not in (None, "pytorch") and (device is None or self.cluster.device_profile is not None):
            raise ValueError(f"training.framework {framework!r} runs on GPUs; a measured device ({name}) runs "
                             f"ScaleDL's own runner: use framework: pytorch or leave it out")
        return self


def _dims_from_hf(config: Any) -> dict[str, Any]:
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError("hf_config must be a mapping with a model_type (e.g. {model_type: gpt2, n_layer: 12, ...})")
    model_type = config["model_type"]
    if model_type not in _HF_FAMILY:
        raise ValueError(f"hf_config.model_type {model_type!r} is not supported; supported: {', '.join(_HF_FAMILY)}")
    dims: dict[str, Any] = {"family": _HF_FAMILY[model_type]}
    for field, keys in _HF_KEYS.items():
        for key in keys:
            if key in config:
                dims[field] = config[key]
                break
    return dims


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "spec"
        msg = e["msg"].removeprefix("Value error, ")
        given = e.get("input")
        shown = "" if isinstance(given, dict) or given is None else f" (got {given!r})"
        lines.append(f"{where}: {msg}{shown}")
    return "invalid workload spec:\n  " + "\n  ".join(lines)


def parse_spec(data: Any) -> WorkloadSpec:
    """Validate an already-parsed mapping (e.g. from YAML or JSON)."""
    if not isinstance(data, dict):
        raise SpecError("a workload spec is a mapping with the keys model, training and cluster")
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_format_validation_error(err)) from None


def load_spec(path: str | Path) -> WorkloadSpec:
    """Read and validate a YAML workload spec (safe_load only; nothing is imported or run)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise SpecError(f"cannot read spec {path}: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{path}: YAML syntax error{where}: {getattr(err, 'problem', err)}") from None
    cluster = data.get("cluster") if isinstance(data, dict) else None
    if isinstance(cluster, dict) and isinstance(cluster.get("device_profile"), str):
        # a relative profile path is relative to the spec file, wherever the command runs
        cluster["device_profile"] = str(path.parent / Path(cluster["device_profile"]).expanduser())
    try:
        return parse_spec(data)
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from None
