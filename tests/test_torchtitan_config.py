"""Every setting the torchtitan launch writes is a field of torchtitan 0.2.2's JobConfig, of the field's type and one of
its allowed values, and passes the checks torchtitan's code makes of it. torchtitan 0.2.2 (PyPI,
torchtitan-0.2.2-py3-none-any.whl, sha256 c95ccaaa89238085) is the last release with the `--job.config_file` TOML
loader (torchtitan/config/manager.py's ConfigManager); that loader refuses unknown keys but takes any value of any
type, which fail later, in training. The tables below are read from that release's code: the fields from
torchtitan/config/job_config.py (sha256 ec406e3f69b9dad3), the models from models/__init__.py (`_supported_models`),
their flavors from models/<name>/__init__.py, the converters from components/quantization/{float8,mx}.py
(`register_model_converter`). The checks are those of distributed/parallel_dims.py (`_validate`, the efsdp mesh),
train.py (the global batch), distributed/pipeline_parallel.py (micro-batches), models/*/infra/parallelize.py (seq_len
divisor, DDP only as the sole parallelism), distributed/activation_checkpoint.py (selective_ac_option),
distributed/tensor_parallel.py (async TP needs compile) and components/quantization/float8.py (a recipe refuses FSDP
float8 all-gathers); torch's own `get_schedule_class` resolves the pipeline schedule. `make setup`
installs torchtitan 0.2.2 without its dependencies (tyro is a test extra), and its ConfigManager loads each file too
(tests/framework_checks.py imports it without torchtitan's package init, which only loads Triton GPU kernels)."""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Iterator
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

from predictor.frameworks import as_run
from predictor.frameworks.launch import launch_files, read_back, run_errors
from predictor.frameworks.torchtitan import FLAVORS, TOML_FILE, UNREGISTERED
from predictor.plan import Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import WorkloadSpec, parse_spec

MODELS = ("deepseek_v3", "flux", "gpt_oss", "llama3", "llama3_ft", "llama4", "qwen3")
SHIPPED_FLAVORS = {
    "llama3": {"debugmodel", "debugmodel_flex_attn", "debugmodel_varlen_attn", "8B", "8B_flex", "8B_varlen", "70B",
               "405B"},
    "deepseek_v3": {"debugmodel", "debugmodel_flex_attn", "16B", "236B", "671B"},
    "qwen3": {"debugmodel", "0.6B", "1.7B", "4B", "8B", "14B", "32B", "debugmodel_moe", "30B-A3B", "235B-A22B"},
    "llama4": {"debugmodel", "17bx16e", "17bx128e", "debugmodel_irope", "17bx16e_irope", "17bx128e_irope"},
    "gpt_oss": {"debugmodel", "20b", "120b"},
}
CONVERTERS = ("quantize.linear.float8", "quantize.grouped_mm.float8", "quantize.linear.mx", "quantize.grouped_mm.mx")
# {section: {field: kind}}: a type (int, bool, str: that type exactly), a tuple (a Literal's values, or the names the
# code accepts), or a one-item list (a list of that kind). Only the sections and fields the launch writes.
JOB_CONFIG: dict[str, dict[str, Any]] = {
    "model": {"name": MODELS, "flavor": str, "converters": [CONVERTERS]},
    "training": {"local_batch_size": int, "global_batch_size": int, "seq_len": int,
                 "mixed_precision_param": ("bfloat16", "float32")},
    "parallelism": {
        "data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
        "fsdp_reshard_after_forward": ("default", "always", "never"), "tensor_parallel_degree": int,
        "enable_async_tensor_parallel": bool, "pipeline_parallel_degree": int,
        "pipeline_parallel_first_stage_less_layers": int, "pipeline_parallel_last_stage_less_layers": int,
        "pipeline_parallel_layers_per_stage": int, "pipeline_parallel_schedule": str,
        "pipeline_parallel_microbatch_size": int, "context_parallel_degree": int,
        "context_parallel_rotate_method": ("allgather", "alltoall"), "expert_parallel_degree": int,
        "expert_tensor_parallel_degree": int, "expert_parallel_comm_backend": ("standard", "deepep")},
    "activation_checkpoint": {"mode": ("selective", "full", "memory_budget", "none"), "selective_ac_option": str},
    "compile": {"enable": bool, "components": [("model", "loss")]},
    "quantize.linear.float8": {"enable_fsdp_float8_all_gather": bool, "precompute_float8_dynamic_scale_for_fsdp": bool,
                               "recipe_name": ("tensorwise", "rowwise", "rowwise_with_gw_hp"), "filter_fqns": [str],
                               "emulate": bool},
    "quantize.linear.mx": {"mxfp8_dim1_cast_kernel_choice": ("triton", "cuda", "torch"), "recipe_name": str,
                           "filter_fqns": [str]},
}


def _spec(preset: str, nodes: int, global_batch: int, precision: str = "bf16", **model: object) -> WorkloadSpec:
    return parse_spec({"model": {"preset": preset, **model},
                       "training": {"global_batch": global_batch, "precision": precision, "framework": "torchtitan"},
                       "cluster": {"device": "h100", "nodes": nodes, "gpus_per_node": 8}})


LONG_70B = _spec("llama3-70b", 8, 1024, seq_len=32768)
L8B = _spec("llama3-8b", 1, 64)
L8B_FP8 = _spec("llama3-8b", 1, 64, "fp8")
SEQ_5000 = _spec("llama3-8b", 1, 64, seq_len=5000)  # 5000 = 8 * 625: tp*2*cp = 8 divides it, 16 does not
PLANS = [
    (LONG_70B, "dp=2,tp=8,pp=2,cp=2,mbs=1,zero=3,sp=true,schedule=interleaved,v=4,recompute=full"),
    (LONG_70B, "dp=2,tp=8,pp=2,cp=2,mbs=1,zero=2,sp=true,cp_comm=allgather,recompute=selective"),
    (L8B, "dp=8,mbs=2,zero=3"),  # plain FSDP2
    (L8B, "dp=8,mbs=1,zero=0,recompute=selective"),  # DDP
    (_spec("llama3-8b", 1, 64, "fp32"), "dp=8,mbs=1,zero=2"),
    (L8B_FP8, "dp=2,tp=2,cp=2,mbs=1,zero=3,sp=true,overlap=dp+param+tp"),  # float8 all-gathers, async TP
    (L8B_FP8, "dp=8,mbs=1,zero=0"),
    (_spec("qwen3-30b-a3b", 2, 512), "dp=16,mbs=2,zero=3,ep=8"),
    (_spec("qwen3-30b-a3b", 4, 512), "dp=8,tp=4,mbs=1,zero=3,sp=true,ep=8"),
    (_spec("deepseek-v3", 32, 4096), "dp=32,pp=8,mbs=1,zero=2,schedule=interleaved,v=4,ep=8"),
    (_spec("mixtral-8x7b", 4, 256), "dp=32,mbs=1,zero=3,ep=8"),  # a llama4 flavor to register
    (SEQ_5000, "dp=2,tp=2,cp=2,mbs=1,zero=3,sp=true"),
]
IDS = [f"{s.model.preset}:{s.training.precision}:{p}" for s, p in PLANS]


def _settings(config: dict[str, Any], section: str = "") -> Iterator[tuple[str, str, Any]]:
    """(dotted section, field, value) of every value of a parsed TOML file, nested tables as dotted sections."""
    for key, value in config.items():
        if isinstance(value, dict):
            yield from _settings(value, f"{section}.{key}" if section else key)
        else:
            yield section, key, value


def _fits(value: Any, kind: Any) -> bool:
    if isinstance(kind, list):
        return isinstance(value, list) and all(_fits(item, kind[0]) for item in value)
    if isinstance(kind, tuple):
        return value in kind
    return type(value) is kind  # a bool is no int here, as TOML tells them apart


def _torchtitan_accepts(config: dict[str, Any], plan: Plan, spec: WorkloadSpec) -> None:
    """The checks torchtitan 0.2.2 makes of the values before and while it builds the run (see the module)."""
    par, training = config["parallelism"], config["training"]
    replicate, shard, cp, tp, pp, ep = (par[f"{axis}_degree"] for axis in (
        "data_parallel_replicate", "data_parallel_shard", "context_parallel", "tensor_parallel", "pipeline_parallel",
        "expert_parallel"))
    etp = par.get("expert_tensor_parallel_degree", 1)
    assert min(replicate, shard, cp, tp, pp, ep, etp) >= 1
    assert replicate * shard * cp * tp * pp == spec.cluster.gpus
    if ep > 1:  # etp = tp or 1; the efsdp mesh dp_shard·cp·tp / (etp·ep) is whole ranks
        assert etp in (1, tp) and (shard * cp * tp) % (etp * ep) == 0
    if replicate > 1 and shard == cp == 1:  # DDP: "DDP has not supported > 1D parallelism"
        assert replicate == spec.cluster.gpus
    assert training["seq_len"] % (tp * 2 * cp) == 0  # ParallelDims.seq_len_divisor
    assert training["global_batch_size"] % (training["local_batch_size"] * replicate * shard) == 0
    if pp > 1:
        assert training["local_batch_size"] % par["pipeline_parallel_microbatch_size"] == 0
        single = issubclass(get_schedule_class(par["pipeline_parallel_schedule"]), PipelineScheduleSingle)
        assert single == (plan.v == 1)  # one stage per rank, or >= 2 for a looped schedule (pp*v stages)
    compile_ = config.get("compile", {})
    if par["enable_async_tensor_parallel"]:
        assert compile_.get("enable") and "model" in compile_["components"]
    ac = config["activation_checkpoint"]
    if ac["mode"] == "selective":
        assert ac["selective_ac_option"] == "op" or ac["selective_ac_option"].isdigit()
    float8 = config.get("quantize", {}).get("linear", {}).get("float8")
    assert (float8 is not None) == ("quantize.linear.float8" in config["model"].get("converters", []))
    if float8 is not None and float8.get("recipe_name") is not None:
        assert not float8.get("enable_fsdp_float8_all_gather", False)


@pytest.mark.parametrize("spec, text", PLANS, ids=IDS)
def test_every_written_setting_is_a_job_config_field_torchtitan_accepts(spec: WorkloadSpec, text: str,
                                                                       tmp_path: Path) -> None:
    plan = Plan.parse(text)
    written = launch_files(plan, resolve(spec))[TOML_FILE]
    config = tomllib.loads(written)
    settings = list(_settings(config))
    unknown = [f"{section}.{key}" for section, key, _ in settings if key not in JOB_CONFIG.get(section, {})]
    assert not unknown
    wrong = [(f"{section}.{key}", value) for section, key, value in settings
             if not _fits(value, JOB_CONFIG[section][key])]
    assert not wrong
    _torchtitan_accepts(config, plan, spec)
    model = config["model"]
    assert model["flavor"] in SHIPPED_FLAVORS[model["name"]] or (
        model["flavor"] == UNREGISTERED and f"register it in torchtitan/models/{model['name']}/__init__.py" in written)
    path = tmp_path / TOML_FILE
    path.write_text(written)
    ran = as_run(plan, resolve(spec).framework)
    assert asdict(read_back(path, spec)) == asdict(ran)
    # the reader alone names the overlap the file runs: pipelining's only where there are stages
    assert resolve(spec).framework.launch.read(written, spec).overlap == ran.overlap


@pytest.mark.parametrize("spec, text, divisor", [
    (SEQ_5000, "tp=4,cp=2,mbs=1,zero=3,sp=true", 16),  # 2*cp = 4 divides 5000: only torchtitan's tp factor fails
    (_spec("llama3-8b", 1, 64, seq_len=4095), "dp=8,mbs=1,zero=3", 2),  # tp = cp = 1 still asks for an even one
], ids=["seq5000-tp4-cp2", "seq4095"])
def test_a_seq_len_that_tp_2_cp_does_not_divide_is_refused(spec: WorkloadSpec, text: str, divisor: int) -> None:
    """Every model's parallelize asserts seq_len % (tp * 2 * cp) == 0 (ParallelDims.seq_len_divisor); the structural
    cp rule asks only for 2*cp, so the refusal is torchtitan's alone, naming the field and what divides."""
    (error,) = run_errors(Plan.parse(text), resolve(spec))
    assert error.startswith("torchtitan needs model.seq_len divisible by tp*2*cp = ") and f"= {divisor} " in error
    assert f"seq_len={spec.model.tokens} is not (use a model.seq_len that is a multiple of {divisor}" in error


def test_the_flavors_the_writer_names_are_ones_torchtitan_ships() -> None:
    unshipped = {model: set(flavors) - SHIPPED_FLAVORS[model] for model, flavors in FLAVORS.items()}
    assert not any(unshipped.values()), unshipped


@pytest.fixture(scope="module")
def config_manager() -> Any:
    """torchtitan 0.2's ConfigManager class (`make setup` installs torchtitan 0.2.2); skipped, saying why, where it is
    not installed."""
    from tests.framework_checks import torchtitan_module

    try:
        installed = version("torchtitan")
    except PackageNotFoundError:
        pytest.skip("torchtitan 0.2 is not installed (make setup: pip install --no-deps torchtitan==0.2.2)")
    if not installed.startswith("0.2."):
        pytest.skip(f"torchtitan {installed} has no --job.config_file TOML loader (0.2 has)")
    return torchtitan_module("torchtitan.config.manager").ConfigManager


@pytest.mark.parametrize("spec, text", PLANS, ids=IDS)
def test_torchtitans_loader_reads_each_written_value(config_manager: Any, spec: WorkloadSpec, text: str,
                                                     tmp_path: Path) -> None:
    """ConfigManager loads the file as `torchtitan.train --job.config_file` does; each value lands in its field."""
    path = tmp_path / TOML_FILE
    path.write_text(launch_files(Plan.parse(text), resolve(spec))[TOML_FILE])
    loaded = config_manager().parse_args(["--job.config_file", str(path)])
    for section, key, value in _settings(tomllib.loads(path.read_text())):
        assert getattr(functools.reduce(getattr, section.split("."), loaded), key) == value, f"{section}.{key}"
