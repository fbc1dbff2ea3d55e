"""torchtitan (pytorch/torchtitan), as its job config and parallelisation code run it.

Plans it runs: `torchtitan/config/job_config.py` (`Parallelism`), `distributed/parallel_dims.py` (`fsdp_enabled =
dp_shard_enabled or cp_enabled`: FSDP2 whenever cp > 1), `models/llama3/infra/parallelize.py`
(`fsdp_reshard_after_forward` never = ZeRO-2, always = ZeRO-3, default = never with a pipeline, else ZeRO-3 with
[norm, output] kept gathered after forward; DDP replicate =
ZeRO-0, with no other parallelism; no ZeRO-1; seq_len divisible by tp·2·cp, `ParallelDims.seq_len_divisor`), TP
always with sequence-parallel norms, async TP (`enable_async_tensor_parallel`, off by default),
`distributed/pipeline_parallel.py` (`torch.distributed.pipelining` GPipe, 1F1B, Interleaved1F1B; a multi-stage
schedule needs >= 2 stages per rank), CP, float8 (torchao); mesh order pp-dp-cp-tp (tp innermost). FSDP2
prefetches all-gathers and overlaps reduce-scatters, DDP overlaps its bucketed all-reduce, neither can be switched
off; SDPA flash attention.

Launch file: `torchtitan.toml` for `torchtitan.train --job.config_file`, the job config of torchtitan 0.2.2 (PyPI;
`torchtitan/config/job_config.py`, loaded by `config/manager.py`'s ConfigManager), the last release with that TOML
loader: 0.3 builds its config from Python `config_registry` functions. Float8 is `[quantize.linear.float8]`
(tensorwise) or `[quantize.linear.mx]` (MXFP8), by the spec's recipe (`CONVERTERS`).
"""

from __future__ import annotations

import json
import math
import tomllib
from typing import TYPE_CHECKING, Any

from predictor.frameworks.kernels import KernelChoices, Kernels
from predictor.frameworks.base import (Framework, Launch, LaunchError, LaunchTarget, hidden, inverse, other_orders, overlap_value,
                                       read_degrees, recorded_constants, spec_recipe)
from predictor.costs.bf16_layers import bf16_layer_indices
from predictor.memory.facts import MIB, MemoryFacts
from predictor.plan import AXES, OVERLAP_KINDS, Plan, overlap_kinds

if TYPE_CHECKING:  # pragma: no cover
    from predictor.spec.workload import WorkloadSpec

NAME = "torchtitan"
# The parallel axes it runs and their keys in its job config (torchtitan/config/job_config.py `Parallelism`); the
# dp key is the FSDP shard degree (`_write` moves a zero=0 plan's dp to data_parallel_replicate_degree).
AXIS_FLAGS: dict[str, str] = {"tp": "parallelism.tensor_parallel_degree", "cp": "parallelism.context_parallel_degree",
                              "dp": "parallelism.data_parallel_shard_degree",
                              "pp": "parallelism.pipeline_parallel_degree", "ep": "parallelism.expert_parallel_degree",
                              "etp": "parallelism.expert_tensor_parallel_degree"}
# The release the launch files are written for and checked against (tests/test_torchtitan_config.py): the last with
# the `--job.config_file` TOML loader; 0.3.0, the newest on PyPI, builds its config from Python functions instead.
VERSIONS: tuple[str, ...] = ("0.2.2",)
ORDERS: tuple[tuple[str, ...], ...] = (("tp", "cp", "dp", "pp"),)


def _rules(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    errors = []
    if plan.zero == 1:
        errors.append("has no ZeRO-1 (it runs DDP replicate = zero=0, FSDP2 without resharding = zero=2, "
                      "FSDP2 = zero=3)")
    if plan.zero == 0 and plan.cp > 1:
        errors.append(f"shards with FSDP2 over the context-parallel ranks whenever cp > 1, so zero=0 (DDP) "
                      f"cannot run with cp={plan.cp} (use zero=2 or 3)")
    beside = [f"{axis}={getattr(plan, axis)}" for axis in ("tp", "pp", "ep") if getattr(plan, axis) > 1]
    if plan.zero == 0 and plan.dp > 1 and beside:
        errors.append(f"runs DDP (zero=0) only as the sole parallelism (\"DDP has not supported > 1D parallelism\"; "
                      f"experts shard over FSDP2 ranks), so zero=0 with dp={plan.dp} cannot run with "
                      f"{', '.join(beside)} (use zero=2 or 3)")
    if plan.tp > 1 and not plan.sp:
        errors.append("always runs tensor parallelism with sequence-parallel norms (use sp=true)")
    if plan.etp not in (1, plan.tp):
        errors.append(f"splits experts over expert_tensor_parallel_degree 1 or tp only (ParallelDims: \"Currently we "
                      f"only support ETP=TP or ETP=1\"), not etp={plan.etp} with tp={plan.tp}")
    divisor, tokens = plan.tp * 2 * plan.cp, spec.model.tokens
    if tokens % divisor:
        other = f", or tp and cp whose tp*2*cp divides {tokens}" if tokens % 2 == 0 else ""
        errors.append(f"needs model.seq_len divisible by tp*2*cp = {plan.tp}*2*{plan.cp} = {divisor} (its "
                      f"parallelize asserts it: sequence-parallel norms split the sequence over tp, context "
                      f"parallelism into 2*cp chunks), which seq_len={tokens} is not (use a model.seq_len that is a "
                      f"multiple of {divisor}{other})")
    recipe = spec_recipe(spec)
    if recipe is not None and recipe not in CONVERTERS:
        errors.append(f"runs float8 as torchao's converters do, dynamic tensorwise scaling (training.recipe current), "
                      f"row-wise scaling (rowwise) or MXFP8 (mxfp8), not training.recipe {recipe} (use one of them)")
    blocks = _chunk_blocks(plan, spec)
    if plan.recompute_layers and (blocks % plan.recompute_layers or spec.model.num_blocks % (plan.pp * plan.v)):
        errors.append(f"checkpoints some layers only as every N-th block of a model chunk (selective_ac_option = N), "
                      f"so recompute_layers={plan.recompute_layers} needs recompute=full and a count dividing the "
                      f"{blocks} blocks of each chunk (use a divisor of {blocks}, or recompute_layers=0)")
    if plan.schedule == "interleaved" and plan.v == 1:
        errors.append("needs at least 2 stages per rank for Interleaved1F1B (use v >= 2 or schedule=1f1b)")
    if plan.rank_order not in ORDERS:
        errors.append(f"orders ranks tp-cp-dp-pp only (its mesh is pp, dp, cp, tp), not {'-'.join(plan.rank_order)}")
    wanted = overlap_kinds(plan.overlap)
    if wanted and "tp" in wanted and plan.tp > 1 and spec.training.compile is False:
        errors.append("runs async TP (overlap with tp) only under torch.compile (\"Async TP requires torch.compile\", "
                      "models/llama3/infra/parallelize.py): set training.compile: true or leave tp out of overlap")
    if wanted is None:
        return errors
    always = {"dp"} if plan.group_size("dp") > 1 else set()
    if plan.zero >= 2:
        always.add("param")
    if plan.pp > 1:
        always.add("pp")
    forced = "+".join(sorted(always - wanted))
    if forced:
        errors.append(f"always overlaps {forced} (FSDP2 prefetch and reduce-scatter, DDP buckets, pipelining "
                      f"send/recv): overlap must include {forced}")
    return errors


def _default_overlap(plan: Plan) -> frozenset[str]:
    return frozenset({"dp", "param", "pp"} if plan.zero >= 2 else {"dp", "pp"})


# FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): the sharded parameter is the fp32 master (no
# separate copy), gradients reduce-scatter to fp32 shards; F.cross_entropy on .float() logits keeps the fp32
# log-softmax (4 B) and its backward adds an fp32 gradient and its bf16 cast (6 B).
MEMORY = MemoryFacts(NAME, grad_bytes=4.0, master_bytes=0.0, moment_bytes=4.0, grads_sharded_from=2,
                     fsdp2_states=True, saved="torchtitan", selective="op",
                     swiglu_saved=4.0, loss_saved_bytes=4.0, loss_peak_bytes=10.0,
                     grad_bucket_bytes=0.0, prefetch_params=0.0, workspace_bytes=32 * MIB)

# Its own search space, the default of `scaledl plan` for it: FSDP2 with resharding after forward (zero=3) and without
# (zero=2) beside tensor parallelism with sequence-parallel norms, torch.distributed.pipelining's 1F1B and
# Interleaved1F1B, expert parallelism for a mixture of experts, and context parallelism for sequences of cp_from_tokens
# or more, or DDP (zero=0) alone (the rules keep what it runs).
SPACE: dict[str, Any] = {
    "description": "torchtitan (FSDP2 zero 2/3 or DDP, tp with sp, 1F1B/interleaved pp, ep for MoE, cp for long "
                   "sequences)",
    "dp": "auto", "tp": "auto", "pp": "auto", "cp": [1], "cp_from_tokens": 16384, "ep": "auto", "mbs": [1, 2, 4, 8],
    "v": "auto", "max_v": 6, "zero": [0, 2, 3], "recompute": ["none", "selective", "full"],
    "recompute_layers": "auto", "sp": [False, True],
    "schedule": ["1f1b", "interleaved"], "placement": ["tp-dp-pp"], "allow_cross_node_tp": False,
}

TOML_FILE = "torchtitan.toml"
# Its model (`model.name`) for a family whose record names none.
DEFAULT_MODEL = "llama3"
# torch.distributed.pipelining schedule names; PyTorch's context parallel rotates K/V shards round a ring
# with all-to-all, or all-gathers them.
_SCHEDULE = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}
_ROTATE = {"ring": "alltoall", "allgather": "allgather"}
# fsdp_reshard_after_forward (torchtitan/models/llama3/infra/parallelize.py `apply_fsdp`): "never" keeps the gathered
# weights (zero=2); zero=3 is its "default" without a pipeline, which reshards every unit but [norm, output] (FSDP2
# prefetches them again at once), and "always" with one, where "default" reshards nothing.
_RESHARD = {2: "never", 3: "always"}


def _reshard_policy(plan: Plan) -> str:
    return "default" if plan.zero == 3 and plan.pp == 1 else _RESHARD[plan.zero]


def _reshard_zero(policy: str, pp: int) -> int:
    """The zero stage of a fsdp_reshard_after_forward policy (torchtitan's "default" shards again unless pipelined)."""
    return (2 if pp > 1 else 3) if policy == "default" else inverse(_RESHARD)[policy]
# Its expert-parallel token exchange per dispatcher (torchtitan/config/job_config.py
# `parallelism.expert_parallel_comm_backend: Literal["standard", "deepep"]`: "standard" is `all_to_all_single` in
# torchtitan/distributed/expert_parallel.py, "deepep" torchtitan/distributed/deepep/); no all-gather, no Hybrid-EP.
_EP_BACKEND = {"alltoall": "standard", "deepep": "deepep"}
# The flavors torchtitan ships (`<model>_configs` in torchtitan/models/<model>/__init__.py), by the model dimensions a
# spec names; a model that matches none is a flavor to register (`UNREGISTERED`).
FLAVORS: dict[str, dict[str, dict[str, int]]] = {
    "llama3": {
        "8B": {"hidden": 4096, "num_blocks": 32, "heads": 32, "kv_heads": 8, "ffn_hidden_size": 14336, "vocab": 128256},
        "70B": {"hidden": 8192, "num_blocks": 80, "heads": 64, "kv_heads": 8, "ffn_hidden_size": 28672, "vocab": 128256},
        "405B": {"hidden": 16384, "num_blocks": 126, "heads": 128, "kv_heads": 8, "ffn_hidden_size": 53248,
                 "vocab": 128256},
    },
    "deepseek_v3": {
        "16B": {"hidden": 2048, "num_blocks": 27, "heads": 16, "ffn_hidden_size": 10944, "vocab": 102400, "experts": 64,
                "top_k": 6, "expert_ffn_size": 1408, "dense_layers": 1, "shared_experts": 2},
        "236B": {"hidden": 5120, "num_blocks": 60, "heads": 128, "ffn_hidden_size": 12288, "vocab": 102400,
                 "experts": 160, "top_k": 6, "expert_ffn_size": 1536, "dense_layers": 1, "shared_experts": 2},
        "671B": {"hidden": 7168, "num_blocks": 61, "heads": 128, "ffn_hidden_size": 18432, "vocab": 129280,
                 "experts": 256, "top_k": 8, "expert_ffn_size": 2048, "dense_layers": 3, "shared_experts": 1},
    },
    "qwen3": {
        "8B": {"hidden": 4096, "num_blocks": 36, "heads": 32, "kv_heads": 8, "ffn_hidden_size": 12288, "vocab": 151936,
               "head_dim": 128, "experts": None},
        "32B": {"hidden": 5120, "num_blocks": 64, "heads": 64, "kv_heads": 8, "ffn_hidden_size": 25600, "vocab": 151936,
                "head_dim": 128, "experts": None},
        "30B-A3B": {"hidden": 2048, "num_blocks": 48, "heads": 32, "kv_heads": 4, "vocab": 151936, "experts": 128,
                    "top_k": 8, "expert_ffn_size": 768},
    },
}
UNREGISTERED = "scaledl"


def flavor(spec: "WorkloadSpec") -> str | None:
    """torchtitan's shipped flavor of the spec's model, None where none has its dimensions."""
    m = spec.model
    shipped = FLAVORS.get(model_name(spec) or "", {})
    return next((name for name, dims in shipped.items() if all(getattr(m, k) == v for k, v in dims.items())), None)


def model_name(spec: "WorkloadSpec") -> str | None:
    """torchtitan's model of the spec's family (`model.name`, the family record's spelling), None where it ships none."""
    fam = spec.model.family_entry
    return fam.launch_names.get(NAME, DEFAULT_MODEL) if fam is not None else DEFAULT_MODEL


def _stage_split(blocks: int, chunks: int) -> tuple[int, int, int]:
    """(first_stage_less_layers, last_stage_less_layers, layers_per_stage) that make torchtitan cut `blocks` layers
    into `chunks` stages (`distributed/pipeline_parallel.py`: stages = ceil((layers + first + last) / per_stage),
    the layers then spread as evenly as whole layers allow, the first and last stages `first`/`last` lighter).
    An even split is (0, 0, blocks / chunks)."""
    per_stage = math.ceil(blocks / chunks)
    weight = max(0, (chunks - 1) * per_stage + 1 - blocks)  # the least that still makes ceil(...) = chunks
    first = weight // 2
    if max(first, weight - first) > (blocks + weight) // chunks:  # generate_llm_fqn_per_model_part's balance check
        raise LaunchError(f"torchtitan cannot cut {blocks} layers into {chunks} pipeline stages (its split would "
                          f"weigh the embedding and the output {weight} layers, more than a stage holds): use a pp*v "
                          f"that divides the layers or is at most {blocks // 2}")
    return first, weight - first, per_stage


def _compiles(plan: Plan, spec: "WorkloadSpec") -> bool:
    """What torchtitan runs when training.compile is unset: compiled where float8, MX or NVFP4 linears or async TP
    need torch.compile to pay off (its own default, `[compile] enable = false`, leaves them slower than BF16)."""
    return spec.training.precision in ("fp8", "fp4") or "tp" in (overlap_kinds(plan.overlap) or ())


def _async_tp_exposed(plan: Plan) -> float:
    """The share of a block's tensor-parallel traffic async TP leaves exposed. PyTorch's micro-pipeline TP
    (pytorch/pytorch torch/_inductor/fx_passes/micro_pipeline_tp.py) fuses an all-gather into the matmuls that take
    it as their left operand (`_find_consumer_matmuls`: fused_all_gather_matmul) and a reduce-scatter into the matmul
    that produces its input (`_find_producer_matmul`); the fused ops (torch/distributed/_symmetric_memory) pipeline
    the tp shards, so a fused all-gather hides whole and a fused reduce-scatter all but its last shard. Per block and
    micro-batch, of equal collectives: forward, 2 all-gathers and 2 reduce-scatters, all fused; backward, 2
    all-gathers of output gradients (fused into the dgrad matmuls) and 2 reduce-scatters of summed input gradients
    (q, k, v and w1, w3's dgrads are added first: an add, not a matmul, feeds them, so they stay exposed); the
    recomputed forward repeats the all-gathers (per-op: the reduce-scatters' outputs are saved) or all four (full)."""
    again = {"full": 4, "selective": 2}.get(plan.recompute, 0)
    fused_rs = 2 + (2 if plan.recompute == "full" else 0)
    return (2 + fused_rs / plan.tp) / (8 + again)


def _chunk_blocks(plan: Plan, spec: "WorkloadSpec") -> int:
    """Transformer blocks per model chunk (a pipeline stage's share of the layers, or all of them)."""
    return spec.model.num_blocks // (plan.pp * plan.v)


def _checkpointing(plan: Plan, spec: "WorkloadSpec") -> dict[str, str]:
    """The `[activation_checkpoint]` table (torchtitan/distributed/activation_checkpoint.py): `full`; `selective` per
    op (`selective_ac_option = "op"`); or, for recompute=full of `recompute_layers` blocks per chunk, `selective` by
    layer, which checkpoints every N-th block (`_apply_layer_sac`: N = the blocks of a chunk over the count)."""
    if plan.recompute == "full" and plan.recompute_layers:
        return {"mode": "selective", "selective_ac_option": str(_chunk_blocks(plan, spec) // plan.recompute_layers)}
    return {"mode": plan.recompute, **({"selective_ac_option": "op"} if plan.recompute == "selective" else {})}


def _recompute(table: dict[str, str], plan_blocks: int) -> tuple[str, int]:
    """(recompute, recompute_layers) of an `[activation_checkpoint]` table, `plan_blocks` the blocks per chunk."""
    option = table.get("selective_ac_option", "op")
    if table["mode"] == "selective" and option.isdigit():
        return "full", plan_blocks // int(option)
    return table["mode"], 0


def _put(config: dict[str, dict[str, Any]], dotted: str, value: Any) -> None:
    table, key = dotted.rsplit(".", 1)
    config.setdefault(table, {})[key] = value


def torchtitan_config(plan: Plan, spec: "WorkloadSpec") -> dict[str, dict[str, Any]]:
    """torchtitan's job config for a plan from `as_run`, by TOML table.

    zero=0 replicates over dp (DDP), zero=2/3 shards over dp·cp with FSDP2 (reshard never, or default / always with a pipeline); stages
    are pp·v chunks of equal layers where they divide (`_stage_split` otherwise); float8 is the spec's recipe: current
    scaling as torchao's tensorwise with float8 all-gathers under FSDP2, named by no recipe_name (Float8LinearConverter
    refuses a recipe beside FSDP float8 all-gathers), or MXFP8 as `[quantize.linear.mx]` mxfp8_cublas. torch.compile of the blocks and the loss is the spec's training.compile, else on where float8 or
    async TP need it to pay off (`_compiles`). The model is the
    shipped flavor with the spec's dimensions, else `UNREGISTERED` (to register); a mixture of experts runs its routed
    experts with the plan's expert tensor parallelism (expert_tensor_parallel_degree, written for a MoE model only).
    """
    m, t = spec.model, spec.training
    config: dict[str, dict[str, Any]] = {"model": {"name": model_name(spec),
                                                   "flavor": flavor(spec) or UNREGISTERED}}
    # Under a pipeline the local batch is split into micro-batches; without one, micro-batches accumulate.
    config["training"] = {"local_batch_size": plan.mbs * (plan.microbatches(t.global_batch) if plan.pp > 1 else 1),
                          "global_batch_size": t.global_batch, "seq_len": m.tokens,
                          "mixed_precision_param": "float32" if t.precision == "fp32" else "bfloat16"}
    for axis in AXES:
        if AXIS_FLAGS.get(axis.name):
            _put(config, AXIS_FLAGS[axis.name], axis.degree(plan))
    par = config["parallelism"]
    if plan.zero == 0:
        par["data_parallel_replicate_degree"] = plan.dp
        _put(config, AXIS_FLAGS["dp"], 1)
    else:
        if plan.zero not in _RESHARD:
            raise LaunchError(f"{TOML_FILE} has no ZeRO-{plan.zero}: FSDP2 reshards after forward (zero=3) or keeps "
                              "the gathered weights (zero=2)")
        par["data_parallel_replicate_degree"] = 1
        par["fsdp_reshard_after_forward"] = _reshard_policy(plan)
    if not m.is_moe:  # its degree means nothing without experts
        del par["expert_tensor_parallel_degree"]
    if plan.ep > 1:
        par["expert_parallel_comm_backend"] = _EP_BACKEND[plan.dispatcher]
    par["enable_async_tensor_parallel"] = "tp" in hidden(plan)
    par["pipeline_parallel_schedule"] = _SCHEDULE[plan.schedule]
    if plan.pp > 1:
        first, last, per_stage = _stage_split(m.num_blocks, plan.pp * plan.v)
        par.update(pipeline_parallel_layers_per_stage=per_stage, pipeline_parallel_first_stage_less_layers=first,
                   pipeline_parallel_last_stage_less_layers=last, pipeline_parallel_microbatch_size=plan.mbs)
    par["context_parallel_rotate_method"] = _ROTATE[plan.cp_comm]
    config["activation_checkpoint"] = _checkpointing(plan, spec)
    config["compile"] = {"enable": TORCHTITAN.compiled(plan, spec), "components": ["model", "loss"]}
    recipe = spec_recipe(spec)
    skipped = ["output", *kept_fqns(spec)]
    if recipe == "current":
        config["model"]["converters"] = ["quantize.linear.float8"]
        config["quantize.linear.float8"] = {"filter_fqns": skipped, "enable_fsdp_float8_all_gather": plan.zero >= 2,
                                            "precompute_float8_dynamic_scale_for_fsdp": plan.zero >= 2}
    elif recipe == "rowwise":  # Float8LinearConverter refuses a recipe_name beside FSDP float8 all-gathers
        config["model"]["converters"] = ["quantize.linear.float8"]
        config["quantize.linear.float8"] = {"filter_fqns": skipped, "recipe_name": _RECIPE_NAMES[recipe]}
    elif recipe == "mxfp8":
        config["model"]["converters"] = ["quantize.linear.mx"]
        config["quantize.linear.mx"] = {"recipe_name": _RECIPE_NAMES[recipe], "filter_fqns": skipped}
    return config


def kept_fqns(spec: "WorkloadSpec") -> list[str]:
    """The converters' filter_fqns that keep the spec's first and last layers in BF16 (`predictor.costs.bf16_layers`): a
    module is skipped when a filter is a substring of its name (torchtitan/components/quantization/utils.py
    `module_filter_fn`), and `layers.<i>.` names block i's linears alone."""
    t = spec.training
    return [f"layers.{i}." for i in bf16_layer_indices(t.bf16_first_layers, t.bf16_last_layers, spec.model.num_blocks)]


# The float8 recipes torchtitan runs through torchao's converters, by the spec's recipe name: dynamic tensorwise
# scaling (`[quantize.linear.float8]`, torchao.float8: TE's current scaling) and MXFP8 (`[quantize.linear.mx]`,
# recipe mxfp8_cublas: torchao.prototype.mx_formats); torchao has no delayed or 128-block scaling recipe in them.
CONVERTERS = {"current": "quantize.linear.float8", "rowwise": "quantize.linear.float8", "mxfp8": "quantize.linear.mx"}
# The converter's recipe_name of each (tensorwise float8 names none).
_RECIPE_NAMES = {"rowwise": "rowwise", "mxfp8": "mxfp8_cublas"}




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


def _write(plan: Plan, target: LaunchTarget) -> dict[str, str]:
    """`torchtitan.toml` for torchtitan 0.2.2's `--job.config_file`, its torchrun line and any flavor to register as
    comments (the loader reads tables only)."""
    spec = target.spec
    m, c = spec.model, spec.cluster
    config = torchtitan_config(plan, spec)
    header = [f"torchtitan job config for plan {plan}",
              f"torchrun --nnodes {c.nodes} --nproc-per-node {c.gpus_per_node} -m torchtitan.train "
              f"--job.config_file {TOML_FILE}"]
    if config["model"]["flavor"] == UNREGISTERED:
        name = config["model"]["name"]
        dims = (f"hidden={m.hidden}, layers={m.num_blocks}, heads={m.heads}, kv_heads={m.kv_heads or m.heads}, "
                f"ffn_hidden={m.ffn_hidden_size}, vocab={m.vocab}")
        if m.is_moe:
            dims += f", experts={m.experts}, top_k={m.top_k}, expert_ffn_hidden={m.expert_ffn_size}"
        header += [f"model.flavor {UNREGISTERED!r}: none of torchtitan's {name} flavors has these dimensions; register "
                   f"it in torchtitan/models/{name}/__init__.py (the model's flavor configs) with {dims}"]
    return {TOML_FILE: _toml(config, header)}


def _model_errors(spec: "WorkloadSpec") -> list[str]:
    """A family torchtitan has no model of (`torchtitan/models`): it ships Llama 3, Llama 4, Qwen3, DeepSeek-V3 and
    GPT-OSS, no Gemma."""
    return [f"torchtitan ships no {spec.model.family} model (torchtitan/models)"] if model_name(spec) is None else []


def _read(text: str, spec: "WorkloadSpec") -> Plan:
    """The plan a `torchtitan.toml` runs under torchtitan 0.2.2 (the keys `_write` writes)."""
    config = tomllib.loads(text)
    par = config["parallelism"]
    degrees = read_degrees(lambda key: par.get(key.rsplit(".", 1)[1], 1), AXIS_FLAGS, spec)
    fsdp = degrees["dp"] > 1 or degrees["cp"] > 1  # the dp key is the shard degree
    degrees["dp"] *= par["data_parallel_replicate_degree"]
    pp = degrees["pp"]
    zero = _reshard_zero(par["fsdp_reshard_after_forward"], pp) if fsdp else 0
    schedule = inverse(_SCHEDULE)[par["pipeline_parallel_schedule"]]
    v = 1
    if pp > 1:
        stages = math.ceil((spec.model.num_blocks + par["pipeline_parallel_first_stage_less_layers"]
                            + par["pipeline_parallel_last_stage_less_layers"]) / par["pipeline_parallel_layers_per_stage"])
        v = stages // pp
    mbs = par["pipeline_parallel_microbatch_size"] if pp > 1 else config["training"]["local_batch_size"]
    compiled = config.get("compile", {}).get("enable", False)
    # FSDP2 / DDP and pipelining always overlap (pipelining only where there are stages); async TP is the one switch.
    kinds = {"dp", *(["pp"] if pp > 1 else []), *(["param"] if zero >= 2 else []),
             *(["tp"] if par["enable_async_tensor_parallel"] else [])}
    recompute, recompute_layers = _recompute(config["activation_checkpoint"], spec.model.num_blocks // (pp * v))
    plan = Plan(**degrees, mbs=mbs, zero=zero, recompute=recompute, recompute_layers=recompute_layers,
                sp=degrees["tp"] > 1, schedule=schedule, v=v, placement="tp-cp-dp-pp",
                overlap=overlap_value(kinds), cp_comm=inverse(_ROTATE)[par["context_parallel_rotate_method"]],
                dispatcher=inverse(_EP_BACKEND)[par.get("expert_parallel_comm_backend", "standard")]
                if degrees["ep"] > 1 else "alltoall")
    converters = config["model"].get("converters", [])
    if converters != [CONVERTERS[r] for r in (spec_recipe(spec),) if r in CONVERTERS]:
        raise LaunchError(f"{TOML_FILE} converts its linears with {converters or 'nothing'}, which is not the "
                          f"spec's precision {spec.training.precision} and training.recipe: set them to what the file "
                          f"runs ({', '.join(f'{k} for {v}' for k, v in CONVERTERS.items())}; bf16 for none)")
    section: Any = config
    for key in (converters[0].split(".") if converters else []):  # TOML nests [quantize.linear.float8]
        section = section.get(key, {})
    if converters and section.get("recipe_name") != _RECIPE_NAMES.get(spec_recipe(spec) or ""):
        raise LaunchError(f"{TOML_FILE} runs float8 recipe_name {section.get('recipe_name')!r}, not the spec's "
                          f"training.recipe {spec_recipe(spec)!r}: set training.recipe to what the file runs")
    if converters and sorted(section.get("filter_fqns", [])) != sorted(["output", *kept_fqns(spec)]):
        raise LaunchError(f"{TOML_FILE} leaves {section.get('filter_fqns')} out of {converters[0]}, not the output "
                          f"layer and the spec's BF16 layers (training.bf16_first_layers/bf16_last_layers): write "
                          f"the file again from this spec")
    if compiled != TORCHTITAN.compiled(plan, spec):
        raise LaunchError(f"{TOML_FILE} sets [compile] enable = {str(compiled).lower()}, but the spec predicts it "
                          f"{'compiled' if not compiled else 'eager'}: set training.compile: "
                          f"{str(compiled).lower()} in the spec to predict the run this file launches")
    return plan


# PyTorch's SDPA flash backend (FlashAttention-2's kernels, built into PyTorch); its job config has no switch for the
# other kernel settings.
KERNELS = KernelChoices(Kernels(attention="flash"), allowed={
    "attention": (("flash",), "runs PyTorch's scaled_dot_product_attention (flash): its config has no attention switch"),
    "cuda_graphs": ((False,), "captures no CUDA graphs"),
    "cuda_graph_scope": (("layer",), "captures no CUDA graphs"),
    "transformer_engine": ((False,), "builds its models from PyTorch modules, not Transformer Engine's"),
    "fused_softmax": ((True,), "has no unfused softmax (its attention is fused)"),
    "fused_bias_gelu": ((True,), "has no bias-GeLU fusion switch"),
    "fused_grad_accum": ((True,), "accumulates gradients in FSDP2's and DDP's own buffers: it has no such switch"),
    "moe_permute_fusion": ((False,), "permutes MoE tokens with PyTorch operators (torchtitan/models/moe: argsort, "
                                     "gather and scatter-add): its config has no fused-permutation switch"),
    "moe_router_fusion": ((False,), "routes with PyTorch operators (softmax or sigmoid, topk): its config has no "
                                    "fused-router switch")})

TORCHTITAN = Framework(NAME, "torchtitan", _rules, _default_overlap, frozenset(OVERLAP_KINDS) - {"ep", "wgrad"},
                       attention_kernel="fused: PyTorch scaled_dot_product_attention (flash)",
                       precisions=("fp32", "bf16", "fp8"), memory=MEMORY, space=SPACE, axes=AXIS_FLAGS,
                       constants=recorded_constants(NAME), launch=Launch(TOML_FILE, _write, _read, _model_errors),
                       never={"zero": (1,), "orders": other_orders(ORDERS), "dispatcher": ("allgather", "hybridep")},
                       never_why={"dispatcher": "exchanges expert tokens by all-to-all or DeepEP only "
                                                "(parallelism.expert_parallel_comm_backend standard or deepep)"},
                       kernels=KERNELS,
                       versions=VERSIONS, compiles_by_default=_compiles, recomputes_some_layers=True,
                       exposed_shares={"tp_comm": _async_tp_exposed})
