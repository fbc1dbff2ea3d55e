"""Hybrid Mamba-attention models in Megatron-LM's arguments: Nemotron-H and Nemotron 3 (transformers' `nemotron_h`).

Megatron-LM builds them with `pretrain_mamba.py` and Megatron-Core's `mamba_stack_spec` from one layer per character
of `--hybrid-override-pattern` (megatron/core/ssm/mamba_hybrid_layer_allocation.py `Symbols`: M Mamba-2, * attention,
- MLP, E mixture of experts), its Mamba-2 mixers from `--mamba-num-heads/-head-dim/-state-dim/-num-groups`, the MLPs'
squared ReLU from `--squared-relu` and no position embedding (NVIDIA/Megatron-LM examples/mamba/train.sh and
tools/checkpoint's hybrid loaders, which write a transformers `nemotron_h` config as exactly these flags). Its
`MambaStack` (megatron/core/ssm/mamba_block.py `_select_layers_for_pipeline_parallel`) cuts the pattern evenly over
the pipeline ranks and has no interleaved schedule: `rules` refuses other plans.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from predictor.frameworks.base import LaunchError
from predictor.plan import Plan

if TYPE_CHECKING:  # pragma: no cover
    from predictor.spec.workload import WorkloadSpec

# transformers model types whose config these flags spell.
MODEL_TYPES = frozenset({"nemotron_h"})
SCRIPT = "pretrain_mamba.py"
SPEC = ("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec")
_SYMBOLS = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-", "moe": "E"}
# transformers' name of the MLPs' activation -> Megatron-LM's flag (Nemotron-H's relu2 is squared ReLU).
_ACTIVATION = {"relu2": "--squared-relu"}


def is_hybrid(spec: "WorkloadSpec") -> bool:
    """Whether the spec's model is a hybrid stack these flags spell."""
    config = spec.model.hf_config
    return config is not None and spec.model.family is None and config.get("model_type") in MODEL_TYPES


@lru_cache(maxsize=32)
def _config(items: tuple[tuple[str, Any], ...]) -> Any:
    from transformers import AutoConfig  # only when a hybrid's launch file is written

    fields = dict(items)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def resolved_config(spec: "WorkloadSpec") -> Any:
    """The transformers config of the spec's hf_config, its defaults filled in (nothing downloaded)."""
    assert spec.model.hf_config is not None
    return _config(tuple(sorted((k, _hashable(v)) for k, v in spec.model.hf_config.items())))


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def pattern(config: Any) -> str:
    """The layer pattern of a config: one `Symbols` character per layer, in order."""
    return "".join(_SYMBOLS[kind] for kind in config.layers_block_type)


def rules(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    """What Megatron-Core's MambaStack cannot run of a plan for a hybrid."""
    if not is_hybrid(spec):
        return []
    errors = []
    if plan.pp > 1 and plan.schedule == "interleaved":
        errors.append("runs a hybrid Mamba stack without interleaved pipelines (megatron/core/ssm/mamba_block.py: "
                      "'does not currently support virtual/interleaved pipeline parallelism'): use schedule=1f1b")
    if plan.pp > 1 and spec.model.num_blocks % plan.pp:
        errors.append(f"cuts a hybrid Mamba stack's {spec.model.num_blocks} layers evenly over pp={plan.pp} "
                      f"(MambaStack: num_layers // pp per rank): use a pp that divides them")
    return errors


def model_args(spec: "WorkloadSpec") -> list[str]:
    """The model's flags: its dims, the layer pattern, the Mamba-2 mixers, the MLPs and the experts of its E layers."""
    c = resolved_config(spec)
    layers = pattern(c)
    args = ["--spec", *SPEC, "--hybrid-override-pattern", layers, "--num-layers", str(len(layers)),
            "--hidden-size", str(c.hidden_size), "--num-attention-heads", str(c.num_attention_heads),
            "--kv-channels", str(c.head_dim), "--ffn-hidden-size", str(c.intermediate_size),
            "--seq-length", str(spec.model.tokens), "--max-position-embeddings", str(spec.model.tokens),
            "--mamba-num-heads", str(c.mamba_num_heads), "--mamba-head-dim", str(c.mamba_head_dim),
            "--mamba-state-dim", str(c.ssm_state_size), "--mamba-num-groups", str(c.n_groups),
            "--position-embedding-type", "none", "--normalization", "RMSNorm"]
    if c.num_key_value_heads != c.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(c.num_key_value_heads)]
    if c.mlp_hidden_act in _ACTIVATION:
        args.append(_ACTIVATION[c.mlp_hidden_act])
    if not c.use_bias and not c.mlp_bias:
        args.append("--disable-bias-linear")
    if not c.tie_word_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if "E" in layers:
        args += ["--num-experts", str(c.n_routed_experts), "--moe-router-topk", str(c.num_experts_per_tok),
                 "--moe-ffn-hidden-size", str(c.moe_intermediate_size), "--moe-shared-expert-intermediate-size",
                 str(c.moe_shared_expert_intermediate_size * c.n_shared_experts), "--moe-router-score-function",
                 "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor",
                 str(c.routed_scaling_factor), "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall",
                 "--moe-router-dtype", "fp32"]  # the plan's expert tensor parallelism: the degree flags
    return args


def model_errors(spec: "WorkloadSpec") -> list[str]:
    """What of the config these flags cannot spell: a MLP activation other than squared ReLU."""
    c = resolved_config(spec)
    if c.mlp_hidden_act not in _ACTIVATION:
        return [f"model.hf_config.mlp_hidden_act {c.mlp_hidden_act!r}: Megatron-LM's hybrid stack spells only "
                f"{', '.join(_ACTIVATION)} ({', '.join(_ACTIVATION.values())})"]
    return []


def read_model(args: dict[str, list[str]], spec: "WorkloadSpec") -> str:
    """The layer pattern a launch file builds, checked with its Mamba-2 dims against the spec's model (a file edited
    or written for another model would train something other than the prediction): LaunchError names the flag."""
    c = resolved_config(spec)
    wanted = {"--hybrid-override-pattern": pattern(c), "--mamba-num-heads": str(c.mamba_num_heads),
              "--mamba-head-dim": str(c.mamba_head_dim), "--mamba-state-dim": str(c.ssm_state_size),
              "--mamba-num-groups": str(c.n_groups)}
    for flag, value in wanted.items():
        got = args.get(flag, [None])[0]
        if got != value:
            raise LaunchError(f"{flag} {got!r} in the launch file is not the spec's model ({value!r}): write the "
                              f"file again from this spec")
    return wanted["--hybrid-override-pattern"]
