"""The framework settings that change which kernels a layer runs: the spec's `training.kernels`, each unset field at its
framework's default (`Kernels`, resolved per device generation by `kernels_of`), and which of them a framework's
launch file can set (`KernelChoices`; a value it cannot set is refused with the reason, `kernel_errors`).

- attention: "flash" (FlashAttention), "cudnn" (cuDNN's fused attention through Transformer Engine) or "unfused" (the
  2021-22 Megatron-LM kind: the QK^T GEMM, the scaled masked softmax and dropout as passes over the s x s scores, the
  attention x V GEMM, and the scores kept for backward); Megatron-LM's `--attention-backend`
  (NVIDIA/Megatron-LM megatron/training/arguments.py: flash, fused, unfused, local, auto);
- cuda_graphs: parts of the step captured and replayed as CUDA graphs (`--cuda-graph-impl`), so the host launches
  a captured region once instead of operator by operator; cuda_graph_scope says which (`--cuda-graph-scope`): the
  whole layer (Megatron-LM's default), the attention sublayer, the MoE router and preprocessing (joined by '+':
  attn, moe_router, moe_preprocess), or the full iteration (`predictor.models.cuda_graphs` prices them);
- transformer_engine: Transformer Engine's layers (`--transformer-impl transformer_engine`) or Megatron-Core's own
  (`local`): FP8/FP4, cuDNN attention and the userbuffers tensor-parallel overlap need it;
- fused_softmax, fused_bias_gelu, fused_grad_accum: Megatron-LM's masked-softmax, bias-GeLU and gradient-accumulation
  fusions (`--no-masked-softmax-fusion`, `--no-bias-gelu-fusion`, `--no-gradient-accumulation-fusion`);
- moe_permute_fusion, moe_router_fusion: a mixture of experts' token permutations and its router's score, top-k and
  auxiliary-loss kernels as Transformer Engine's fused kernels (Megatron-LM `--moe-permute-fusion`,
  `--moe-router-fusion`; off by default there) or as PyTorch operators (`predictor.models.moe_kernels` prices both).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from predictor.spec.workload import WorkloadSpec

ATTENTION_BACKENDS: tuple[str, ...] = ("flash", "cudnn", "unfused")
# Megatron-LM's --cuda-graph-scope values ScaleDL prices (megatron/training/arguments.py); "layer" is its default
# (no scope named: each whole layer), "full_iteration" stands alone, the others combine.
GRAPH_SCOPES: tuple[str, ...] = ("attn", "moe_router", "moe_preprocess")
WHOLE_SCOPES: tuple[str, ...] = ("layer", "full_iteration")


def graph_scope_error(scope: str) -> str:
    """Why `scope` is no CUDA graph scope ('' when it is one)."""
    parts = scope.split("+")
    if scope in WHOLE_SCOPES or (parts and all(p in GRAPH_SCOPES for p in parts) and len(set(parts)) == len(parts)):
        return ""
    return (f"training.kernels.cuda_graph_scope={scope!r}: use layer, full_iteration, or parts of "
            f"{', '.join(GRAPH_SCOPES)} joined by '+'")
# The device facts' kernel (`predictor.kernels.attention`) each fused backend runs.
ATTENTION_KERNELS: dict[str, str] = {"flash": "flash-attention-2", "cudnn": "cudnn"}


@dataclass(frozen=True)
class Kernels:
    """The kernel settings one prediction runs with (every field resolved)."""

    attention: str = "unfused"
    cuda_graphs: bool = False
    cuda_graph_scope: str = "layer"
    transformer_engine: bool = False
    fused_softmax: bool = True
    fused_bias_gelu: bool = True
    fused_grad_accum: bool = True
    moe_permute_fusion: bool = False
    moe_router_fusion: bool = False

    @property
    def fused_attention(self) -> bool:
        """Whether attention is one fused kernel (no s x s scores through memory)."""
        return self.attention != "unfused"

    @property
    def attention_kernel(self) -> str | None:
        """The device facts' kernel of a fused backend (None: unfused)."""
        return ATTENTION_KERNELS.get(self.attention)


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Kernels))


@dataclass(frozen=True)
class KernelChoices:
    """A framework's kernel settings: its defaults (`attention` per device generation: the backend its library picks
    there), and for each field its launch file sets only some values of, those values and why no others."""

    defaults: Kernels
    attention_by_generation: Mapping[str, str] = field(default_factory=dict)
    allowed: Mapping[str, tuple[tuple[Any, ...], str]] = field(default_factory=dict)  # field -> (values, why)
    # What runs only through Transformer Engine: attention backends (without it the framework's attention is unfused)
    # and overlap kinds (a plan's `overlap`) it hides nothing of without it.
    te_attention: tuple[str, ...] = ()
    te_overlap: frozenset[str] = frozenset()

    def default(self, generation: str) -> Kernels:
        return replace(self.defaults, attention=self.attention_by_generation.get(generation, self.defaults.attention))


def requested(spec: "WorkloadSpec") -> dict[str, Any]:
    """The kernel settings the spec names ({} when it names none)."""
    given = spec.training.kernels
    return {} if given is None else {k: v for k, v in given.model_dump().items() if v is not None}


def kernels_of(spec: "WorkloadSpec", choices: KernelChoices, generation: str) -> Kernels:
    """The settings a prediction of `spec` runs with: the spec's, else the framework's (`choices`) default on the
    generation;
    without Transformer Engine, a framework whose attention backends are Transformer Engine's runs unfused attention
    (Megatron-Core's local `DotProductAttention`)."""
    chosen = requested(spec)
    base = choices.default(generation)
    if chosen.get("transformer_engine") is False:
        # the MoE fusions are Transformer Engine's kernels too
        base = replace(base, moe_permute_fusion=False, moe_router_fusion=False)
        if base.attention in choices.te_attention:
            base = replace(base, attention="unfused")
    return replace(base, **chosen)


def kernel_errors(spec: "WorkloadSpec", choices: KernelChoices, title: str) -> list[str]:
    """Why the framework titled `title`, whose kernel settings are `choices`, cannot run the spec's kernel settings,
    each naming the field and the fix."""
    chosen = requested(spec)
    errors = []
    for name, value in chosen.items():
        values, why = choices.allowed.get(name, (None, ""))
        if values is not None and value not in values:
            shown = ", ".join(str(v).lower() for v in values)
            errors.append(f"training.kernels.{name}={str(value).lower()}: {title} {why} (use {shown}, or "
                          f"leave it unset)")
    if "cuda_graph_scope" in chosen and graph_scope_error(chosen["cuda_graph_scope"]):
        errors.append(graph_scope_error(chosen["cuda_graph_scope"]))
    elif "cuda_graph_scope" in chosen and not chosen.get("cuda_graphs", choices.defaults.cuda_graphs):
        errors.append(f"training.kernels.cuda_graph_scope={chosen['cuda_graph_scope']}: it says what CUDA graphs "
                      f"capture (set cuda_graphs: true, or leave it unset)")
    family = spec.model.family_entry
    if chosen.get("fused_bias_gelu") is False and family is not None and family.gated_ffn:
        errors.append(f"training.kernels.fused_bias_gelu=false: {spec.model.family}'s MLP is gated (SwiGLU), it has no "
                      f"bias-GeLU (leave it unset)")
    if chosen.get("transformer_engine") is False:
        if spec.training.precision in ("fp8", "fp4"):
            errors.append(f"training.kernels.transformer_engine=false: {spec.training.precision} GEMMs are Transformer "
                          f"Engine's (use precision bf16, or transformer_engine true)")
        fused_moe = [name for name in MOE_FUSIONS if chosen.get(name)]
        if fused_moe:
            errors.append(f"training.kernels.{fused_moe[0]}=true: the fused MoE kernels are Transformer Engine's (set "
                          f"{fused_moe[0]} false, or transformer_engine true)")
        if chosen.get("attention") in choices.te_attention:
            errors.append(f"training.kernels.attention={chosen['attention']}: {title} runs it through "
                          f"Transformer Engine (use unfused, or transformer_engine true)")
    return errors


# The MoE fusions (Transformer Engine's kernels) and the Megatron-LM switches that turn each on
# (`megatron/training/arguments.py`; both off by default there).
MOE_FUSIONS: dict[str, str] = {"moe_permute_fusion": "--moe-permute-fusion", "moe_router_fusion": "--moe-router-fusion"}


# Megatron-LM's (and Megatron-DeepSpeed's) switches that turn a fusion off: `megatron/training/arguments.py`.
FUSION_FLAGS: dict[str, str] = {"fused_softmax": "--no-masked-softmax-fusion", "fused_bias_gelu": "--no-bias-gelu-fusion",
                                "fused_grad_accum": "--no-gradient-accumulation-fusion"}


def fusion_args(kernels: Kernels) -> list[str]:
    """The flags that switch off the fusions `kernels` runs without."""
    return [flag for name, flag in FUSION_FLAGS.items() if not getattr(kernels, name)]


def read_fusions(flags: Mapping[str, Any]) -> dict[str, bool]:
    """The fusion settings `fusion_args` wrote, from a parsed command line."""
    return {name: flag not in flags for name, flag in FUSION_FLAGS.items()}
