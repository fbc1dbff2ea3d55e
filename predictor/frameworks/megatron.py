"""Megatron-Core (NVIDIA/Megatron-LM), as its code and Megatron-Bridge's performance recipes run it.

Plans it runs (`megatron/training/arguments.py`, `validate_args`): DDP or the distributed optimizer (ZeRO-1);
Megatron-FSDP (`--use-megatron-fsdp`, `--data-parallel-sharding-strategy optim_grads` / `optim_grads_params`:
ZeRO-2/3) turns `overlap_grad_reduce` on (and `overlap_param_gather` for optim_grads_params) by itself, and its guide
(`docs/user-guide/features/megatron_fsdp.md`, `custom_fsdp.md`: "compatible with TP, EP and CP"; issue #1455 asks for
PP) runs it without pipelines; `--overlap-param-gather` needs the distributed optimizer or Megatron-FSDP and
`--overlap-grad-reduce`; `--tp-comm-overlap` needs `--sequence-parallel`; 1F1B and interleaved pipelines (no GPipe),
the interleaved one only with more than one virtual stage (`virtual_pipeline_model_parallel_size` 1 is None), its p2p
overlapped by default (`--no-overlap-p2p-communication`) and without that overlap only for pp > 2, the
non-interleaved one never overlapping p2p; CP; rank order tp-cp-ep-dp-pp or tp-cp-ep-pp-dp (`--use-tp-pp-dp-mapping`);
EP (`--expert-model-parallel-size`) and expert tensor parallelism (`--expert-tensor-parallel-size`, written for every
plan: unset it would be tp), MoE beside TP only with sequence parallelism, its
all-to-all overlapped by the combined 1F1B schedule (`--overlap-moe-expert-parallel-comm`, without a pipeline or
interleaved), which Megatron-Core's MoE performance guide (`docs/.../moe` "General Setup") turns on.
Megatron-Bridge recipes overlap grad reduce, param gather (with the distributed optimizer), TP (with SP) and the
interleaved p2p; Transformer Engine's fused attention.

Launch file: `megatron_args.txt`, `pretrain_gpt.py` arguments one option a line, and `torchrun.sh`, the command
that runs them on every node. The command line helpers here (`common_args`, `common_fields`) serve its fork
Megatron-DeepSpeed too (`predictor.frameworks.deepspeed`), which spells most arguments alike.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING, Any, Callable, Mapping

from predictor.frameworks import megatron_hybrid as hybrid
from predictor.frameworks.kernels import (ATTENTION_KERNELS, MOE_FUSIONS, KernelChoices, Kernels, fusion_args, kernels_of,
                                         read_fusions)
from predictor.frameworks.base import (LEVERS, Framework, Launch, LaunchError, LaunchTarget, args_text, degree_args, hidden, inverse,
                                       other_orders, overlap_value, parse_args, read_degrees, recorded_constants,
                                       spec_recipe)
from predictor.memory.facts import MIB, MemoryFacts
from predictor.plan import DISPATCHERS, OVERLAP_KINDS, Plan, embedding_and_loss_in_split, offloaded, overlap_kinds
from predictor.spec.hardware import GENERATIONS

if TYPE_CHECKING:  # pragma: no cover
    from predictor.spec.workload import ModelSpec, WorkloadSpec

NAME = "megatron"
# The parallel axes it runs and their flags (megatron/training/arguments.py); the data-parallel size is what the
# others leave of the world size (parallel_state.initialize_model_parallel), so dp has no flag.
AXIS_FLAGS: dict[str, str] = {"tp": "--tensor-model-parallel-size", "cp": "--context-parallel-size", "dp": "",
                              "pp": "--pipeline-model-parallel-size", "ep": "--expert-model-parallel-size",
                              "etp": "--expert-tensor-parallel-size"}
def written_axes(spec: "WorkloadSpec") -> dict[str, str]:
    """The degree flags a launch file writes: every axis's, but a dense model's expert tensor parallelism (unset, as
    Megatron-LM leaves it, its expert groups take tp: parallel_state's expert data-parallel size then equals the dense
    layers', which the tp-pp-dp rank order asks)."""
    return AXIS_FLAGS if spec.model.is_moe else {axis: flag for axis, flag in AXIS_FLAGS.items() if axis != "etp"}


# The releases the launch files are written for, newest first: Megatron-Core 0.16.1 (PyPI megatron-core; with
# Megatron-LM's core_r0.16 branch for pretrain_gpt.py), which tests/test_framework_checks.py checks every file against
# (its TransformerConfig and parallel_state groups), and 0.14.0, whose TransformerConfig has no
# fine_grained_activation_offloading (its transformer_config.py; 0.16.1 added it): a spec's
# training.framework_version 0.14.0 is refused those plans (`_version_errors`).
VERSIONS: tuple[str, ...] = ("0.16.1", "0.14.0")
# Features by the first release that has them (megatron/core/transformer/transformer_config.py of each).
_SINCE = {"fine-grained activation offloading (--fine-grained-activation-offloading, --offload-modules)": "0.16.1"}
# The rank orders (innermost first) its process groups can build.
ORDERS: tuple[tuple[str, ...], ...] = (("tp", "cp", "dp", "pp"), ("tp", "cp", "pp", "dp"))


def _rules(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    errors = []
    if plan.schedule == "gpipe":
        errors.append("has no GPipe schedule (use schedule=1f1b or interleaved)")
    if plan.schedule == "interleaved" and plan.v == 1:
        errors.append("runs schedule=interleaved with v=1 as 1F1B (use v >= 2 or schedule=1f1b)")
    if plan.rank_order not in ORDERS:
        errors.append(f"orders ranks tp-cp-dp-pp or tp-cp-pp-dp only, not {'-'.join(plan.rank_order)} "
                      f"(placement=tp-dp-pp or tp-pp-dp)")
    if spec.model.is_moe and plan.tp > 1 and not plan.sp:
        errors.append("runs a mixture of experts beside tensor parallelism only with sequence parallelism (sp=true)")
    if plan.zero >= 2 and plan.pp > 1:
        errors.append(f"runs zero={plan.zero} as Megatron-FSDP, which does not run beside pipeline parallelism "
                      f"(use zero=0 or 1 with pp > 1)")
    kernels = kernels_of(spec, KERNELS, GENERATIONS.get(spec.cluster.device, ""))
    if plan.cp > 1 and not kernels.fused_attention:
        errors.append("runs context parallelism with fused attention only (training.kernels.attention unfused: "
                      "use cp=1, or a fused backend)")
    wanted = overlap_kinds(plan.overlap)
    if wanted is None:
        return errors
    if "tp" in wanted and plan.tp > 1 and not kernels.transformer_engine:
        errors.append("overlaps tensor-parallel communication (--tp-comm-overlap) through Transformer Engine only: "
                      "with training.kernels.transformer_engine false, overlap must leave out tp")
    if "tp" in wanted and plan.tp > 1 and not plan.sp:
        errors.append("overlaps tensor-parallel communication (--tp-comm-overlap) only with sp=true")
    if "param" in wanted and plan.zero >= 1 and "dp" not in wanted:
        errors.append("overlaps the parameter all-gather (--overlap-param-gather) only beside the gradient "
                      "reduction (overlap=dp+param)")
    if "wgrad" in wanted and not ("ep" in wanted and plan.ep > 1):
        errors.append("delays the experts' weight gradients (--delay-wgrad-compute) only under the expert all-to-all's "
                      "overlap with ep > 1 (transformer_config.py: \"overlap_moe_expert_parallel_comm must be enabled "
                      "when enabling delay_wgrad_compute\"): overlap must include ep, or leave out wgrad")
    if "ep" in wanted and plan.ep > 1 and plan.pp > 1 and plan.schedule != "interleaved":
        errors.append("overlaps the expert all-to-all (--overlap-moe-expert-parallel-comm) only without a pipeline "
                      "or in the interleaved schedule")
    if plan.pp > 1 and plan.schedule != "interleaved" and "pp" in wanted:
        errors.append(f"overlaps pipeline send/recv only in the interleaved schedule, not {plan.schedule}")
    if plan.schedule == "interleaved" and plan.pp <= 2 and "pp" not in wanted:
        errors.append(f"runs the interleaved schedule without p2p overlap only with pp > 2, not pp={plan.pp} "
                      f"(overlap must include pp)")
    forced = "+".join(sorted({2: {"dp"}, 3: {"dp", "param"}}.get(plan.zero, set()) - wanted))
    if forced:
        errors.append(f"always overlaps {forced} in Megatron-FSDP (zero={plan.zero}): overlap must include {forced}")
    return errors


def _expert_group_errors(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    """megatron/core/parallel_state.py (`initialize_model_parallel`, Megatron-Core 0.16.1, lines 786-812): the expert
    layers' groups are built from expert tensor parallelism, ep and pp over the same world, and outside the pp-last
    rank order their data-parallel size must equal the dense layers'; transformer_config.py (`__post_init__`) splits
    experts with biases over no etp ranks."""
    if not spec.model.is_moe:
        return []
    errors = []
    if plan.gpus % (plan.etp * plan.ep * plan.pp):
        errors.append(f"cannot build expert groups of expert_tensor_parallel_size*ep*pp = {plan.etp}*{plan.ep}*{plan.pp}, "
                      f"which must divide the {plan.gpus} GPUs (parallel_state: \"world_size is not divisible by "
                      f"expert_tensor_model_pipeline_parallel size\")")
    if plan.pp > 1 and plan.rank_order[-1] != "pp" and plan.ep * plan.etp != plan.tp * plan.cp:
        errors.append(f"needs, outside the pp-last rank order (placement=tp-pp-dp with pp={plan.pp}), the experts' "
                      f"data-parallel size equal to the dense layers': ep*etp = tp*cp = {plan.tp * plan.cp}, not "
                      f"{plan.ep}*{plan.etp} (parallel_state: \"When not using pp-last rank ordering, the data parallel "
                      f"size of the attention and moe layers must be the same\"; use placement=tp-dp-pp)")
    family = spec.model.family_entry
    if plan.etp > 1 and family is not None and family.expert_biases:
        errors.append(f"splits experts with biases ({spec.model.family}) over no expert tensor-parallel ranks "
                      f"(transformer_config.py: \"Bias in Moe is only supported when ETP==1\"): use etp=1")
    return errors


def _ep_overlap_errors(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    """megatron/core/transformer/transformer_config.py (`__post_init__`, Megatron-Core 0.16.1, lines 1852-1896) asserts
    under overlap_moe_expert_parallel_comm: no full recomputation (nor its method or layer count), a bf16/fp16 model,
    at most one MTP layer, and that one only with a pipeline. Under overlap=auto the recipes' overlap runs wherever the
    combined 1F1B does (`_default_overlap`, which leaves it out under full recomputation); these refusals read no
    recompute there, since a search checks one recomputation of plans otherwise alike (`RULE_BLIND`)."""
    if not spec.model.is_moe or plan.ep == 1:
        return []
    wanted = overlap_kinds(plan.overlap)
    if not ("ep" in wanted if wanted is not None else plan.pp == 1 or plan.schedule == "interleaved"):
        return []
    errors = []
    why = "cannot overlap the expert all-to-all (--overlap-moe-expert-parallel-comm)"
    if wanted is not None and plan.recompute == "full":
        errors.append(f"{why} beside full recomputation (transformer_config.py: \"disable full recomputation when "
                      f"enabling overlap_moe_expert_parallel_comm\"): overlap must leave out ep, or recompute less")
    if spec.training.precision == "fp32":
        errors.append(f"{why} in an fp32 model (transformer_config.py: \"only supported with bf16 or fp16 model\")")
    mtp = spec.model.mtp_layers
    if mtp > 1 or (mtp == 1 and plan.pp == 1):
        errors.append(f"{why} with {mtp} MTP layers and pp={plan.pp} (transformer_config.py: one MTP layer at most, "
                      f"and then only with pp > 1): overlap must leave out ep")
    return errors


def _version_errors(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    """What the spec's older release (training.framework_version) does not have."""
    version = spec.training.framework_version
    if version is None:
        return []
    modules, _ = offloaded(plan.offload)
    used = {feature: modules for feature in _SINCE}
    return [f"{version} has no {feature}: it came in {since} (offload=layers:N, or framework_version {since})"
            for feature, since in _SINCE.items() if used[feature] and _release(version) < _release(since)]


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _muon_errors(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    """What Megatron-Core's Muon (megatron/core/optimizer/muon.py `get_megatron_muon_optimizer`) refuses: its
    distributed optimizer and Megatron-FSDP (dist_muon's layer-wise sharding is zero=1), FP16, and the
    precision-aware optimizer (host steps, BF16 moments or main gradients)."""
    if spec.training.optimizer != "muon":
        return []
    errors = []
    if plan.zero >= 2:
        errors.append(f"runs Muon without Megatron-FSDP (zero={plan.zero}): use zero=0 (--optimizer muon) or zero=1 "
                      f"(--optimizer dist_muon, its layer-wise distributed optimizer)")
    if spec.training.precision == "fp16":
        errors.append("runs Muon in BF16 or FP32, not FP16 ('muon with fp16 is not supported')")
    if plan.optimizer_offload or plan.moments == "bf16" or plan.grads == "bf16":
        errors.append("runs Muon without the precision-aware optimizer: leave optimizer_offload, moments and grads "
                      "at their defaults")
    return errors


def _recipe_errors(spec: "WorkloadSpec") -> list[str]:
    """A recipe Transformer Engine has none of (torchao's row-wise float8): Megatron-LM's --fp8-recipe cannot name it."""
    recipe = spec_recipe(spec)
    if recipe is None or recipe in _FP8_RECIPES or recipe == "nvfp4":
        return []
    return [f"runs Transformer Engine's recipes ({', '.join(_FP8_RECIPES)}, nvfp4), not torchao's training.recipe "
            f"{recipe!r}: use current or blockwise, or training.framework torchtitan"]


def _bf16_layer_errors(plan: Plan, spec: "WorkloadSpec", recipe: str | None) -> list[str]:
    """What TransformerConfig (megatron/core/transformer/transformer_config.py `__post_init__`) refuses of the layers
    kept in BF16: beside delayed scaling, and more at either end than a pipeline rank holds (num_layers // pp)."""
    t = spec.training
    if not (t.bf16_first_layers or t.bf16_last_layers):
        return []
    errors = []
    if recipe == "delayed":
        errors.append("keeps no layer in BF16 under delayed scaling ('Delayed scaling does not support first / last "
                      "layer in BF16'): use training.recipe current, blockwise or mxfp8")
    per_rank = spec.model.num_blocks // plan.pp
    for name, count in (("bf16_first_layers", t.bf16_first_layers), ("bf16_last_layers", t.bf16_last_layers)):
        if count > per_rank:
            errors.append(f"keeps at most num_layers // pp = {per_rank} layers in BF16 at each end "
                          f"(training.{name} {count}): lower it or pp")
    return errors


def _lora_errors(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    """LoRA is priced with the frozen base replicated over data parallelism (Megatron-Bridge's PEFT recipes run the
    distributed optimizer over the adapters alone), not under Megatron-FSDP."""
    if spec.training.lora_rank and plan.zero >= 2:
        return [f"prices LoRA with the frozen base whole on every data-parallel rank: use zero=0 or 1, not "
                f"zero={plan.zero}"]
    return []


def _all_rules(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    return (_rules(plan, spec) + _expert_group_errors(plan, spec) + _ep_overlap_errors(plan, spec)
            + _version_errors(plan, spec) + hybrid.rules(plan, spec) + _muon_errors(plan, spec)
            + _bf16_layer_errors(plan, spec, spec_recipe(spec)) + _recipe_errors(spec) + _lora_errors(plan, spec))


def _default_overlap(plan: Plan) -> frozenset[str]:
    kinds = {"dp"}
    if plan.ep > 1 and (plan.pp == 1 or plan.schedule == "interleaved") and plan.recompute != "full":
        # the MoE recipes' --overlap-moe-expert-parallel-comm (combined 1F1B: pp=1 or interleaved), which
        # TransformerConfig refuses beside full recomputation
        kinds.add("ep")
    if plan.zero >= 1:
        kinds.add("param")
    if plan.tp > 1 and plan.sp:
        kinds.add("tp")
    if plan.schedule == "interleaved":
        kinds.add("pp")
    return frozenset(kinds)


# Megatron-Core DDP with --use-distributed-optimizer and --accumulate-allreduce-grads-in-fp32 (the recipes' default):
# a contiguous bf16 param buffer, a contiguous fp32 grad buffer (reduce-scattered in place), fp32 master and Adam
# moments sharded over dp·cp; the unfused cross-entropy keeps the fp32 exp-logits (4 B) and casts the gradient back to
# bf16 (2 B) at the start of backward, Transformer Engine's fused one (which the launch files set) the bf16 logits only.
MEMORY = MemoryFacts(NAME, grad_bytes=4.0, master_bytes=4.0, moment_bytes=4.0, grads_sharded_from=2,
                     saved="megatron-te",
                     swiglu_saved=3.0, loss_saved_bytes=4.0, loss_peak_bytes=6.0, grad_bucket_bytes=0.0,
                     prefetch_params=0.0, workspace_bytes=64 * MIB, fp8_param_gather=True, te_cross_entropy=True)

# Its own search space, the default of `scaledl plan` for it: tensor parallelism inside a node with sequence
# parallelism, 1F1B or interleaved pipelines, data parallelism with the distributed optimizer (ZeRO-1) or Megatron-FSDP
# (ZeRO-2/3, which runs without a pipeline), expert parallelism for a mixture of experts (ep: auto is 1 for a dense
# model), and context parallelism for sequences of cp_from_tokens or more.
SPACE: dict[str, Any] = {
    "description": "Megatron-Core (tp inside a node, 1F1B/interleaved pp, dp with ZeRO 0-3, ep for MoE, cp for long "
                   "sequences)",
    "dp": "auto", "tp": "auto", "pp": "auto", "cp": [1], "cp_from_tokens": 16384, "ep": "auto", "mbs": [1, 2, 4, 8],
    "v": "auto", "max_v": 6, "zero": [0, 1, 2, 3], "recompute": ["none", "selective", "full"],
    "recompute_layers": "auto", "sp": [False, True],
    "schedule": ["1f1b", "interleaved"], "placement": ["tp-dp-pp", "tp-pp-dp"], "allow_cross_node_tp": False,
}

ARGS_FILE = "megatron_args.txt"
_RECOMPUTE_ARGS = {"none": [], "selective": ["--recompute-granularity", "selective"],
                   "full": ["--recompute-granularity", "full", "--recompute-method", "uniform",
                            "--recompute-num-layers", "1"]}
_CP_COMM = {"ring": "p2p", "allgather": "all_gather"}
_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
# Megatron-LM's --fp8-recipe for each of Transformer Engine's FP8 recipes (megatron/training/arguments.py).
_FP8_RECIPES = {"delayed": "delayed", "current": "tensorwise", "blockwise": "blockwise", "mxfp8": "mxfp8"}
_OVERLAP_FLAGS = (("dp", "--overlap-grad-reduce"), ("param", "--overlap-param-gather"), ("tp", "--tp-comm-overlap"),
                  ("ep", "--overlap-moe-expert-parallel-comm"), ("wgrad", "--delay-wgrad-compute"))


@dataclass(frozen=True)
class Spelling:
    """How a Megatron-LM code base spells LLaMA's architecture (SwiGLU, RMSNorm, RoPE, untied embeddings, no
    biases), grouped-query attention (the flags before the group count) and a mixture of experts."""

    llama: tuple[str, ...]
    gqa: tuple[str, ...]
    moe: Callable[["WorkloadSpec"], list[str]] | None


def qk_norm(model: "ModelSpec") -> bool:
    """Whether the model's attention normalises each head's queries and keys (an RMSNorm over head_dim: Qwen3's and
    Gemma 3's), which `--qk-layernorm` builds."""
    return model.family_entry is not None and model.family_entry.qk_norm


def _recompute_args(plan: Plan) -> list[str]:
    """Megatron-LM's recomputation flags: a mode, Megatron-Core's modules (`--recompute-modules`, selective
    granularity), or full recomputation of the first N layers of each chunk (`--recompute-method block`)."""
    if plan.recompute == "full" and plan.recompute_layers:
        return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
                str(plan.recompute_layers)]
    if plan.recompute in _RECOMPUTE_ARGS:
        return _RECOMPUTE_ARGS[plan.recompute]
    return ["--recompute-granularity", "selective", "--recompute-modules", *plan.recompute.split("+")]


def _read_recompute(args: dict[str, list[str]]) -> dict[str, Any]:
    """The plan fields `_recompute_args` wrote."""
    granularity = args.get("--recompute-granularity", ["none"])[0]
    if granularity == "full" and args.get("--recompute-method", ["uniform"])[0] == "block":
        return {"recompute": "full", "recompute_layers": int(args["--recompute-num-layers"][0])}
    if granularity == "selective" and "--recompute-modules" in args:
        return {"recompute": "+".join(args["--recompute-modules"])}
    return {"recompute": granularity}


def _model_args(spec: "WorkloadSpec", spelling: Spelling) -> list[str]:
    """The model's shape, so the launched model is the one predicted (a hybrid Mamba stack's: `megatron_hybrid`)."""
    if hybrid.is_hybrid(spec):
        return hybrid.model_args(spec)
    m = spec.model
    args = ["--num-layers", str(m.num_blocks), "--hidden-size", str(m.hidden), "--num-attention-heads", str(m.heads),
            "--ffn-hidden-size", str(m.ffn_hidden_size), "--seq-length", str(m.tokens),
            "--max-position-embeddings", str(m.tokens)]
    if m.kv_heads is not None and m.kv_heads != m.heads:
        args += [*spelling.gqa, str(m.kv_heads)]
    if m.head_dim is not None and m.head_dim * m.heads != m.hidden:  # Qwen3 32B, Mistral NeMo, GPT-OSS
        args += ["--kv-channels", str(m.head_dim)]
    if (m.family_entry is not None and m.family_entry.llama_args) or m.is_moe:
        untie = "--untie-embeddings-and-output-weights"  # Llama 3.2 ties them (its config's tie_word_embeddings)
        args += [a for a in spelling.llama if a != untie or not m.kwargs.get("tie_word_embeddings")]
        if m.kwargs.get("attention_bias"):  # Qwen2.5's QKV bias
            args.append("--add-qkv-bias")
    if m.is_moe and spelling.moe is not None:
        args += spelling.moe(spec)
    return args


def common_args(plan: Plan, spec: "WorkloadSpec", flags: Mapping[str, str], spelling: Spelling) -> list[str]:
    """What Megatron-LM and its fork Megatron-DeepSpeed spell alike: degrees (by the framework's `flags`), batch,
    model, SP, recompute."""
    args = [*degree_args(plan, flags), "--micro-batch-size", str(plan.mbs),
            "--global-batch-size", str(spec.training.global_batch), *_model_args(spec, spelling)]
    if plan.sp:
        args.append("--sequence-parallel")
    args += _recompute_args(plan)
    if spec.training.precision != "fp32":
        args.append("--fp16" if spec.training.precision == "fp16" else "--bf16")  # fp8/fp4 GEMMs run in a bf16 model
    return args


def common_fields(args: dict[str, list[str]], flags: Mapping[str, str], spec: "WorkloadSpec") -> dict[str, Any]:
    """The fields `common_args` writes, read back."""
    degrees = read_degrees(lambda flag: args.get(flag, ["1"])[0], flags, spec)
    return {**degrees, "mbs": int(args["--micro-batch-size"][0]), "sp": "--sequence-parallel" in args,
            **_read_recompute(args)}


def _moe_args(spec: "WorkloadSpec") -> list[str]:
    """A mixture of experts in Megatron-LM's arguments: experts, router, grouped GEMM, leading dense layers, shared
    experts, MLA and MTP (the plan's token dispatcher: `dispatcher_args`)."""
    m = spec.model
    args = ["--num-experts", str(m.experts), "--moe-router-topk", str(m.top_k), "--moe-ffn-hidden-size",
            str(m.expert_ffn_size), "--moe-router-score-function", m.router, "--moe-grouped-gemm",
            "--moe-router-dtype", "fp32"]
    if m.dense_layers:
        args += ["--moe-layer-freq", "([0]*{}+[1]*{})".format(m.dense_layers, m.layers - m.dense_layers)]
    if m.shared_experts:
        args += ["--moe-shared-expert-intermediate-size", str(m.shared_experts * m.expert_ffn_size)]
    if m.kv_lora_rank is not None:
        args += ["--multi-latent-attention", "--q-lora-rank", str(m.q_lora_rank), "--kv-lora-rank",
                 str(m.kv_lora_rank), "--qk-head-dim", str(m.qk_nope_head_dim), "--qk-pos-emb-head-dim",
                 str(m.qk_rope_head_dim), "--v-head-dim", str(m.v_head_dim)]
    if m.mtp_layers:
        args += ["--mtp-num-layers", str(m.mtp_layers)]
    return args


SPELLING = Spelling(llama=("--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                           "--untie-embeddings-and-output-weights", "--disable-bias-linear"),
                    gqa=("--group-query-attention", "--num-query-groups"), moe=_moe_args)


def _uneven(plan: Plan, blocks: int) -> bool:
    """Whether the pp·v chunks split the layers unevenly even with the embedding and the loss counted as layers (a
    mixture of experts, `predictor.plan.rules`): Megatron-LM's argument check then needs a pipeline layout."""
    return plan.pp > 1 and blocks % (plan.pp * plan.v) != 0 and not embedding_and_loss_in_split(plan, blocks)


def chunk_layers(blocks: int, chunks: int) -> list[int]:
    """Transformer layers per pipeline chunk in model order for an uneven split: as even as whole layers allow, the
    first and last chunks (which also hold the embedding, and the loss) taking the lighter share. The prediction
    spreads the layers evenly (`predictor.costs.parallel.stage_counts`); this is the closest whole-layer layout to it."""
    base, extra = divmod(blocks, chunks)
    heavier = [*range(1, chunks - 1), 0, chunks - 1][:extra]
    return [base + (c in heavier) for c in range(chunks)]


def pipeline_layout(plan: Plan, spec: "WorkloadSpec") -> str:
    """`--pipeline-model-parallel-layout`: the pp·v chunks in model order (chunk c on rank c mod pp) separated by
    '|', E the embedding, t a transformer layer, m an MTP layer, L the loss (Megatron-Core's
    `PipelineParallelLayerLayout`: the embedding first, the MTP layers in the last virtual stage of a rank other than
    the first, the loss last); runs of equal chunks written (…|)*n."""
    m = spec.model
    stages = ["t" * n for n in chunk_layers(m.num_blocks, plan.pp * plan.v)]
    stages[0] = "E" + stages[0]
    stages[-1] += "m" * (m.mtp_layers or 0) + "L"
    parts = []
    for stage, run in groupby(stages):
        n = len(list(run))
        parts.append(f"({stage}|)*{n}" if n > 1 else f"{stage}|")
    return "".join(parts).removesuffix("|")


def layout_stages(layout: str) -> list[str]:
    """The chunks of a pipeline layout, its repetitions unrolled as Megatron-Core's `parse_str_to_list` does."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), text)
    return text.split("|")


def megatron_args(plan: Plan, target: LaunchTarget) -> list[str]:
    """Megatron-LM `pretrain_gpt.py` arguments for a plan from `as_run` and a resolved spec.

    ZeRO-1 is the distributed optimizer, ZeRO-2/3 Megatron-FSDP (which needs its own checkpoint format);
    FP8 runs per-tensor current scaling on Hopper and MXFP8 on Blackwell, FP4 NVFP4. An uneven pipeline is a
    `--pipeline-model-parallel-layout`, which sets the virtual stages itself (`validate_args` allows at most one of it
    and --num-virtual-stages-per-pipeline-rank, and TransformerConfig refuses it beside --account-for-*-in-pipeline-
    split).
    """
    spec, kinds = target.spec, hidden(plan)
    args = common_args(plan, spec, written_axes(spec), SPELLING)
    if qk_norm(spec.model):
        args.append("--qk-layernorm")
    if spec.training.optimizer == "muon":  # its layer-wise distributed optimizer is zero=1 (predictor.costs.muon)
        args += ["--optimizer", "dist_muon" if plan.zero == 1 else "muon"]
    elif plan.zero == 1:
        args.append("--use-distributed-optimizer")
    elif plan.zero >= 2:
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", _SHARDING[plan.zero],
                 "--use-distributed-optimizer", "--ckpt-format", "fsdp_dtensor"]
    uneven = _uneven(plan, spec.model.num_blocks)
    if plan.schedule == "interleaved":
        if not uneven:
            args += ["--num-virtual-stages-per-pipeline-rank", str(plan.v)]
        if "pp" not in kinds:
            args.append("--no-overlap-p2p-communication")
    if uneven:
        args += ["--pipeline-model-parallel-layout", pipeline_layout(plan, spec)]
    elif embedding_and_loss_in_split(plan, spec.model.num_blocks):
        args += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    if plan.cp > 1:
        args += ["--cp-comm-type", _CP_COMM[plan.cp_comm]]
    args += [flag for kind, flag in _OVERLAP_FLAGS if kind in kinds]
    if plan.rank_order == ("tp", "cp", "pp", "dp"):
        args.append("--use-tp-pp-dp-mapping")
    precision = spec.training.precision
    if precision == "fp8":
        # FP8 parameters in the param buffer (no BF16 copy), as Megatron-Bridge's FP8 performance recipes run and
        # the memory prediction assumes (MEMORY.fp8_param_gather)
        args += ["--fp8-format", "hybrid", "--fp8-recipe", _FP8_RECIPES[target.recipe_name], "--fp8-param-gather"]
    elif precision == "fp4":
        args += ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    first, last = spec.training.bf16_first_layers, spec.training.bf16_last_layers
    if first or last:  # TransformerConfig.first_last_layers_bf16 (predictor.costs.bf16_layers)
        args += ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", str(first),
                 "--num-layers-at-end-in-bf16", str(last)]
    kernels = target.kernels
    return (args + dispatcher_args(plan, spec) + _lever_args(plan, kernels.transformer_engine)
            + kernel_args(kernels))


# Megatron-LM's --attention-backend for each backend (its `AttnBackend`: "fused" is cuDNN's through Transformer Engine).
_ATTENTION_BACKEND = {"flash": "flash", "cudnn": "fused", "unfused": "unfused"}


def kernel_args(kernels: Kernels) -> list[str]:
    """The kernel settings in Megatron-LM's arguments (`megatron/training/arguments.py`): the attention backend,
    Megatron-Core's own layers (`--transformer-impl local`), CUDA graphs (`--cuda-graph-impl`, Transformer Engine's
    `make_graphed_callables` or the local capture, and what they capture: `--cuda-graph-scope`), and the fusions
    switched off."""
    args = ["--attention-backend", _ATTENTION_BACKEND[kernels.attention]]
    if not kernels.transformer_engine:
        args += ["--transformer-impl", "local"]
    if kernels.cuda_graphs:
        args += ["--cuda-graph-impl", "transformer_engine" if kernels.transformer_engine else "local"]
        if kernels.cuda_graph_scope != "layer":
            args += ["--cuda-graph-scope", *kernels.cuda_graph_scope.split("+")]
    return args + fusion_args(kernels) + [flag for name, flag in MOE_FUSIONS.items() if getattr(kernels, name)]


def read_kernel_args(text: str) -> dict[str, Any]:
    """The kernel settings `kernel_args` wrote."""
    args = parse_args(shlex.split(text))
    return {"attention": inverse(_ATTENTION_BACKEND)[args["--attention-backend"][0]],
            "transformer_engine": args.get("--transformer-impl", ["transformer_engine"])[0] == "transformer_engine",
            "cuda_graphs": args.get("--cuda-graph-impl", ["none"])[0] != "none",
            "cuda_graph_scope": "+".join(args.get("--cuda-graph-scope", ["layer"])), **read_fusions(args),
            **{name: flag in args for name, flag in MOE_FUSIONS.items()}}


def _lever_args(plan: Plan, transformer_engine: bool) -> list[str]:
    """The memory levers beyond recomputation, and the fused cross-entropy: Transformer Engine's (MEMORY.te_cross_entropy),
    Megatron-Core's native one without Transformer Engine.
    Layer offloading is Transformer Engine's `--cpu-offloading`, exclusive of the fine-grained
    `--fine-grained-activation-offloading`; the optimizer on the host and BF16 moments or main gradients are the
    precision-aware optimizer's."""
    args = ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te" if transformer_engine else "native"]
    modules, layers = offloaded(plan.offload)
    if layers:
        args += ["--cpu-offloading", "--cpu-offloading-num-layers", str(layers)]
    elif modules:
        args += ["--fine-grained-activation-offloading", "--offload-modules", *plan.offload.split("+")]
    precision_aware = plan.optimizer_offload or plan.moments == "bf16" or plan.grads == "bf16"
    if precision_aware:
        args.append("--use-precision-aware-optimizer")
    if plan.optimizer_offload:
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", f"{plan.optimizer_offload:g}"]
    if plan.moments == "bf16":
        args += ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    if plan.grads == "bf16":
        args += ["--grad-reduce-in-bf16", "--main-grads-dtype", "bf16"]
    return args


def _read_levers(args: dict[str, list[str]]) -> dict[str, Any]:
    """The plan fields `_lever_args` wrote."""
    if "--cpu-offloading-num-layers" in args:
        offload = f"layers:{args['--cpu-offloading-num-layers'][0]}"
    else:
        offload = "+".join(args.get("--offload-modules", [])) or "none"
    return {"offload": offload, "optimizer_offload": float(args.get("--optimizer-offload-fraction", ["0"])[0])
            if "--optimizer-cpu-offload" in args else 0.0,
            "moments": args.get("--exp-avg-dtype", ["fp32"])[0], "grads": "bf16" if "--grad-reduce-in-bf16" in args
            else "fp32"}


def torchrun_script(plan: Plan, spec: "WorkloadSpec", script: str = "pretrain_gpt.py") -> str:
    """`torchrun.sh`: runs `megatron_args.txt` on every node (set NODE_RANK and MASTER_ADDR on each).

    The arguments file is shell-quoted (a layout or a layer pattern holds |, *, parentheses): `eval set --` unquotes
    each argument whole, where an unquoted `$(cat ...)` would pass the quotes and glob the patterns.
    Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for TP or CP (before Blackwell); Megatron-FSDP wants it unset.
    """
    c = spec.cluster
    lines = ["#!/bin/sh", "# Megatron-LM on every node: set NODE_RANK and MASTER_ADDR"]
    if plan.zero >= 2:
        lines.append("unset CUDA_DEVICE_MAX_CONNECTIONS")
    elif plan.tp > 1 or plan.cp > 1:
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")
    lines += [f'args="$(dirname "$0")/{ARGS_FILE}"', 'eval "set -- $(tr \'\\n\' \' \' < "$args")"',
              f"torchrun --nnodes {c.nodes} --nproc-per-node {c.gpus_per_node} --node-rank $NODE_RANK "
              f'--rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500 {shlex.quote(script)} "$@"']
    return "\n".join(lines) + "\n"


def _write(plan: Plan, target: LaunchTarget) -> dict[str, str]:
    script = hybrid.SCRIPT if hybrid.is_hybrid(target.spec) else "pretrain_gpt.py"
    return {ARGS_FILE: args_text(megatron_args(plan, target)), "torchrun.sh": torchrun_script(plan, target.spec, script)}


def _model_errors(spec: "WorkloadSpec") -> list[str]:
    """What of a family `pretrain_gpt.py` cannot build from Megatron-LM's arguments (`megatron/training/arguments.py`,
    the family's `extra_parts`): Gemma's gated activations are --swiglu and --quick-geglu, not GeGLU's tanh GELU, and
    no flag adds the post-attention and post-MLP RMSNorms or Gemma 2's logit soft-capping. Megatron-Bridge's Gemma model providers build them with
    their own layer specs, so the prediction stands; a pretrain_gpt.py launch would train another model."""
    m = spec.model
    if spec.training.lora_rank:
        return ["Megatron-LM's pretrain_gpt.py has no LoRA: run training.lora_rank with Megatron-Bridge's PEFT LoRA "
                "(megatron.bridge.peft.lora.LoRA, dim = lora_rank) over these parallel settings"]
    if hybrid.is_hybrid(spec):
        return hybrid.model_errors(spec)
    parts = m.family_entry.extra_parts if m.family_entry is not None else ()
    if not parts:
        return []
    return [f"Megatron-LM's pretrain_gpt.py cannot build {m.family}'s {', '.join(parts[:-1])} and {parts[-1]} from its "
            f"arguments; run it with Megatron-Bridge's {m.family.capitalize()}ModelProvider"]


# Each dispatcher as Megatron-LM's arguments (megatron/training/arguments.py: --moe-token-dispatcher-type
# allgather|alltoall|flex, and for flex --moe-flex-dispatcher-backend deepep|hybridep, Megatron-Core 0.15).
_DISPATCHER_ARGS: dict[str, tuple[str, ...]] = {
    "alltoall": ("--moe-token-dispatcher-type", "alltoall"),
    "allgather": ("--moe-token-dispatcher-type", "allgather"),
    "deepep": ("--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"),
    "hybridep": ("--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep"),
}


def dispatcher_args(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    """The plan's token dispatcher in Megatron-LM's arguments (a MoE model's only)."""
    return list(_DISPATCHER_ARGS[plan.dispatcher]) if spec.model.is_moe else []


def read_dispatcher(args: dict[str, list[str]], ep: int) -> str:
    """The dispatcher `dispatcher_args` wrote (Megatron-LM's own default, allgather, where none is named; the
    default of the plan field where experts are not sharded)."""
    if ep == 1:
        return DISPATCHERS[0]
    kind = args.get("--moe-token-dispatcher-type", ["allgather"])[0]
    return args.get("--moe-flex-dispatcher-backend", ["deepep"])[0] if kind == "flex" else kind


def _read(text: str, spec: "WorkloadSpec") -> Plan:
    args = parse_args(shlex.split(text))
    if hybrid.is_hybrid(spec):
        hybrid.read_model(args, spec)
    kept = (int(args.get("--num-layers-at-start-in-bf16", ["0"])[0]), int(args.get("--num-layers-at-end-in-bf16", ["0"])[0]))
    if kept != (spec.training.bf16_first_layers, spec.training.bf16_last_layers):
        raise LaunchError(f"the launch file keeps {kept[0]} first and {kept[1]} last layers in BF16, the spec "
                          f"{spec.training.bf16_first_layers} and {spec.training.bf16_last_layers} "
                          f"(training.bf16_first_layers/bf16_last_layers): write the file again from this spec")
    fields = common_fields(args, AXIS_FLAGS, spec)
    strategy = args.get("--data-parallel-sharding-strategy", [None])[0]
    zero = inverse(_SHARDING)[strategy] if "--use-megatron-fsdp" in args else \
        int("--use-distributed-optimizer" in args or args.get("--optimizer") == ["dist_muon"])
    if "--pipeline-model-parallel-layout" in args:
        v = len(layout_stages(args["--pipeline-model-parallel-layout"][0])) // fields["pp"]
    else:
        v = int(args.get("--num-virtual-stages-per-pipeline-rank", ["1"])[0])
    schedule = "interleaved" if v > 1 else "1f1b"
    kinds = {kind for kind, flag in _OVERLAP_FLAGS if flag in args}
    if schedule == "interleaved" and "--no-overlap-p2p-communication" not in args:
        kinds.add("pp")
    cp_comm = inverse(_CP_COMM)[args.get("--cp-comm-type", ["p2p"])[0]]
    placement = "tp-cp-pp-dp" if "--use-tp-pp-dp-mapping" in args else "tp-cp-dp-pp"
    return Plan(**fields, zero=zero, schedule=schedule, v=v, placement=placement,  # type: ignore[arg-type]
                overlap=overlap_value(kinds), cp_comm=cp_comm, dispatcher=read_dispatcher(args, fields["ep"]),
                **_read_levers(args))


# Transformer Engine's DotProductAttention backend where both are installed (its get_attention_backend): FlashAttention
# on Ampere; FusedAttention (cuDNN) on Hopper and later, "to give FusedAttention preference on Hopper+ for performance
# reasons" (transformer_engine/pytorch/attention/dot_product_attention/utils.py).
TE_ATTENTION = {"ampere": "flash-attention-2", "hopper": "cudnn", "blackwell": "cudnn"}

# Its kernel settings: Transformer Engine's layers and attention (the backend TE_ATTENTION picks), every fusion on, no
# CUDA graphs (`megatron/training/arguments.py` defaults); the MoE token permutations fused and the router not, as
# Megatron-Bridge's MoE model providers and performance recipes set them (moe_permute_fusion True, moe_router_fusion
# False); the launch file sets each (`kernel_args`).
# Its flash and cuDNN backends are Transformer Engine's DotProductAttention, and so is --tp-comm-overlap's userbuffers.
KERNELS = KernelChoices(Kernels(attention="cudnn", transformer_engine=True, moe_permute_fusion=True),
                        attention_by_generation={
    gen: inverse(ATTENTION_KERNELS)[kernel] for gen, kernel in TE_ATTENTION.items()},
    te_attention=("flash", "cudnn"), te_overlap=frozenset({"tp"}))

MEGATRON = Framework(NAME, "Megatron-Core", _all_rules, _default_overlap, frozenset(OVERLAP_KINDS),
                     attention_kernel="fused: Transformer Engine's DotProductAttention (FlashAttention or cuDNN)",
                     precisions=("fp32", "fp16", "bf16", "fp8", "fp4"), memory=MEMORY, space=SPACE, axes=AXIS_FLAGS,
                     constants=recorded_constants(NAME), launch=Launch(ARGS_FILE, _write, _read, _model_errors, read_kernel_args,
                                   architectures=hybrid.MODEL_TYPES),
                     optimizers=("adam", "sgd", "muon"), lora=True,
                     never={"schedule": ("gpipe",), "orders": other_orders(ORDERS)}, recompute_modules=True,
                     levers=frozenset(LEVERS), kernels=KERNELS, versions=VERSIONS)
