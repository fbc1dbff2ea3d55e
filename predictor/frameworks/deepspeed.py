"""DeepSpeed (microsoft/DeepSpeed) with microsoft/Megatron-DeepSpeed's GPT, as their code runs it.

Plans it runs: `deepspeed/runtime/zero/config.py` (`overlap_comm` defaults to stage == 3; "overlap the reduction of the
gradients with backward": the ZeRO optimizers' switch, ZeRO-3's parameter prefetch on the same stream),
`deepspeed/runtime/pipe/engine.py` ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"; it schedules the
gradient all-reduce after the pipeline flush), its 1F1B `TrainSchedule` only, `PipeModelDataParallelTopology` (pipe,
data, model: tp-dp-pp); TP and SP through Megatron-DeepSpeed, no CP, no FP8; Megatron-DeepSpeed's GPT uses unfused
attention (as vTrain's measurements ran).

Launch file: `deepspeed_config.json`, a DeepSpeed config (`deepspeed/runtime/config.py`, `runtime/zero/config.py`) that
also carries, under "megatron_deepspeed_args", the Megatron-DeepSpeed `pretrain_gpt.py` arguments
(`megatron/arguments.py`, `examples_deepspeed/`) that go with it (DeepSpeed reads only the keys it knows).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from predictor.frameworks.base import (EAGER_SOFTMAX, Framework, Launch, LaunchTarget, SoftmaxFallback, hidden, other_orders, overlap_value, parse_args,
                                       recorded_constants)
from predictor.frameworks.kernels import KernelChoices, Kernels, fusion_args, kernels_of, read_fusions
from predictor.frameworks.megatron import Spelling, common_args, common_fields, qk_norm
from predictor.memory.facts import MIB, MemoryFacts
from predictor.plan import Plan, overlap_kinds

if TYPE_CHECKING:  # pragma: no cover
    from predictor.spec.workload import WorkloadSpec

NAME = "deepspeed"
# The parallel axes it runs and their flags (Megatron-DeepSpeed's megatron/arguments.py): no context parallelism here,
# and DeepSpeed-MoE's expert parallelism is not modelled; dp is what tp and pp leave of the world size.
AXIS_FLAGS: dict[str, str] = {"tp": "--tensor-model-parallel-size", "dp": "", "pp": "--pipeline-model-parallel-size"}
# The release the launch files are written for and checked against (tests/test_framework_checks.py: DeepSpeedConfig
# and the engine's refusals): DeepSpeed 0.19.8 (PyPI), with microsoft/Megatron-DeepSpeed's pretrain_gpt.py.
VERSIONS: tuple[str, ...] = ("0.19.8",)
ORDERS: tuple[tuple[str, ...], ...] = (("tp", "cp", "dp", "pp"),)


def _rules(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    errors = []
    if plan.pp > 1 and plan.zero > 1:
        errors.append(f"runs its pipeline engine only with ZeRO stage 0 or 1, not zero={plan.zero}")
    if plan.schedule != "1f1b":
        errors.append(f"has one pipeline schedule (1F1B), not {plan.schedule}")
    if plan.rank_order not in ORDERS:
        errors.append(f"orders ranks tp-dp-pp only, not {'-'.join(plan.rank_order)}")
    if spec.model.is_moe and plan.zero == 3:
        errors.append("runs its native MoE (Megatron-DeepSpeed's --num-experts) with ZeRO stage 1 or 2 only, not zero=3 "
                      "(deepspeed/runtime/engine.py line 2215: \"Native DeepSpeed MoE is not supported with ZeRO Stage "
                      "3\")")
    if plan.optimizer_offload not in (0.0, 1.0):
        errors.append(f"offloads the whole optimizer or none of it (ZeRO-Offload), not optimizer_offload="
                      f"{plan.optimizer_offload:g}")
    elif plan.optimizer_offload and plan.zero == 0:
        errors.append("offloads the optimizer under ZeRO only (ZeRO-Offload): use zero >= 1 with optimizer_offload=1")
    wanted = overlap_kinds(plan.overlap)
    if wanted is None:
        return errors
    if "dp" in wanted and plan.dp > 1 and (plan.zero == 0 or plan.pp > 1):
        errors.append("overlaps the gradient reduction only in its ZeRO optimizers without a pipeline "
                      f"(overlap_comm), not with zero={plan.zero}, pp={plan.pp}")
    if "param" in wanted and plan.zero in (1, 2):
        errors.append(f"gathers zero={plan.zero} parameters after the optimizer step: it cannot overlap param")
    if plan.zero == 3 and ("dp" in wanted) != ("param" in wanted):
        errors.append("switches ZeRO-3's gradient reduce-scatter and parameter prefetch together (overlap_comm): "
                      "overlap must include both dp and param or neither")
    return errors


def _default_overlap(plan: Plan) -> frozenset[str]:
    return frozenset({"dp", "param"} if plan.zero == 3 else set())


# DeepSpeed ZeRO (bf16): bf16 gradients (2 B), fp32 master + moments partitioned; contiguous_gradients with
# reduce_bucket_size 5e8 elements; ZeRO-3 prefetches stage3_prefetch_bucket_size 5e7 parameters.
MEMORY = MemoryFacts(NAME, grad_bytes=2.0, master_bytes=4.0, moment_bytes=4.0, grads_sharded_from=2,
                     fp32_grad_partition=True, saved="graph",
                     swiglu_saved=4.0, loss_saved_bytes=4.0, loss_peak_bytes=6.0,
                     grad_bucket_bytes=5e8 * 2, prefetch_params=5e7, workspace_bytes=32 * MIB)

# Its own search space, the default of `scaledl plan` for it: ZeRO stages 0-3 over the data-parallel ranks,
# Megatron-DeepSpeed's tensor parallelism (with or without sequence parallelism) and its 1F1B pipeline engine (with
# ZeRO 0 or 1 only). It has no context parallelism here, and its MoE is not modelled, so neither cp nor ep is searched.
SPACE: dict[str, Any] = {
    "description": "DeepSpeed (ZeRO 0-3, Megatron-DeepSpeed tp, 1F1B pp with ZeRO 0/1)",
    "dp": "auto", "tp": "auto", "pp": "auto", "mbs": [1, 2, 4, 8, 16], "zero": [0, 1, 2, 3],
    "recompute": ["none", "selective", "full"], "sp": [False, True], "schedule": ["1f1b"], "placement": ["tp-dp-pp"],
    "allow_cross_node_tp": False,
}



def _fused_softmax_runs(batches: Any, sq: Any, sk: Any) -> Any:
    """Megatron-DeepSpeed's `FusedScaleMaskSoftmax.forward` (megatron/model/fused_softmax.py): its CUDA kernel runs
    only where 16 < sk <= 2048, sq % 4 == 0 and the attention batches (micro-batch times heads per rank) % 4 == 0."""
    return (sk > 16) & (sk <= 2048) & (sq % 4 == 0) & (batches % 4 == 0)


# Elsewhere it runs the eager path (EAGER_SOFTMAX's operators and passes).
SOFTMAX_FALLBACK = SoftmaxFallback(_fused_softmax_runs, EAGER_SOFTMAX.ops, EAGER_SOFTMAX.passes)

JSON_FILE = "deepspeed_config.json"
# Megatron-DeepSpeed's arguments inside the DeepSpeed config.
ARGS_KEY = "megatron_deepspeed_args"


def _moe_args(spec: "WorkloadSpec") -> list[str]:
    """DeepSpeed-MoE in Megatron-DeepSpeed's arguments (`megatron/arguments.py`): the experts in every layer
    (`--expert-interval 1`: its default 2 puts them in every other layer), top-k gating, no token dropping (the
    prediction routes every token) and the separate MoE parameter groups its ZeRO optimizers need."""
    m = spec.model
    return ["--num-experts", str(m.experts), "--topk", str(m.top_k), "--expert-interval", "1",
            "--disable-moe-token-dropping", "--create-moe-param-group"]


def _model_errors(spec: "WorkloadSpec") -> list[str]:
    """What of the model Megatron-DeepSpeed's GPT cannot build: its attention has no per-head q/k norms or local
    window, its gated MLP is SwiGLU between pre-norms only, and its experts are copies of the dense MLP behind a
    softmax top-k gate, in every layer."""
    m = spec.model
    parts = m.family_entry.extra_parts if m.family_entry is not None else ()
    unbuilt = {"per-head q/k RMSNorms": qk_norm(m), f"{m.family}'s {', '.join(parts)}": parts,
               "local attention": m.sliding_window is not None and m.local_layers > 0}
    if m.is_moe:
        unbuilt |= {f"shared experts ({m.shared_experts})": m.shared_experts,
                    f"{m.dense_layers} leading dense layers (it puts experts every --expert-interval layers)":
                        m.dense_layers,
                    "multi-latent attention": m.kv_lora_rank is not None,
                    f"multi-token prediction ({m.mtp_layers} layers)": m.mtp_layers,
                    f"a {m.router} router (its gate is a softmax)": m.router != "softmax",
                    f"experts of ffn {m.expert_ffn_size} beside a dense ffn of {m.ffn_hidden_size} (its experts copy "
                    f"the dense MLP)": m.expert_ffn_size != m.ffn_hidden_size}
    return [f"Megatron-DeepSpeed's GPT cannot build {what}" for what, present in unbuilt.items() if present]


SPELLING = Spelling(llama=("--swiglu", "--normalization", "rmsnorm", "--use-rotary-position-embeddings",
                           "--untie-embeddings-and-output-weights", "--disable-bias-linear"),
                    gqa=("--num-key-value-heads",), moe=_moe_args)


def deepspeed_config(plan: Plan, spec: "WorkloadSpec") -> dict[str, Any]:
    """A DeepSpeed config for a plan from `as_run`, with the Megatron-DeepSpeed arguments that go with it.

    A plan without a pipeline runs DeepSpeed's plain engine (`--no-pipeline-parallel`), one with a pipeline its
    PipelineEngine; overlap_comm is the overlap of the ZeRO optimizers.
    """
    t = spec.training
    args = [*common_args(plan, spec, AXIS_FLAGS, SPELLING), "--zero-stage", str(plan.zero)]
    if plan.pp == 1:
        args.append("--no-pipeline-parallel")
    if plan.recompute != "none":
        args.append("--deepspeed-activation-checkpointing")
    kernels = kernels_of(spec, KERNELS, "")  # its defaults are the same on every generation
    args += (["--use-flash-attn-v2"] if kernels.attention == "flash" else []) + fusion_args(kernels)
    config: dict[str, Any] = {
        "train_batch_size": t.global_batch,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": plan.microbatches(t.global_batch),
        "zero_optimization": {"stage": plan.zero, "overlap_comm": "dp" in hidden(plan),
                              **({"offload_optimizer": {"device": "cpu", "pin_memory": True}}
                                 if plan.optimizer_offload else {})},
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": {"enabled": t.precision == "fp16"},
    }
    if plan.recompute != "none":
        config["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    config[ARGS_KEY] = [*args, "--deepspeed", "--deepspeed_config", JSON_FILE]
    return config


def _write(plan: Plan, target: LaunchTarget) -> dict[str, str]:
    return {JSON_FILE: json.dumps(deepspeed_config(plan, target.spec), indent=2) + "\n"}


def _read_kernels(text: str) -> dict[str, Any]:
    """The kernel settings `deepspeed_config` wrote into the Megatron-DeepSpeed arguments."""
    args = parse_args(json.loads(text)[ARGS_KEY])
    return {"attention": "flash" if "--use-flash-attn-v2" in args else "unfused", **read_fusions(args)}


def _read(text: str, spec: "WorkloadSpec") -> Plan:
    config = json.loads(text)
    fields = common_fields(parse_args(config[ARGS_KEY]), AXIS_FLAGS, spec)
    zero = config["zero_optimization"]["stage"]
    kinds = ({"dp", "param"} if zero == 3 else {"dp"}) if config["zero_optimization"]["overlap_comm"] else set()
    offload = float("offload_optimizer" in config["zero_optimization"])
    return Plan(**fields, zero=zero, schedule="1f1b", placement="tp-cp-dp-pp", overlap=overlap_value(kinds),
                optimizer_offload=offload)


# Megatron-DeepSpeed's GPT: unfused attention unless --use-flash-attn-v2 (megatron/arguments.py), its own modules.
KERNELS = KernelChoices(Kernels(attention="unfused"), allowed={
    "attention": (("unfused", "flash"), "runs unfused attention or FlashAttention-2 (--use-flash-attn-v2), not cuDNN's"),
    "cuda_graphs": ((False,), "(Megatron-DeepSpeed) captures no CUDA graphs"),
    "cuda_graph_scope": (("layer",), "(Megatron-DeepSpeed) captures no CUDA graphs"),
    "transformer_engine": ((False,), "(Megatron-DeepSpeed's GPT) is built from its own modules, not Transformer Engine's"),
    "moe_permute_fusion": ((False,), "(DeepSpeed-MoE) dispatches tokens by its gating's einsum "
                                     "(deepspeed/moe/sharded_moe.py), not Transformer Engine's permutation kernels"),
    "moe_router_fusion": ((False,), "(DeepSpeed-MoE) routes with its own top-k gating (deepspeed/moe/sharded_moe.py), "
                                    "not Transformer Engine's fused router")})

DEEPSPEED = Framework(NAME, "DeepSpeed", _rules, _default_overlap, frozenset({"dp", "param"}),
                      attention_kernel="unfused: Megatron-DeepSpeed's baddbmm, fused scale-mask-softmax, dropout and bmm "
                                       "(no --use-flash-attn)",
                      precisions=("fp32", "fp16", "bf16"), memory=MEMORY, space=SPACE, axes=AXIS_FLAGS,
                      constants=recorded_constants(NAME), launch=Launch(JSON_FILE, _write, _read, _model_errors, _read_kernels),
                      never={"schedule": ("gpipe", "interleaved"), "orders": other_orders(ORDERS),
                             "dispatcher": ("allgather", "deepep", "hybridep")},
                      never_why={"dispatcher": "(DeepSpeed-MoE) exchanges expert tokens with its own all-to-all "
                                               "(deepspeed/moe/sharded_moe.py _AllToAll)"},
                      levers=frozenset({"optimizer_offload"}), softmax_fallback=SOFTMAX_FALLBACK, kernels=KERNELS,
                      versions=VERSIONS)
