"""Real model definitions for every workload family, with random weights (never downloaded).

`build_model(spec)` returns an `nn.Module` whose forward, given `example_inputs(spec, batch)`,
computes a training loss (`training_loss`). The Megatron `gpt` family is a compact GPT module
of our own (Megatron-LM's layer layout and names); `gpt2`, `bert`, `t5`, `vit`, `deit` and
`llama` use HuggingFace `transformers` config classes with random initialisation; `hf_config:`
specs build from the user's config dict; `module:` specs import the user's factory (opt-in).

Everything builds on `torch.device("meta")` by default, so a 175B model costs no memory; on
`cpu` with small dims the same modules train for real (the measurement code does that).
"""

from __future__ import annotations

import importlib
import logging
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from predictor.spec.families import FAMILIES, IMAGENET_CLASSES, Family, by_hf_model_type
from predictor.spec.workload import ModelSpec, SpecError, untrusted_module_error

__all__ = ["GPTModel", "build_model", "example_inputs", "module_args", "training_loss", "output_loss", "param_count", "num_labels",
           "user_model_errors"]

_DTYPES = {"int64": torch.int64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Logs the traceback of a failing meta kernel before raising it; a user model's error is told once, as a SpecError.
_FAKE_TENSOR_LOG = logging.getLogger("torch._subclasses.fake_tensor")


# --------------------------------------------------------------------------------------------
# Megatron-style GPT (Shoeybi et al. 2019; Megatron-LM's GPTModel layer names)
# --------------------------------------------------------------------------------------------


class Embedding(nn.Module):
    """Word + learned position embeddings, summed (Megatron `LanguageModelEmbedding`)."""

    def __init__(self, vocab: int, hidden: int, max_seq: int):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_seq, hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return self.word_embeddings(input_ids) + self.position_embeddings(positions)


class SelfAttention(nn.Module):
    """Fused QKV projection (column parallel), causal attention core, output projection (row parallel)."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.query_key_value = nn.Linear(hidden, 3 * hidden)
        self.dense = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        qkv = self.query_key_value(x).view(b, s, 3, self.heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (b, heads, s, head_dim)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.dense(ctx.transpose(1, 2).reshape(b, s, -1))  # -1: the local heads under tp


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(hidden, ffn)
        self.activation = nn.GELU()
        self.dense_4h_to_h = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.activation(self.dense_h_to_4h(x)))


class TransformerLayer(nn.Module):
    """Pre-LayerNorm block: x + Attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(hidden)
        self.self_attention = SelfAttention(hidden, heads)
        self.post_attention_layernorm = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attention(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LMHead(nn.Module):
    """Logits against the (tied) word embedding; owns no parameters (vocab parallel in Megatron)."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)


class GPTModel(nn.Module):
    """Megatron GPT: embeddings, `layers` pre-LN transformer layers, final LayerNorm, tied logits.

    `forward(input_ids, labels=None)` returns the logits, or the cross-entropy loss when labels
    are given (labels are the already shifted next tokens, as Megatron's data loader makes them).
    """

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, max_seq: int, ffn: int | None = None):
        super().__init__()
        self.embedding = Embedding(vocab, hidden, max_seq)
        self.layers = nn.ModuleList(TransformerLayer(hidden, heads, ffn or 4 * hidden) for _ in range(layers))
        self.final_layernorm = nn.LayerNorm(hidden)
        self.output_layer = LMHead()
        self._init_weights(layers)

    def _init_weights(self, layers: int) -> None:
        """Megatron's init: N(0, 0.02), output projections scaled by 1/sqrt(2·layers), zero biases."""
        if self.embedding.word_embeddings.weight.is_meta:
            return
        out_std = 0.02 / math.sqrt(2.0 * layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.zeros_(p) if name.endswith("bias") else nn.init.ones_(p)
            elif name.endswith(("self_attention.dense.weight", "dense_4h_to_h.weight")):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embedding(input_ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.output_layer(self.final_layernorm(x), self.embedding.word_embeddings.weight)
        if labels is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.reshape(-1))


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------


def num_labels(model: ModelSpec) -> int:
    """Classes of a vision model's head: `vocab` if given, else ImageNet's 1000."""
    return model.vocab or IMAGENET_CLASSES


def _hf_config(model: ModelSpec) -> Any:
    """The transformers config object for a family spec (its record's config builder) or an `hf_config:` spec."""
    import transformers as tf

    if model.hf_config is not None:
        cfg = dict(model.hf_config)
        model_type = cfg.pop("model_type")
        fam = by_hf_model_type(model_type)
        cfg = {**(fam.config_defaults if fam is not None else {}), **cfg}
        if fam is not None:  # a family's model traces with SDPA (or eager where it has none); another with its default
            cfg.setdefault("attn_implementation", "eager" if fam.eager_attention else "sdpa")
        config = tf.AutoConfig.for_model(model_type, **cfg)
        _balanced_experts(config)  # a mixture of experts of any architecture: its experts traced with balanced routing
        return config
    fam = _built_as(model)
    assert fam.config is not None
    extra = {**fam.config_defaults, **model.kwargs}  # family specs: kwargs are extra config fields (e.g. t5 d_kv)
    cfg = fam.config(model, extra)
    cfg._attn_implementation = "eager" if fam.eager_attention else "sdpa"
    if fam.moe:
        _balanced_experts(cfg)
    return cfg


def _balanced_experts(config: Any) -> None:
    """Trace the config's experts (transformers' experts implementations) with balanced routing
    (`predictor.graph.moe_tracing`); a model without such experts ignores it."""
    from predictor.graph.moe_tracing import BALANCED, register_balanced_experts

    register_balanced_experts()
    config._experts_implementation = BALANCED


def _built_as(model: ModelSpec) -> Family:
    """The family a spec is built as: its own, or the one its family becomes with experts (Llama: Mixtral)."""
    fam = model.family_entry
    assert fam is not None
    return FAMILIES[fam.experts_as] if model.is_moe and fam.experts_as else fam


def _user_source(model: ModelSpec) -> str | None:
    """The spec field holding code or config the user wrote, or None for a built-in model (whose errors are ours)."""
    if model.module is not None:
        return f"model.module {model.module!r}"
    if model.hf_config is not None:
        return "model.hf_config"
    fam = model.family_entry
    return "model.kwargs" if model.kwargs and fam is not None and fam.config is not None else None  # our GPT: none


@contextmanager
def user_model_errors(model: ModelSpec, doing: str) -> Iterator[None]:
    """An exception the user's code or config raises while `doing` becomes one SpecError naming the spec field
    (its type and first line: torch's C++ errors carry a backtrace), so the CLI prints it without a traceback;
    a built-in model's exceptions are bugs and pass through."""
    source = _user_source(model)
    if source is None:
        yield
        return
    level = _FAKE_TENSOR_LOG.level
    _FAKE_TENSOR_LOG.setLevel(logging.CRITICAL)
    try:
        yield
    except SpecError:
        raise
    except (Exception, SystemExit) as err:  # user code may even sys.exit() on import
        first = (str(err).strip().splitlines() or [""])[0]
        first = first if len(first) <= 300 else first[:297] + "..."
        raise SpecError(f"{source}: {doing} raised {type(err).__name__}" + (f": {first}" if first else "")) from None
    finally:
        _FAKE_TENSOR_LOG.setLevel(level)


def _import_factory(path: str, model: ModelSpec) -> Any:
    """The factory a trusted `module:` names, defined in that module itself: not a builtin, nothing of the standard
    library (`os:system`, `shutil:rmtree`) and nothing the module merely imported, so a spec names code the user
    wrote or installed as a model, never a utility that runs commands or deletes files."""
    mod_name, _, attr = path.partition(":")
    if not model.module_trusted:
        raise SpecError(untrusted_module_error(model))
    top = mod_name.split(".", 1)[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        kind = "a builtin module" if top in sys.builtin_module_names else "of the standard library"
        raise SpecError(f"model.module {path!r}: {mod_name!r} is {kind}, not a model; name the module that defines "
                        f"your model's factory")
    with user_model_errors(model, f"importing {mod_name!r}"):
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as err:
            if err.name is None or not (mod_name == err.name or mod_name.startswith(err.name + ".")):
                raise  # the module itself imports something missing: reported with its type
            raise SpecError(f"model.module {path!r}: cannot import {mod_name!r}: {err}; is its folder on "
                            f"PYTHONPATH?") from None
    factory = getattr(mod, attr, None)
    if factory is None or not callable(factory):
        raise SpecError(f"model.module {path!r}: {mod_name!r} has no callable {attr!r}")
    defined_in = getattr(factory, "__module__", None)
    if defined_in != mod.__name__:
        where = f"; name it where it is defined: '{defined_in}:{attr}'" if defined_in else ""
        raise SpecError(f"model.module {path!r}: {attr!r} is not defined in {mod_name!r} (it comes from "
                        f"{defined_in or 'no module'}){where}")
    return factory


def build_model(model: ModelSpec, device: str | torch.device = "meta", dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model with random weights on `device` (meta by default: no memory, any size), in `dtype`."""
    device = torch.device(device)
    if model.module is not None:
        factory = _import_factory(model.module, model)
        with user_model_errors(model, "calling the factory"), device:
            module = factory(**model.kwargs)
        if not isinstance(module, nn.Module):
            raise SpecError(f"model.module {model.module!r}: the factory returned {type(module).__name__}, "
                            f"not a torch.nn.Module")
        return _cast(module, dtype)
    if model.hf_config is None and _built_as(model).config is None:  # ScaleDL's Megatron-style GPT
        with device:
            module = GPTModel(vocab=model.vocab, hidden=model.hidden, layers=model.layers, heads=model.heads,
                              max_seq=model.seq_len, ffn=model.ffn_hidden_size)
        return _cast(module, dtype)
    import transformers as tf

    fam = _built_as(model) if model.family is not None else None
    with user_model_errors(model, "building the model"):
        cfg = _hf_config(model)
        with device:
            module = getattr(tf, fam.model_class)(cfg) if fam else tf.AutoModelForCausalLM.from_config(cfg)
    if fam is not None and fam.loss_type is not None:  # its class name names no loss: transformers warns, then uses it
        module.loss_type = fam.loss_type
    return _cast(module, dtype)


def _cast(module: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """Cast floating parameters to `dtype` only when needed (a no-op `.to` breaks fake-tensor builds)."""
    if dtype is not None and any(p.is_floating_point() and p.dtype != dtype for p in module.parameters()):
        module = module.to(dtype=dtype)
    return module


def example_inputs(model: ModelSpec, batch: int, device: str | torch.device = "meta",
                   dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Keyword arguments of one training forward at `batch` samples, labels included (so a loss comes out).

    Integer inputs are uniform random ids (vocabulary / class ids); float inputs (pixels) are
    standard normal in `dtype`. `module:` specs get one positional-like kwarg per `inputs:` entry,
    named `input_0`, `input_1`, ... only when the factory's forward does not name them: the
    graph builder passes them positionally (see `module_args`).
    """
    device = torch.device(device)

    def ints(shape: tuple[int, ...], high: int) -> torch.Tensor:
        return torch.randint(0, high, shape, device=device, dtype=torch.int64)

    if model.module is not None:
        out: dict[str, Any] = {}
        for i, inp in enumerate(model.inputs or []):
            shape = (batch, *inp.shape)
            dt = _DTYPES[inp.dtype]
            if dt == torch.int64:
                out[f"input_{i}"] = ints(shape, inp.high or 2)
            else:
                out[f"input_{i}"] = torch.randn(shape, device=device, dtype=dt)
        return out
    if model.vision:
        size = model.image_size
        return {"pixel_values": torch.randn(batch, 3, size, size, device=device, dtype=dtype),
                "labels": ints((batch,), num_labels(model))}
    s, vocab = model.seq_len, model.vocab
    if model.hf_config is not None:
        vocab = model.hf_config.get("vocab_size", vocab)
    inputs: dict[str, Any] = {"input_ids": ints((batch, s), vocab), "labels": ints((batch, s), vocab)}
    fam = model.family_entry
    if (fam is not None and fam.generative) or model.any_architecture:
        inputs["use_cache"] = False
    return inputs


def primary_input(inputs: dict[str, Any]) -> torch.Tensor:
    """The tensor a model's first layer reads (images or token ids): what a first pipeline stage is fed."""
    return inputs["pixel_values"] if "pixel_values" in inputs else inputs["input_ids"]


def module_args(model: ModelSpec, inputs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) to call the model with: `module:` models take their inputs positionally."""
    if model.module is not None:
        return tuple(inputs[f"input_{i}"] for i in range(len(inputs))), {}
    return (), inputs


def training_loss(model_module: nn.Module, inputs: dict[str, Any], model: ModelSpec | None = None) -> torch.Tensor:
    """The scalar a training step differentiates: HF `.loss`, our GPT's cross-entropy, or a user module's output mean."""
    if model is not None:
        args, kwargs = module_args(model, inputs)
    elif inputs and all(k.startswith("input_") for k in inputs):
        args, kwargs = tuple(inputs[f"input_{i}"] for i in range(len(inputs))), {}
    else:
        args, kwargs = (), inputs
    out = model_module(*args, **kwargs)
    return output_loss(out)


def output_loss(out: Any) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    if isinstance(out, torch.Tensor):
        return out if out.dim() == 0 else out.float().mean()
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0].float().mean()
    if isinstance(out, dict) and out:
        first = next(iter(out.values()))
        return first.float().mean()
    raise TypeError(f"cannot make a training loss from a {type(out).__name__} output")


def param_count(module: nn.Module) -> int:
    """Unique parameters (tied weights counted once), as `sum(p.numel())` over `parameters()`."""
    return sum(p.numel() for p in module.parameters())

