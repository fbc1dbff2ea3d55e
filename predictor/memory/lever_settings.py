"""The memory levers a training run can pull, and what each costs in time.

A plan that does not fit is made to fit by recomputing modules in backward (Megatron-Core's `--recompute-modules`,
or whole layers with `--recompute-granularity full --recompute-num-layers N`), by moving activations to host memory
(`--cpu-offloading-num-layers N`, or fine-grained offloading by module), by moving part of the optimizer to the host
(`--optimizer-cpu-offload --optimizer-offload-fraction f`), by keeping Adam's moments in BF16 (the precision-aware
optimizer, `--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16`) and by gathering FP8
parameters (`--fp8-param-gather`: the param buffer holds FP8 weights, no BF16 copy). `Levers` carries them as plain
values: a plan's fields name them (`levers_of`), and a framework's recipes set some of them beside the plan (BF16
gradients, Transformer Engine's cross-entropy), which `bench/memory_eval.py` passes directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from predictor.graph.layer_graph import LayerGraph
from predictor.memory.facts import MemoryFacts
from predictor.memory.saved import op_sac_saves_mm
from predictor.plan import OFFLOAD_MODULES, RECOMPUTE_MODULES, Plan, offloaded, recompute_modules

Fp8Format = Literal["cs", "mx"]


class LeverError(ValueError):
    """A lever value that cannot be used; the message names the field and the values it takes."""


@dataclass(frozen=True)
class Levers:
    """The memory levers of one run.

    recompute: Megatron-Core module names recomputed in backward, or {"full"} for whole layers.
    recompute_layers: with full recomputation, layers per pipeline stage (virtual chunk) recomputed; None: all.
    offload: fine-grained activation offloading modules (OFFLOAD_MODULES).
    offload_layers: whole transformer layers whose activations go to host memory (cpu_offloading_num_layers).
    optimizer_offload: fraction of the optimizer state (master and moments) kept in host memory.
    bf16_moments: Adam's two moments in BF16 (precision-aware optimizer).
    bf16_grads: gradients accumulated and reduced in BF16 (`grad_reduce_in_fp32=False`, the precision-aware
        optimizer's `main_grads_dtype=bf16`), not the fp32 main-grad buffer.
    te_cross_entropy: Transformer Engine's fused cross-entropy (`cross_entropy_fusion_impl="te"`), which writes the
        logits' gradient into the BF16 logits in forward: 2 bytes per logit, no fp32 copy.
    fp8_param_gather: FP8 training keeps FP8 parameters in the param buffer instead of BF16 ones.
    fp8_format: 'cs' (per-tensor current or delayed scaling: weight and transpose) or 'mx' (MXFP8: row- and
        column-wise copies with one E8M0 scale per 32 values).
    unfused_attention: whether attention is unfused (`training.kernels.attention`), keeping its s x s scores for
        backward; None: as the framework's saved-tensor list has it (eager modules unfused, the others fused).
    op_sac: torchtitan's per-op selective checkpointing instead of recomputed modules: each layer keeps
        `predictor.memory.saved.op_sac_tensors` and recomputes the rest of its forward (`op_sac_recomputed`).
    compiled: the blocks and the loss run under torch.compile (torchtitan's `[compile]`): the saved tensors are
        those the compiled backward reads, the loss keeps BF16 logits.
    """

    recompute: frozenset[str] = frozenset()
    recompute_layers: int | None = None
    offload: frozenset[str] = frozenset()
    offload_layers: int = 0
    optimizer_offload: float = 0.0
    bf16_moments: bool = False
    bf16_grads: bool = False
    te_cross_entropy: bool = False
    fp8_param_gather: bool = False
    fp8_format: Fp8Format = "cs"
    unfused_attention: bool | None = None
    op_sac: bool = False
    compiled: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.recompute) - set(RECOMPUTE_MODULES) - {"full"}
        if unknown or ("full" in self.recompute and len(self.recompute) > 1):
            raise LeverError(f"recompute must be none, selective, full, or modules joined by '+' from "
                             f"{', '.join(RECOMPUTE_MODULES)}; got {'+'.join(sorted(self.recompute))!r}")
        if self.recompute_layers is not None and (self.recompute_layers < 0 or "full" not in self.recompute):
            raise LeverError(f"recompute_layers={self.recompute_layers} needs recompute=full and a count >= 0")
        if set(self.offload) - set(OFFLOAD_MODULES):
            raise LeverError(f"offload modules must come from {', '.join(OFFLOAD_MODULES)}; got "
                             f"{'+'.join(sorted(set(self.offload) - set(OFFLOAD_MODULES)))!r}")
        if self.offload_layers < 0:
            raise LeverError(f"offload_layers must be >= 0, got {self.offload_layers}")
        if not 0.0 <= self.optimizer_offload <= 1.0:
            raise LeverError(f"optimizer_offload is a fraction in [0, 1], got {self.optimizer_offload}")
        if self.op_sac and self.recompute - {"core_attn"}:
            raise LeverError(f"op_sac is torchtitan's selective checkpointing alone; got recompute="
                             f"{'+'.join(sorted(self.recompute))!r} beside it")
        if self.fp8_format not in ("cs", "mx"):
            raise LeverError(f"fp8_format must be cs or mx, got {self.fp8_format!r}")

    @property
    def full(self) -> bool:
        return "full" in self.recompute


def levers_of(plan: Plan, facts: MemoryFacts, fp8_format: Fp8Format = "cs",
              unfused_attention: bool | None = None, compiled: bool = False) -> Levers:
    """The levers a plan's fields name (recomputation, activation and optimizer offloading, the gradients' and
    moments' dtypes), with what its framework's launch files always set (`MemoryFacts.fp8_param_gather`, in the
    device's FP8 format, and `te_cross_entropy`); `recompute=selective` is the framework's own selective
    checkpointing (`MemoryFacts.selective`); `compiled`: the run compiles its blocks and loss
    (`Framework.compiled`)."""
    modules, layers = offloaded(plan.offload)
    op_sac = plan.recompute == "selective" and facts.selective == "op"
    return Levers(recompute=frozenset() if op_sac else recompute_modules(plan.recompute),
                  recompute_layers=plan.recompute_layers or None, op_sac=op_sac, compiled=compiled,
                  offload=modules, offload_layers=layers, optimizer_offload=plan.optimizer_offload,
                  bf16_moments=plan.moments == "bf16", bf16_grads=plan.grads == "bf16",
                  te_cross_entropy=facts.te_cross_entropy, fp8_param_gather=facts.fp8_param_gather,
                  fp8_format=fp8_format, unfused_attention=unfused_attention)


def _module_of(name: str, kind: str) -> set[str]:
    """The recompute modules that recompute a layer-graph node (by its module path in the transformers model)."""
    if kind == "attention":
        return {"core_attn"}
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm"):
        return {"layernorm"}
    if leaf in ("q_b_proj", "kv_b_proj"):
        return {"mla_up_proj"}
    if ".mlp." not in f"{name}." and ".block_sparse_moe." not in f"{name}.":
        return set()
    if ".shared_expert" in name:
        return {"moe", "shared_experts"}
    if kind == "activation" and ".experts" in name:
        return {"moe", "moe_act"}
    if kind in ("experts", "router") or ".experts" in name:
        return {"moe"}
    return {"mlp"}


def recomputed_nodes(graph: LayerGraph, modules: frozenset[str]) -> np.ndarray:
    """Bool per graph node: recomputed in backward under `modules` (Megatron-Core recompute module names)."""
    return np.array([bool(_module_of(n.name, n.kind) & modules) for n in graph.nodes], dtype=bool)


def op_sac_recomputed(graph: LayerGraph) -> np.ndarray:
    """Bool per graph node: what torchtitan's per-op selective checkpointing runs again in backward. In each
    repeated block, every node but the attention kernel (SDPA is on its save list) and the odd-numbered linears
    (`predictor.memory.saved.op_sac_saves_mm`, counted in the block's forward order): norms, activations, the
    even-numbered linears, a MoE layer's experts."""
    out = np.zeros(len(graph.nodes), dtype=bool)
    block, position = None, 0
    for i, node in enumerate(graph.nodes):
        if node.group != "block":
            continue
        here = _block_of(node.name)
        if here != block:
            block, position = here, 0
        if node.kind == "linear":
            position += 1
            out[i] = not op_sac_saves_mm(position)
        else:
            out[i] = node.kind != "attention"
    return out


def _block_of(name: str) -> str:
    """The repeated block a node belongs to: its module path up to the layer index ('model.layers.3')."""
    parts = name.split(".")
    index = next((i for i, p in enumerate(parts) if p.isdigit()), len(parts) - 1)
    return ".".join(parts[:index + 1])
