"""torchtitan (pytorch/torchtitan), as its job config and parallelisation code run it.

Plans it runs: `torchtitan/config/job_config.py` (`Parallelism`), `distributed/parallel_dims.py` (`fsdp_enabled =
dp_shard_enabled or cp_enabled`: FSDP2 whenever cp > 1), `models/llama3/infra/parallelize.py`
(`fsdp_reshard_after_forward` never = ZeRO-2, always = ZeRO-3, default = never with a pipeline; DDP replicate = ZeRO-0;
no ZeRO-1), TP always with sequence-parallel norms, async TP (`enable_async_tensor_parallel`, off by default),
`distributed/pipeline_parallel.py` (`torch.distributed.pipelining` GPipe, 1F1B, Interleaved1F1B; a multi-stage
schedule needs >= 2 stages per rank), CP, float8 (torchao); mesh order pp-dp-cp-tp (tp innermost). FSDP2 prefetches
all-gathers and overlaps reduce-scatters, DDP overlaps its bucketed all-reduce, neither can be switched off; SDPA
flash attention.

Launch file: `torchtitan.toml` for `torchtitan.train --job.config_file` (`train_configs/*.toml`; float8 in
`[quantize.linear.float8]`, the section of the TOML-configured releases since it replaced `[float8]`).
"""

from __future__ import annotations

import json
import tomllib
from typing import TYPE_CHECKING, Any

from predictor.frameworks.base import (Framework, Launch, hidden, inverse, other_orders, overlap_value, read_degrees,
                                       recorded_constants)
from predictor.memory.facts import MIB, MemoryFacts
from predictor.plan import AXES, AXIS, OVERLAP_KINDS, Plan, overlap_kinds

if TYPE_CHECKING:  # pragma: no cover
    from predictor.workload import WorkloadSpec

NAME = "torchtitan"
ORDERS: tuple[tuple[str, ...], ...] = (("tp", "cp", "dp", "pp"),)


def _rules(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    errors = []
    if plan.zero == 1:
        errors.append("has no ZeRO-1 (it runs DDP replicate = zero=0, FSDP2 without resharding = zero=2, "
                      "FSDP2 = zero=3)")
    if plan.zero == 0 and plan.cp > 1:
        errors.append(f"shards with FSDP2 over the context-parallel ranks whenever cp > 1, so zero=0 (DDP) "
                      f"cannot run with cp={plan.cp} (use zero=2 or 3)")
    if plan.tp > 1 and not plan.sp:
        errors.append("always runs tensor parallelism with sequence-parallel norms (use sp=true)")
    if plan.schedule == "interleaved" and plan.v == 1:
        errors.append("needs at least 2 stages per rank for Interleaved1F1B (use v >= 2 or schedule=1f1b)")
    if plan.rank_order not in ORDERS:
        errors.append(f"orders ranks tp-cp-dp-pp only (its mesh is pp, dp, cp, tp), not {'-'.join(plan.rank_order)}")
    wanted = overlap_kinds(plan.overlap)
    if wanted is None:
        return errors
    always = {"dp"} if plan.dp * plan.cp > 1 else set()
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
                     unsharded_params_under_pp=True, unsharded_grads_under_pp=True, saved="torchtitan",
                     swiglu_saved=4.0, loss_saved_bytes=4.0, loss_peak_bytes=10.0,
                     grad_bucket_bytes=0.0, prefetch_params=0.0, workspace_bytes=32 * MIB)

TOML_FILE = "torchtitan.toml"
# Its MoE model per family (its `model.name`; Mixtral's architecture is its llama4 MoE).
_MODEL = {"deepseek_v3": "deepseek_v3", "qwen3_moe": "qwen3", "gpt_oss": "gpt_oss", "mixtral": "llama4"}
# torch.distributed.pipelining schedule names; PyTorch's context parallel rotates K/V shards round a ring
# with all-to-all, or all-gathers them.
_SCHEDULE = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}
_ROTATE = {"ring": "alltoall", "allgather": "allgather"}
_RESHARD = {2: "never", 3: "always"}


def _put(config: dict[str, dict[str, Any]], dotted: str, value: Any) -> None:
    table, key = dotted.rsplit(".", 1)
    config.setdefault(table, {})[key] = value


def torchtitan_config(plan: Plan, spec: "WorkloadSpec") -> dict[str, dict[str, Any]]:
    """torchtitan's job config for a plan from `as_run`, by TOML table.

    zero=0 replicates over dp (DDP), zero=2/3 shards over dp·cp with FSDP2 (reshard never/always); stages
    are pp·v chunks of equal layers (no lighter first or last stage); float8 uses tensorwise scaling with
    float8 all-gathers under FSDP2, and torch.compile, which float8 and async TP need to pay off.
    """
    m, t = spec.model, spec.training
    config: dict[str, dict[str, Any]] = {"model": {"name": _MODEL.get(m.family, "llama3")}}
    # Under a pipeline the local batch is split into micro-batches; without one, micro-batches accumulate.
    config["training"] = {"local_batch_size": plan.mbs * (plan.microbatches(t.global_batch) if plan.pp > 1 else 1),
                          "global_batch_size": t.global_batch, "seq_len": m.tokens,
                          "mixed_precision_param": "float32" if t.precision == "fp32" else "bfloat16"}
    for axis in AXES:
        if NAME in axis.launch:
            _put(config, axis.launch[NAME], axis.degree(plan))
    par = config["parallelism"]
    if plan.zero == 0:
        par["data_parallel_replicate_degree"] = plan.dp
        _put(config, AXIS["dp"].launch[NAME], 1)
    else:
        par["data_parallel_replicate_degree"] = 1
        par["fsdp_reshard_after_forward"] = _RESHARD[plan.zero]
    par["enable_async_tensor_parallel"] = "tp" in hidden(plan)
    par["pipeline_parallel_schedule"] = _SCHEDULE[plan.schedule]
    if plan.pp > 1:
        par.update(pipeline_parallel_layers_per_stage=m.num_blocks // (plan.pp * plan.v),
                   pipeline_parallel_first_stage_less_layers=0, pipeline_parallel_last_stage_less_layers=0,
                   pipeline_parallel_microbatch_size=plan.mbs)
    par["context_parallel_rotate_method"] = _ROTATE[plan.cp_comm]
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


def _write(plan: Plan, spec: "WorkloadSpec") -> dict[str, str]:
    m, c = spec.model, spec.cluster
    header = [f"torchtitan job config for plan {plan}",
              f"torchrun --nnodes {c.nodes} --nproc-per-node {c.gpus_per_node} -m torchtitan.train "
              f"--job.config_file {TOML_FILE}",
              f"model.flavor: register one with hidden={m.hidden}, layers={m.num_blocks}, heads={m.heads}, "
              f"kv_heads={m.kv_heads or m.heads}, ffn_hidden={m.ffn_hidden_size}, vocab={m.vocab}"]
    return {TOML_FILE: _toml(torchtitan_config(plan, spec), header)}


def _read(text: str, spec: "WorkloadSpec") -> Plan:
    config = tomllib.loads(text)
    par = config["parallelism"]
    degrees = read_degrees(lambda key: par.get(key.rsplit(".", 1)[1], 1), NAME, spec)
    fsdp = degrees["dp"] > 1 or degrees["cp"] > 1  # the dp key is the shard degree
    degrees["dp"] *= par["data_parallel_replicate_degree"]
    zero = inverse(_RESHARD)[par["fsdp_reshard_after_forward"]] if fsdp else 0
    pp = degrees["pp"]
    schedule = inverse(_SCHEDULE)[par["pipeline_parallel_schedule"]]
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
                overlap=overlap_value(kinds), cp_comm=inverse(_ROTATE)[par["context_parallel_rotate_method"]])


TORCHTITAN = Framework(NAME, "torchtitan", _rules, _default_overlap, frozenset(OVERLAP_KINDS) - {"ep"},
                       fused_attention=True, precisions=("fp32", "bf16", "fp8"), memory=MEMORY,
                       constants=recorded_constants(NAME), launch=Launch(TOML_FILE, _write, _read),
                       never={"zero": (1,), "orders": other_orders(ORDERS)})
