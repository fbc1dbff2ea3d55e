"""Ready-to-use launch settings for a plan: Megatron-LM arguments, a DeepSpeed config, a torchrun line.

Only what the plan and the spec determine is written; where a framework cannot express a
plan field (ZeRO-2/3 in Megatron-LM, GPipe in either), a note says so instead of guessing.
"""

from __future__ import annotations

import shlex
from typing import Any

from predictor.plan import Plan
from predictor.workload import WorkloadSpec

# Megatron-LM's default rank order is tp-(cp-ep-)dp-pp; it has one switch for tp-pp-dp.
_MEGATRON_ORDER = {"tp-dp-pp": [], "tp-pp-dp": ["--use-tp-pp-dp-mapping"]}


def megatron_args(plan: Plan, spec: WorkloadSpec) -> tuple[list[str], list[str]]:
    """Megatron-LM `pretrain_gpt.py` arguments for `plan`, and notes on what they cannot express."""
    m, t = spec.model, spec.training
    args = [
        "--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp),
        "--micro-batch-size", str(plan.mbs), "--global-batch-size", str(t.global_batch),
        "--num-layers", str(m.num_blocks), "--hidden-size", str(m.hidden), "--num-attention-heads", str(m.heads),
        "--ffn-hidden-size", str(m.ffn_hidden_size),
    ]
    notes: list[str] = []
    if m.tokens:
        args += ["--seq-length", str(m.tokens), "--max-position-embeddings", str(m.tokens)]
    if m.kv_heads is not None and m.kv_heads != m.heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    if plan.schedule == "interleaved":
        args += ["--num-layers-per-virtual-pipeline-stage", str(m.num_blocks // (plan.pp * plan.v))]
    elif plan.schedule == "gpipe" and plan.pp > 1:
        notes.append("Megatron-LM has no GPipe schedule; it will run 1F1B (less activation memory, same bubble)")
    if plan.sp:
        args.append("--sequence-parallel")
    if plan.recompute == "selective":
        args += ["--recompute-activations"]
    elif plan.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if plan.zero == 1:
        args.append("--use-distributed-optimizer")
    elif plan.zero > 1:
        notes.append(f"ZeRO stage {plan.zero} is not in Megatron-LM; use the DeepSpeed config (or Megatron FSDP)")
    if t.precision in ("bf16", "fp16"):
        args.append(f"--{t.precision}")
    if plan.placement in _MEGATRON_ORDER:
        args += _MEGATRON_ORDER[plan.placement]
    else:
        notes.append(f"Megatron-LM cannot order ranks as {plan.placement}; it will use tp-dp-pp")
    return args, notes


def deepspeed_config(plan: Plan, spec: WorkloadSpec) -> dict[str, Any]:
    """A DeepSpeed JSON config: batch sizes, ZeRO stage, precision and activation checkpointing."""
    t = spec.training
    config: dict[str, Any] = {
        "train_batch_size": t.global_batch,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": plan.microbatches(t.global_batch),
        "zero_optimization": {"stage": plan.zero},
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": {"enabled": t.precision == "fp16"},
    }
    if plan.recompute != "none":
        config["activation_checkpointing"] = {"partition_activations": plan.sp, "contiguous_memory_optimization": False}
    return config


def torchrun_command(plan: Plan, spec: WorkloadSpec, script: str = "pretrain_gpt.py") -> str:
    """One torchrun line per node (set NODE_RANK and MASTER_ADDR on each) running Megatron-LM."""
    c = spec.cluster
    args, _ = megatron_args(plan, spec)
    head = ["torchrun", "--nnodes", str(c.nodes), "--nproc-per-node", str(c.gpus_per_node),
            "--node-rank", "$NODE_RANK", "--rdzv-backend", "c10d", "--rdzv-endpoint", "$MASTER_ADDR:29500", script]
    return " ".join(a if a.startswith("$") else shlex.quote(a) for a in head + args)


def launch_settings(plan: Plan, spec: WorkloadSpec) -> dict[str, Any]:
    args, notes = megatron_args(plan, spec)
    return {"plan": str(plan), "megatron_args": args, "deepspeed_config": deepspeed_config(plan, spec),
            "torchrun": torchrun_command(plan, spec), "notes": notes}
