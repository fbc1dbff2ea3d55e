"""Launch files for a plan as today's frameworks run it, and the parsers that read them back.

`launch_files(plan, spec)` writes, for the spec's framework (`predictor.frameworks.framework_of`), one
launch file that expresses every field of the plan, or refuses with a `LaunchError` whose reasons name the
fields the framework cannot run (`Framework.errors`, `plan_errors`):
- megatron: `megatron_args.txt`, NVIDIA/Megatron-LM `pretrain_gpt.py` arguments one option a line
  (`megatron/training/arguments.py`), and `torchrun.sh`, the command that runs them on every node;
- torchtitan: `torchtitan.toml` for `torchtitan.train --job.config_file` (pytorch/torchtitan
  `torchtitan/config/job_config.py`, `train_configs/*.toml`; float8 in `[quantize.linear.float8]`, the
  section of the TOML-configured releases since it replaced `[float8]`);
- deepspeed: `deepspeed_config.json`, a DeepSpeed config (microsoft/DeepSpeed `deepspeed/runtime/config.py`,
  `runtime/zero/config.py`) that also carries, under "megatron_deepspeed_args", the microsoft/Megatron-DeepSpeed
  `pretrain_gpt.py` arguments (`megatron/arguments.py`, `examples_deepspeed/`) that go with it (DeepSpeed
  reads only the keys it knows).
Degree flags and keys come from the axis registry (`predictor.plan.axes.Axis.launch`). `read_back(path, spec)`
parses a launch file into the plan it runs, which equals `as_run(plan, framework)`: the plan with its
overlap resolved to the kinds of communication the plan has and the framework hides, its placement as the
full rank order, and the fields a degree of 1 leaves without effect at their defaults.
"""

from __future__ import annotations

import json
import math
import shlex
import tomllib
from pathlib import Path
from typing import Any, Callable

from predictor.plan import AXES, AXIS, embedding_and_loss_in_split
from predictor.frameworks import FRAMEWORKS, Framework, framework_of
from predictor.hardware import DEVICES
from predictor.plan import OVERLAP_KINDS, Plan, overlap_kinds, plan_errors
from predictor.workload import WorkloadSpec


class LaunchError(ValueError):
    """A plan its framework cannot run; the message names each field and why."""


ARGS_FILE, TOML_FILE, JSON_FILE = "megatron_args.txt", "torchtitan.toml", "deepspeed_config.json"
# Megatron-DeepSpeed's arguments inside the DeepSpeed config.
DS_ARGS_KEY = "megatron_deepspeed_args"
_RECOMPUTE_ARGS = {"none": [], "selective": ["--recompute-granularity", "selective"],
                   "full": ["--recompute-granularity", "full", "--recompute-method", "uniform",
                            "--recompute-num-layers", "1"]}


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
# LLaMA's architecture (SwiGLU, RMSNorm, RoPE, untied embeddings, no biases) in each code base's spelling.
_LLAMA_ARGS = {
    "megatron": ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                 "--untie-embeddings-and-output-weights", "--disable-bias-linear"],
    "deepspeed": ["--swiglu", "--normalization", "rmsnorm", "--use-rotary-position-embeddings",
                  "--untie-embeddings-and-output-weights", "--disable-bias-linear"],
}
_GQA_ARGS = {"megatron": ["--group-query-attention", "--num-query-groups"], "deepspeed": ["--num-key-value-heads"]}
_MEGATRON_CP_COMM = {"ring": "p2p", "allgather": "all_gather"}
_MEGATRON_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
_MEGATRON_OVERLAP = (("dp", "--overlap-grad-reduce"), ("param", "--overlap-param-gather"), ("tp", "--tp-comm-overlap"),
                     ("ep", "--overlap-moe-expert-parallel-comm"))
# torchtitan's MoE model per family (its `model.name`; Mixtral's architecture is its llama4 MoE).
_TITAN_MODEL = {"deepseek_v3": "deepseek_v3", "qwen3_moe": "qwen3", "gpt_oss": "gpt_oss", "mixtral": "llama4"}
# torch.distributed.pipelining schedule names; PyTorch's context parallel rotates K/V shards round a ring
# with all-to-all, or all-gathers them.
_TITAN_SCHEDULE = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}
_TITAN_ROTATE = {"ring": "alltoall", "allgather": "allgather"}
_TITAN_RESHARD = {2: "never", 3: "always"}


def _inverse(mapping: dict[Any, Any]) -> dict[Any, Any]:
    return {v: k for k, v in mapping.items()}


def _overlap_value(kinds: set[str] | frozenset[str]) -> str:
    """A plan's `overlap` naming exactly these kinds."""
    return "+".join(k for k in OVERLAP_KINDS if k in kinds) or "none"


def as_run(plan: Plan, framework: Framework) -> Plan:
    """The plan as `framework` runs it, which is what its launch file reads back as.

    overlap: the kinds it hides among the communication the plan has (gradients and parameters over dp·cp
    ranks, tp, pp); cp_comm and schedule at their defaults where cp or pp is 1; placement as the rank order.
    """
    exchanged: set[str] = set()
    if plan.dp * plan.cp > 1:
        exchanged |= {"dp", "param"} if plan.zero >= 1 else {"dp"}
    exchanged |= {kind for kind in ("tp", "pp", "ep") if getattr(plan, kind) > 1}
    kinds = framework.overlap(plan) & exchanged
    return plan.with_(overlap=_overlap_value(kinds),
                      placement="-".join(plan.rank_order), cp_comm=plan.cp_comm if plan.cp > 1 else "ring",
                      schedule=plan.schedule if plan.pp > 1 else "1f1b")


def _hidden(plan: Plan) -> frozenset[str]:
    """The overlapped kinds of a plan from `as_run` (its overlap is never 'auto')."""
    return overlap_kinds(plan.overlap) or frozenset()


def _degree_args(plan: Plan, framework: str) -> list[str]:
    """The degree flags of every axis the framework's command line names (the registry's `launch`)."""
    return [token for axis in AXES if framework in axis.launch
            for token in (axis.launch[framework], str(axis.degree(plan)))]


def _read_degrees(value: Callable[[str], Any], framework: str, spec: WorkloadSpec) -> dict[str, int]:
    """Each axis's degree from the keys the framework names; where it names no data-parallel degree, dp is
    what the others leave of the world size (as Megatron derives data_parallel_size)."""
    degrees = {a.name: int(value(a.launch[framework])) if framework in a.launch else 1 for a in AXES}
    if framework not in AXIS["dp"].launch:
        degrees["dp"] = spec.cluster.gpus // math.prod(degrees[a.name] for a in AXES
                                                       if a.multiplies_gpus and a.name != "dp")
    return degrees


def _model_args(spec: WorkloadSpec, framework: str) -> list[str]:
    """The model's shape, so the launched model is the one predicted."""
    m = spec.model
    args = ["--num-layers", str(m.num_blocks), "--hidden-size", str(m.hidden), "--num-attention-heads", str(m.heads),
            "--ffn-hidden-size", str(m.ffn_hidden_size), "--seq-length", str(m.tokens),
            "--max-position-embeddings", str(m.tokens)]
    if m.kv_heads is not None and m.kv_heads != m.heads:
        args += [*_GQA_ARGS[framework], str(m.kv_heads)]
    if m.family == "llama" or m.is_moe:
        args += _LLAMA_ARGS[framework]
    if m.is_moe and framework == "megatron":
        args += _megatron_moe_args(spec)
    return args


def _megatron_moe_args(spec: WorkloadSpec) -> list[str]:
    """A mixture of experts in Megatron-LM's arguments: experts, router, grouped GEMM and the alltoall
    dispatcher (as its MoE recipes run), leading dense layers, shared experts, MLA and MTP."""
    m = spec.model
    args = ["--num-experts", str(m.experts), "--moe-router-topk", str(m.top_k), "--moe-ffn-hidden-size",
            str(m.expert_ffn_size), "--moe-router-score-function", m.router, "--moe-grouped-gemm",
            "--moe-token-dispatcher-type", "alltoall", "--moe-router-dtype", "fp32"]
    if m.head_dim is not None:
        args += ["--kv-channels", str(m.head_dim)]
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


def _common_args(plan: Plan, spec: WorkloadSpec, framework: str) -> list[str]:
    """What Megatron-LM and its fork Megatron-DeepSpeed spell alike: degrees, batch, model, SP, recompute."""
    args = [*_degree_args(plan, framework), "--micro-batch-size", str(plan.mbs),
            "--global-batch-size", str(spec.training.global_batch), *_model_args(spec, framework)]
    if plan.sp:
        args.append("--sequence-parallel")
    args += _recompute_args(plan)
    if spec.training.precision != "fp32":
        args.append("--fp16" if spec.training.precision == "fp16" else "--bf16")  # fp8/fp4 GEMMs run in a bf16 model
    return args


def _block_scaled(spec: WorkloadSpec) -> bool:
    """Whether the device has block-scaled tensor cores (MXFP8, NVFP4): Blackwell, the catalogue's fp4 devices."""
    device = DEVICES[spec.cluster.device]
    return device is not None and "fp4" in device.peak_flops


def megatron_args(plan: Plan, spec: WorkloadSpec) -> list[str]:
    """Megatron-LM `pretrain_gpt.py` arguments for a plan from `as_run`.

    ZeRO-1 is the distributed optimizer, ZeRO-2/3 Megatron-FSDP (which needs its own checkpoint format);
    FP8 runs per-tensor current scaling on Hopper and MXFP8 on Blackwell, FP4 NVFP4.
    """
    hidden = _hidden(plan)
    args = _common_args(plan, spec, "megatron")
    if plan.zero == 1:
        args.append("--use-distributed-optimizer")
    elif plan.zero >= 2:
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", _MEGATRON_SHARDING[plan.zero],
                 "--use-distributed-optimizer", "--ckpt-format", "fsdp_dtensor"]
    if plan.schedule == "interleaved":
        args += ["--num-virtual-stages-per-pipeline-rank", str(plan.v)]
        if "pp" not in hidden:
            args.append("--no-overlap-p2p-communication")
    if embedding_and_loss_in_split(plan, spec.model.num_blocks):
        args += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    if plan.cp > 1:
        args += ["--cp-comm-type", _MEGATRON_CP_COMM[plan.cp_comm]]
    args += [flag for kind, flag in _MEGATRON_OVERLAP if kind in hidden]
    if plan.rank_order == ("tp", "cp", "pp", "dp"):
        args.append("--use-tp-pp-dp-mapping")
    precision = spec.training.precision
    if precision == "fp8":
        # FP8 parameters in the param buffer (no BF16 copy), as Megatron-Bridge's FP8 performance recipes run and
        # the memory prediction assumes (predictor.memory.facts: fp8_param_gather)
        args += ["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8" if _block_scaled(spec) else "tensorwise",
                 "--fp8-param-gather"]
    elif precision == "fp4":
        args += ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    return args


def torchrun_script(plan: Plan, spec: WorkloadSpec, script: str = "pretrain_gpt.py") -> str:
    """`torchrun.sh`: runs `megatron_args.txt` on every node (set NODE_RANK and MASTER_ADDR on each).

    Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for TP or CP (before Blackwell); Megatron-FSDP wants it unset.
    """
    c = spec.cluster
    lines = ["#!/bin/sh", "# Megatron-LM on every node: set NODE_RANK and MASTER_ADDR"]
    if plan.zero >= 2:
        lines.append("unset CUDA_DEVICE_MAX_CONNECTIONS")
    elif plan.tp > 1 or plan.cp > 1:
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")
    lines.append(f"torchrun --nnodes {c.nodes} --nproc-per-node {c.gpus_per_node} --node-rank $NODE_RANK "
                 f"--rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500 {shlex.quote(script)} "
                 f'$(cat "$(dirname "$0")/{ARGS_FILE}")')
    return "\n".join(lines) + "\n"


def _put(config: dict[str, dict[str, Any]], dotted: str, value: Any) -> None:
    table, key = dotted.rsplit(".", 1)
    config.setdefault(table, {})[key] = value


def torchtitan_config(plan: Plan, spec: WorkloadSpec) -> dict[str, dict[str, Any]]:
    """torchtitan's job config for a plan from `as_run`, by TOML table.

    zero=0 replicates over dp (DDP), zero=2/3 shards over dp·cp with FSDP2 (reshard never/always); stages
    are pp·v chunks of equal layers (no lighter first or last stage); float8 uses tensorwise scaling with
    float8 all-gathers under FSDP2, and torch.compile, which float8 and async TP need to pay off.
    """
    m, t = spec.model, spec.training
    config: dict[str, dict[str, Any]] = {"model": {"name": _TITAN_MODEL.get(m.family, "llama3")}}
    # Under a pipeline the local batch is split into micro-batches; without one, micro-batches accumulate.
    config["training"] = {"local_batch_size": plan.mbs * (plan.microbatches(t.global_batch) if plan.pp > 1 else 1),
                          "global_batch_size": t.global_batch, "seq_len": m.tokens,
                          "mixed_precision_param": "float32" if t.precision == "fp32" else "bfloat16"}
    for axis in AXES:
        if "torchtitan" in axis.launch:
            _put(config, axis.launch["torchtitan"], axis.degree(plan))
    par = config["parallelism"]
    if plan.zero == 0:
        par["data_parallel_replicate_degree"] = plan.dp
        _put(config, AXIS["dp"].launch["torchtitan"], 1)
    else:
        par["data_parallel_replicate_degree"] = 1
        par["fsdp_reshard_after_forward"] = _TITAN_RESHARD[plan.zero]
    par["enable_async_tensor_parallel"] = "tp" in _hidden(plan)
    par["pipeline_parallel_schedule"] = _TITAN_SCHEDULE[plan.schedule]
    if plan.pp > 1:
        par.update(pipeline_parallel_layers_per_stage=m.num_blocks // (plan.pp * plan.v),
                   pipeline_parallel_first_stage_less_layers=0, pipeline_parallel_last_stage_less_layers=0,
                   pipeline_parallel_microbatch_size=plan.mbs)
    par["context_parallel_rotate_method"] = _TITAN_ROTATE[plan.cp_comm]
    config["activation_checkpoint"] = {"mode": plan.recompute,
                                       **({"selective_ac_option": "op"} if plan.recompute == "selective" else {})}
    fp8 = t.precision == "fp8"
    if fp8 or par["enable_async_tensor_parallel"]:
        config["compile"] = {"enable": True, "components": ["model", "loss"]}
    if fp8:
        config["model"]["converters"] = ["quantize.linear.float8"]
        config["quantize.linear.float8"] = {"recipe_name": "tensorwise", "filter_fqns": ["output"],
                                            "enable_fsdp_float8_all_gather": plan.zero >= 2,
                                            "precompute_float8_dynamic_scale_for_fsdp": plan.zero >= 2}
    return config


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)  # ints, and strings as TOML basic strings


def _toml(config: dict[str, dict[str, Any]], header: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    for table, values in config.items():
        lines += ["", f"[{table}]", *(f"{key} = {_toml_value(value)}" for key, value in values.items())]
    return "\n".join(lines) + "\n"


def deepspeed_config(plan: Plan, spec: WorkloadSpec) -> dict[str, Any]:
    """A DeepSpeed config for a plan from `as_run`, with the Megatron-DeepSpeed arguments that go with it.

    A plan without a pipeline runs DeepSpeed's plain engine (`--no-pipeline-parallel`), one with a pipeline its
    PipelineEngine; overlap_comm is the overlap of the ZeRO optimizers.
    """
    t = spec.training
    args = [*_common_args(plan, spec, "deepspeed"), "--zero-stage", str(plan.zero)]
    if plan.pp == 1:
        args.append("--no-pipeline-parallel")
    if plan.recompute != "none":
        args.append("--deepspeed-activation-checkpointing")
    config: dict[str, Any] = {
        "train_batch_size": t.global_batch,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": plan.microbatches(t.global_batch),
        "zero_optimization": {"stage": plan.zero, "overlap_comm": "dp" in _hidden(plan)},
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": {"enabled": t.precision == "fp16"},
    }
    if plan.recompute != "none":
        config["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    config[DS_ARGS_KEY] = [*args, "--deepspeed", "--deepspeed_config", JSON_FILE]
    return config


def _args_text(args: list[str]) -> str:
    """One option (a flag and its values) a line."""
    lines: list[list[str]] = []
    for token in args:
        if token.startswith("--") or not lines:
            lines.append([])
        lines[-1].append(shlex.quote(token))
    return "\n".join(" ".join(line) for line in lines) + "\n"


def _write_megatron(plan: Plan, spec: WorkloadSpec) -> dict[str, str]:
    return {ARGS_FILE: _args_text(megatron_args(plan, spec)), "torchrun.sh": torchrun_script(plan, spec)}


def _write_torchtitan(plan: Plan, spec: WorkloadSpec) -> dict[str, str]:
    m, c = spec.model, spec.cluster
    header = [f"torchtitan job config for plan {plan}",
              f"torchrun --nnodes {c.nodes} --nproc-per-node {c.gpus_per_node} -m torchtitan.train "
              f"--job.config_file {TOML_FILE}",
              f"model.flavor: register one with hidden={m.hidden}, layers={m.num_blocks}, heads={m.heads}, "
              f"kv_heads={m.kv_heads or m.heads}, ffn_hidden={m.ffn_hidden_size}, vocab={m.vocab}"]
    return {TOML_FILE: _toml(torchtitan_config(plan, spec), header)}


def _write_deepspeed(plan: Plan, spec: WorkloadSpec) -> dict[str, str]:
    return {JSON_FILE: json.dumps(deepspeed_config(plan, spec), indent=2) + "\n"}


_WRITERS: dict[str, Callable[[Plan, WorkloadSpec], dict[str, str]]] = {
    "megatron": _write_megatron, "torchtitan": _write_torchtitan, "deepspeed": _write_deepspeed}


def launch_files(plan: Plan, spec: WorkloadSpec) -> dict[str, str]:
    """{file name: text}: the spec's framework's launch file for `plan` (and Megatron's torchrun.sh).

    Raises LaunchError naming every field the framework cannot run.
    """
    framework = framework_of(spec)
    errors = plan_errors(plan, spec, allow_cross_node_tp=True) + framework.errors(plan, spec) + framework.lever_errors(plan)
    if framework.name not in _WRITERS:
        errors.append(f"{framework.title} has no launch file: `scaledl plan --validate` runs plans in it")
    if spec.model.module is not None:
        errors.append(f"model.module {spec.model.module!r} is a PyTorch module: only ScaleDL's runner launches it")
    if errors:
        raise LaunchError(f"{framework.title} cannot run {plan}: " + "; ".join(errors))
    return _WRITERS[framework.name](as_run(plan, framework), spec)


def launch_settings(plan: Plan, spec: WorkloadSpec) -> dict[str, Any]:
    """The report's launch section: {plan, framework, files, notes}; a refusal is a note and no files."""
    try:
        files, notes = launch_files(plan, spec), []
    except LaunchError as err:
        files, notes = {}, [str(err)]
    return {"plan": str(plan), "framework": framework_of(spec).name, "files": files, "notes": notes}


def _parse_args(tokens: list[str]) -> dict[str, list[str]]:
    """{flag: its values} of a command line (a flag without values maps to [])."""
    parsed: dict[str, list[str]] = {}
    values: list[str] = []
    for token in tokens:
        if token.startswith("--"):
            values = parsed.setdefault(token, [])
        else:
            values.append(token)
    return parsed


def _common_fields(args: dict[str, list[str]], framework: str, spec: WorkloadSpec) -> dict[str, Any]:
    """The fields `_common_args` writes, read back."""
    degrees = _read_degrees(lambda flag: args.get(flag, ["1"])[0], framework, spec)
    return {**degrees, "mbs": int(args["--micro-batch-size"][0]), "sp": "--sequence-parallel" in args,
            **_read_recompute(args)}


def _read_megatron(text: str, spec: WorkloadSpec) -> Plan:
    args = _parse_args(shlex.split(text))
    fields = _common_fields(args, "megatron", spec)
    strategy = args.get("--data-parallel-sharding-strategy", [None])[0]
    zero = _inverse(_MEGATRON_SHARDING)[strategy] if "--use-megatron-fsdp" in args else \
        int("--use-distributed-optimizer" in args)
    v = int(args.get("--num-virtual-stages-per-pipeline-rank", ["1"])[0])
    schedule = "interleaved" if v > 1 else "1f1b"
    kinds = {kind for kind, flag in _MEGATRON_OVERLAP if flag in args}
    if schedule == "interleaved" and "--no-overlap-p2p-communication" not in args:
        kinds.add("pp")
    cp_comm = _inverse(_MEGATRON_CP_COMM)[args.get("--cp-comm-type", ["p2p"])[0]]
    placement = "tp-cp-pp-dp" if "--use-tp-pp-dp-mapping" in args else "tp-cp-dp-pp"
    return Plan(**fields, zero=zero, schedule=schedule, v=v, placement=placement,  # type: ignore[arg-type]
                overlap=_overlap_value(kinds), cp_comm=cp_comm)


def _read_torchtitan(text: str, spec: WorkloadSpec) -> Plan:
    config = tomllib.loads(text)
    par = config["parallelism"]
    degrees = _read_degrees(lambda key: par.get(key.rsplit(".", 1)[1], 1), "torchtitan", spec)
    fsdp = degrees["dp"] > 1 or degrees["cp"] > 1  # the dp key is the shard degree
    degrees["dp"] *= par["data_parallel_replicate_degree"]
    zero = _inverse(_TITAN_RESHARD)[par["fsdp_reshard_after_forward"]] if fsdp else 0
    pp = degrees["pp"]
    schedule = _inverse(_TITAN_SCHEDULE)[par["pipeline_parallel_schedule"]]
    v = 1
    if pp > 1:
        stages = (spec.model.num_blocks + par["pipeline_parallel_first_stage_less_layers"]
                  + par["pipeline_parallel_last_stage_less_layers"]) // par["pipeline_parallel_layers_per_stage"]
        v = stages // pp
    mbs = par["pipeline_parallel_microbatch_size"] if pp > 1 else config["training"]["local_batch_size"]
    # FSDP2 / DDP and pipelining always overlap; async TP is the one switch.
    kinds = {"dp", "pp", *(["param"] if zero >= 2 else []), *(["tp"] if par["enable_async_tensor_parallel"] else [])}
    return Plan(**degrees, mbs=mbs, zero=zero, recompute=config["activation_checkpoint"]["mode"],
                sp=degrees["tp"] > 1, schedule=schedule, v=v, placement="tp-cp-dp-pp",
                overlap=_overlap_value(kinds), cp_comm=_inverse(_TITAN_ROTATE)[par["context_parallel_rotate_method"]])


def _read_deepspeed(text: str, spec: WorkloadSpec) -> Plan:
    config = json.loads(text)
    fields = _common_fields(_parse_args(config[DS_ARGS_KEY]), "deepspeed", spec)
    zero = config["zero_optimization"]["stage"]
    kinds = ({"dp", "param"} if zero == 3 else {"dp"}) if config["zero_optimization"]["overlap_comm"] else set()
    return Plan(**fields, zero=zero, schedule="1f1b", placement="tp-cp-dp-pp", overlap=_overlap_value(kinds))


_READERS: dict[str, tuple[str, Callable[[str, WorkloadSpec], Plan]]] = {
    ARGS_FILE: ("megatron", _read_megatron), TOML_FILE: ("torchtitan", _read_torchtitan),
    JSON_FILE: ("deepspeed", _read_deepspeed)}


def read_back(path: str | Path, spec: WorkloadSpec) -> Plan:
    """The plan a launch file written by `launch_files` runs (as `as_run` gives it): the inverse of the writer.

    The file is recognised by its name; the data-parallel degree Megatron and DeepSpeed derive from the
    world size comes from the spec's cluster.
    """
    path = Path(path)
    if path.name not in _READERS:
        raise LaunchError(f"{path} is not a launch file ({', '.join(_READERS)})")
    framework, read = _READERS[path.name]
    return as_run(read(path.read_text(), spec), FRAMEWORKS[framework])
