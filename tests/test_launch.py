"""Launch files: each framework's file, read back, is the winning plan as the framework runs it; refusals name the field."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import tomllib
from dataclasses import asdict
from pathlib import Path

import pytest

from predictor.frameworks import FRAMEWORKS, LaunchError, as_run
from predictor.frameworks.launch import launch_files, launch_settings, read_back
from predictor.frameworks.megatron import chunk_layers, layout_stages
from predictor.plan import Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import WorkloadSpec, parse_spec


def _spec(framework: str, preset: str, device: str, nodes: int, global_batch: int, precision: str = "bf16") -> WorkloadSpec:
    return parse_spec({"model": {"preset": preset},
                       "training": {"global_batch": global_batch, "precision": precision, "framework": framework},
                       "cluster": {"device": device, "nodes": nodes, "gpus_per_node": 8}})


GPT3 = _spec("megatron", "gpt3-175b", "a100-80gb", 128, 1536)
LLAMA_FP8 = _spec("megatron", "llama3-8b", "h100", 2, 64, "fp8")
TITAN_1 = _spec("torchtitan", "llama3-8b", "h100", 1, 64)
TITAN_2 = _spec("torchtitan", "llama3-8b", "h100", 2, 64)
TITAN_FP8 = _spec("torchtitan", "llama3-8b", "h100", 1, 64, "fp8")
L405 = _spec("megatron", "llama3.1-405b", "h100", 128, 512, "fp8")
DSV3 = _spec("megatron", "deepseek-v3", "gb200", 32, 4096)  # Megatron-Bridge's GB200 DeepSeek-V3 recipe, 256 GPUs
QWEN_TITAN = _spec("torchtitan", "qwen3-30b-a3b", "h100", 2, 512)
DSV3_TITAN = _spec("torchtitan", "deepseek-v3", "h100", 32, 4096)
MIXTRAL_DS = _spec("deepspeed", "mixtral-8x7b", "a100-80gb", 4, 256)
DS = _spec("deepspeed", "gpt3-1.3b", "a100-80gb", 2, 64)
DS_FP16 = _spec("deepspeed", "gpt3-1.3b", "a100-80gb", 2, 64, "fp16")

WINNERS = [
    # The 175B-style interleaved winner, with the distributed optimizer.
    (GPT3, "dp=64,tp=4,pp=4,mbs=2,zero=1,recompute=full,sp=true,schedule=interleaved,v=8"),
    (GPT3, "dp=64,tp=4,pp=4,mbs=2,zero=1,sp=true,placement=tp-pp-dp,overlap=dp"),
    (LLAMA_FP8, "dp=2,tp=4,cp=2,mbs=1,zero=1,recompute=selective,sp=true,cp_comm=allgather"),
    (LLAMA_FP8, "dp=4,tp=2,cp=2,mbs=2,zero=3,sp=true,overlap=dp+param"),
    # Megatron-Bridge's 405B H100 recipe: 126 layers on 64 chunks with the embedding and loss counted as layers.
    (L405, "dp=8,tp=8,pp=8,cp=2,mbs=1,zero=1,sp=true,schedule=interleaved,v=8"),
    (TITAN_1, "dp=8,mbs=2,zero=3,recompute=full"),  # FSDP2
    (TITAN_1, "dp=8,mbs=1,zero=0,recompute=selective"),  # DDP
    (TITAN_2, "dp=4,tp=2,pp=2,mbs=1,zero=2,sp=true,schedule=interleaved,v=4"),
    (TITAN_FP8, "dp=2,tp=2,cp=2,mbs=1,zero=3,sp=true,overlap=dp+param+tp"),
    # Mixtures of experts: ep subdivides the dp ranks (it does not multiply into the GPU count).
    (DSV3, "dp=64,pp=4,mbs=1,zero=1,schedule=interleaved,v=4,ep=64"),
    (DSV3, "dp=32,tp=2,pp=4,mbs=1,zero=1,sp=true,schedule=interleaved,v=4,ep=32,overlap=dp+param+tp+pp"),
    (QWEN_TITAN, "dp=16,mbs=2,zero=3,ep=8"),
    # DeepSeek-V3's 61 layers on 16 and 32 pipeline chunks: uneven splits.
    (DSV3, "dp=16,pp=16,mbs=1,zero=1,ep=16"),
    (DSV3_TITAN, "dp=16,pp=16,mbs=1,zero=2,ep=16"),
    (DSV3_TITAN, "dp=32,pp=8,mbs=1,zero=2,schedule=interleaved,v=4,ep=8"),
    (MIXTRAL_DS, "dp=32,mbs=1,zero=1"),
    (MIXTRAL_DS, "dp=4,tp=8,mbs=1,zero=1,sp=true"),
    (DS, "dp=16,mbs=4,zero=3"),
    (DS, "dp=2,tp=2,pp=4,mbs=2,zero=1,recompute=full,sp=true"),
    (DS_FP16, "dp=8,tp=2,mbs=2,zero=2,recompute=selective,sp=true,overlap=dp"),
]


def _values(args: list[str]) -> dict[str, str]:
    """{flag: its first value} of a command line."""
    return {flag: args[i + 1] for i, flag in enumerate(args[:-1]) if flag.startswith("--") and not args[i + 1].startswith("--")}


def _megatron_accepts_the_pipeline(args: list[str]) -> None:
    """Megatron-LM's pipeline argument rules, read from its code: `validate_args` (megatron/training/arguments.py: at
    most one of --num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank and
    --pipeline-model-parallel-layout; the layout's stages a multiple of pp; without a layout or uneven first/last
    stages, the layers (+1 for each account-for flag) divisible by pp), TransformerConfig.__post_init__ (a layout
    beside no other layout argument; the layers per rank divisible by the virtual stages) and
    PipelineParallelLayerLayout.validate_layer_layout (the embedding first and once, the loss last and once, every
    decoder layer once, MTP layers only in the last stage of a rank)."""
    value = _values(args)
    pp, layers = int(value.get("--pipeline-model-parallel-size", "1")), int(value["--num-layers"])
    layout = value.get("--pipeline-model-parallel-layout")
    assert sum(flag in args for flag in ("--num-layers-per-virtual-pipeline-stage",
                                         "--num-virtual-stages-per-pipeline-rank",
                                         "--pipeline-model-parallel-layout")) <= 1
    accounted = sum(flag in args for flag in ("--account-for-embedding-in-pipeline-split",
                                              "--account-for-loss-in-pipeline-split"))
    if layout is not None:
        assert accounted == 0 and "--decoder-first-pipeline-num-layers" not in args
        stages = layout_stages(layout)
        flat = "".join(stages)
        assert len(stages) % pp == 0 and set(flat) <= set("EtmL")
        assert flat[0] == "E" and flat[-1] == "L" and flat.count("E") == flat.count("L") == 1
        assert flat.count("t") == layers and all("m" not in stage for stage in stages[:-1])
        assert "m" not in flat or "t" not in flat[flat.index("m"):]
        return
    v = int(value.get("--num-virtual-stages-per-pipeline-rank", "1"))
    assert (layers + accounted) % pp == 0 and ((layers + accounted) // pp) % v == 0


def _torchtitan_accepts_the_pipeline(config: dict, spec: WorkloadSpec) -> None:
    """torchtitan's pipeline rules, read from its code (distributed/pipeline_parallel.py: pipeline_llm's stage count
    ceil((layers + first + last) / layers_per_stage), a multiple of pp, one stage per rank for a single-stage
    schedule and at least two for a looped one; generate_llm_fqn_per_model_part's balance check)."""
    par, layers = config["parallelism"], spec.model.num_blocks
    pp = par["pipeline_parallel_degree"]
    if pp == 1:
        return
    weights = par["pipeline_parallel_first_stage_less_layers"] + par["pipeline_parallel_last_stage_less_layers"]
    stages = math.ceil((layers + weights) / par["pipeline_parallel_layers_per_stage"])
    assert stages % pp == 0 and (stages // pp == 1) == (par["pipeline_parallel_schedule"] in ("1F1B", "GPipe"))
    per_stage = (layers + weights) // stages
    assert 0 < per_stage and max(par["pipeline_parallel_first_stage_less_layers"],
                                 par["pipeline_parallel_last_stage_less_layers"]) <= per_stage


def _write(files: dict[str, str], out: Path) -> Path:
    for name, text in files.items():
        (out / name).write_text(text)
    return out / next(name for name in files if name != "torchrun.sh")


@pytest.mark.parametrize("spec, text", WINNERS, ids=[f"{resolve(s).framework.name}:{t}" for s, t in WINNERS])
def test_each_launch_file_reads_back_as_the_winner(spec: WorkloadSpec, text: str, tmp_path: Path) -> None:
    plan = Plan.parse(text)
    framework = resolve(spec).framework
    files = launch_files(plan, resolve(spec))
    back = read_back(_write(files, tmp_path), spec)
    want = as_run(plan, framework)
    if framework.name == "megatron":
        _megatron_accepts_the_pipeline(shlex.split(files["megatron_args.txt"]))
    if framework.name == "torchtitan":
        _torchtitan_accepts_the_pipeline(tomllib.loads(files["torchtitan.toml"]), spec)
    assert asdict(back) == asdict(want)  # every field
    assert back.rank_order == plan.rank_order
    assert framework.overlap(back) <= framework.overlap(plan)  # nothing hidden that the prediction charged


def test_as_run_resolves_auto_overlap_to_the_frameworks_kinds() -> None:
    plan = Plan.parse("dp=64,tp=4,pp=4,mbs=2,zero=1,recompute=full,sp=true,schedule=interleaved,v=8")
    assert as_run(plan, FRAMEWORKS["megatron"]).overlap == "tp+dp+param+pp"
    assert as_run(plan.with_(tp=1, sp=False, dp=256), FRAMEWORKS["megatron"]).overlap == "dp+param+pp"
    assert as_run(Plan(dp=16, mbs=4, zero=3), FRAMEWORKS["deepspeed"]).overlap == "dp+param"
    assert as_run(Plan(dp=16, mbs=4, zero=1), FRAMEWORKS["deepspeed"]).overlap == "none"


def test_megatron_file_expresses_zero_cp_fp8_and_the_schedule(tmp_path: Path) -> None:
    files = launch_files(Plan.parse("dp=2,tp=4,cp=2,mbs=1,zero=1,recompute=selective,sp=true,cp_comm=allgather"),
                         resolve(LLAMA_FP8))
    args = shlex.split(files["megatron_args.txt"])
    joined = " ".join(args)
    for expected in ("--context-parallel-size 2", "--cp-comm-type all_gather", "--use-distributed-optimizer",
                     "--fp8-format hybrid --fp8-recipe tensorwise", "--recompute-granularity selective",
                     "--group-query-attention --num-query-groups 8", "--bf16"):
        assert expected in joined
    assert "--recompute-method" not in args  # Megatron refuses a method with selective recompute
    fsdp = shlex.split(launch_files(Plan.parse("dp=4,tp=2,cp=2,mbs=2,zero=3,sp=true"), resolve(LLAMA_FP8))["megatron_args.txt"])
    assert " ".join(fsdp).count("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params") == 1
    assert "--ckpt-format fsdp_dtensor" in " ".join(fsdp)
    gpt3 = launch_files(Plan.parse("dp=64,tp=4,pp=4,mbs=2,zero=1,recompute=full,sp=true,schedule=interleaved,v=8,"
                                   "overlap=dp+param+tp"), resolve(GPT3))
    gpt3_args = " ".join(shlex.split(gpt3["megatron_args.txt"]))
    assert "--num-virtual-stages-per-pipeline-rank 8" in gpt3_args and "--no-overlap-p2p-communication" in gpt3_args
    script = gpt3["torchrun.sh"]
    assert script.startswith("#!/bin/sh") and "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script
    assert "torchrun --nnodes 128 --nproc-per-node 8" in script and "megatron_args.txt" in script


def test_torchtitan_file_uses_its_real_keys() -> None:
    config = tomllib.loads(launch_files(Plan.parse("dp=2,tp=2,cp=2,mbs=1,zero=3,sp=true,overlap=dp+param+tp"),
                                        resolve(TITAN_FP8))["torchtitan.toml"])
    par = config["parallelism"]
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (2, 1)
    # zero=3 without a pipeline is torchtitan's default policy (every unit but [norm, output] resharded)
    assert par["fsdp_reshard_after_forward"] == "default" and par["enable_async_tensor_parallel"] is True
    assert config["model"]["converters"] == ["quantize.linear.float8"]
    assert config["quantize"]["linear"]["float8"]["enable_fsdp_float8_all_gather"] is True
    assert config["compile"]["enable"] is True
    ddp = tomllib.loads(launch_files(Plan(dp=8, mbs=1), resolve(TITAN_1))["torchtitan.toml"])
    assert (ddp["parallelism"]["data_parallel_replicate_degree"], ddp["parallelism"]["data_parallel_shard_degree"]) == (8, 1)
    assert ddp["activation_checkpoint"]["mode"] == "none"  # torchtitan's default is selective: always written
    assert ddp["training"]["local_batch_size"] == 1 and ddp["training"]["global_batch_size"] == 64


def test_deepspeed_config_carries_the_megatron_deepspeed_arguments() -> None:
    config = json.loads(launch_files(Plan.parse("dp=2,tp=2,pp=4,mbs=2,zero=1,recompute=full,sp=true"), resolve(DS))
                        ["deepspeed_config.json"])
    assert config["zero_optimization"] == {"stage": 1, "overlap_comm": False}
    assert config["gradient_accumulation_steps"] == 16 and config["train_micro_batch_size_per_gpu"] == 2
    args = " ".join(config["megatron_deepspeed_args"])
    assert "--pipeline-model-parallel-size 4" in args and "--zero-stage 1" in args and "--sequence-parallel" in args
    assert "--no-pipeline-parallel" not in args and "--deepspeed-activation-checkpointing" in args
    dp_only = json.loads(launch_files(Plan(dp=16, mbs=4, zero=3), resolve(DS))["deepspeed_config.json"])
    assert dp_only["zero_optimization"] == {"stage": 3, "overlap_comm": True}
    assert "--no-pipeline-parallel" in dp_only["megatron_deepspeed_args"]


@pytest.mark.parametrize("spec, text, field", [
    (DS, "dp=2,tp=2,pp=4,mbs=2,zero=2", "zero=2"),  # DeepSpeed's pipeline engine: ZeRO 0/1 only
    (GPT3, "dp=64,tp=4,pp=4,mbs=2,zero=2,recompute=full,sp=true,schedule=interleaved,v=8", "zero=2"),  # no FSDP+PP
    (GPT3, "dp=64,tp=4,pp=4,mbs=2,zero=1,sp=true,schedule=gpipe", "GPipe"),
    (GPT3, "dp=64,tp=4,pp=4,mbs=2,zero=1,schedule=interleaved,v=8,overlap=dp+param+tp", "--tp-comm-overlap"),
    (LLAMA_FP8, "dp=4,tp=2,cp=2,mbs=2,zero=3,sp=true,overlap=none", "overlap must include dp+param"),
    (TITAN_1, "dp=8,mbs=1,zero=1", "ZeRO-1"),
    (TITAN_2, "dp=8,cp=2,mbs=1,zero=0", "zero=0"),
    (TITAN_2, "dp=8,tp=2,mbs=1,zero=0,sp=true", "cannot run with tp=2"),  # DDP only alone
    (QWEN_TITAN, "dp=16,mbs=2,zero=0,ep=8", "cannot run with ep=8"),
    (TITAN_1, "dp=8,mbs=1,zero=3,overlap=dp", "overlap must include param"),  # FSDP2 always prefetches
    (DS, "dp=16,mbs=4,zero=3,overlap=dp", "overlap must include both dp and param"),
    (_spec("deepspeed", "llama3-8b", "h100", 1, 64, "fp8"), "dp=8,mbs=1,zero=1", "fp8"),
    (_spec("pytorch", "gpt3-1.3b", "a100-80gb", 1, 64), "dp=8,mbs=1", "no launch file"),
])
def test_refusals_name_the_field(spec: WorkloadSpec, text: str, field: str) -> None:
    with pytest.raises(LaunchError, match=field.replace("+", r"\+")):
        launch_files(Plan.parse(text), resolve(spec))
    settings = launch_settings(Plan.parse(text), resolve(spec))  # the report states the refusal instead of files
    assert settings["files"] == {} and field in settings["notes"][0]


def test_an_uneven_layer_split_counts_the_embedding_and_the_loss():
    args = launch_files(Plan.parse("dp=8,tp=8,pp=8,cp=2,mbs=1,zero=1,sp=true,schedule=interleaved,v=8"), resolve(L405))
    text = args["megatron_args.txt"]
    assert "--account-for-embedding-in-pipeline-split" in text and "--account-for-loss-in-pipeline-split" in text
    even = launch_files(Plan.parse("dp=64,tp=4,pp=4,mbs=2,zero=1,sp=true,schedule=interleaved,v=8"), resolve(GPT3))
    assert "--account-for-embedding-in-pipeline-split" not in even["megatron_args.txt"]


def test_megatron_file_expresses_experts_and_their_parallelism() -> None:
    args = shlex.split(launch_files(Plan.parse("dp=64,pp=4,mbs=1,zero=1,schedule=interleaved,v=4,ep=64"), resolve(DSV3))
                       ["megatron_args.txt"])
    value = {flag: args[i + 1] for i, flag in enumerate(args[:-1]) if flag.startswith("--")}
    assert value["--expert-model-parallel-size"] == "64" and value["--num-experts"] == "256"
    assert value["--moe-router-topk"] == "8" and value["--moe-ffn-hidden-size"] == "2048"
    assert value["--moe-layer-freq"] == "([0]*3+[1]*58)" and value["--q-lora-rank"] == "1536"
    assert "--overlap-moe-expert-parallel-comm" in args and "--multi-latent-attention" in args
    titan = tomllib.loads(launch_files(Plan.parse("dp=16,mbs=2,zero=3,ep=8"), resolve(QWEN_TITAN))["torchtitan.toml"])
    assert titan["parallelism"]["expert_parallel_degree"] == 8 and titan["model"]["name"] == "qwen3"


def test_an_uneven_megatron_pipeline_is_a_layout() -> None:
    """DeepSeek-V3's 61 layers on 16 chunks: Megatron-LM refuses them without a layout; the layout spreads them as
    evenly as whole layers allow, the embedding's and the loss's chunks lighter, and sets the virtual stages."""
    for text, chunks in (("dp=16,pp=16,mbs=1,zero=1,ep=16", 16),
                         ("dp=64,pp=4,mbs=1,zero=1,schedule=interleaved,v=4,ep=64", 16),
                         ("dp=32,pp=8,mbs=1,zero=1,schedule=interleaved,v=4,ep=8", 32)):
        args = shlex.split(launch_files(Plan.parse(text), resolve(DSV3))["megatron_args.txt"])
        stages = layout_stages(_values(args)["--pipeline-model-parallel-layout"])
        assert [stage.count("t") for stage in stages] == chunk_layers(61, chunks)
        assert "--num-virtual-stages-per-pipeline-rank" not in args
    assert _values(args)["--pipeline-model-parallel-layout"] == "Et|(tt|)*29t|tL"
    mtp = parse_spec({"model": {"preset": "deepseek-v3", "mtp_layers": 1},
                      "training": {"global_batch": 4096, "framework": "megatron"},
                      "cluster": {"device": "gb200", "nodes": 32, "gpus_per_node": 8}})
    args = shlex.split(launch_files(Plan.parse("dp=16,pp=16,mbs=1,zero=1,ep=16"), resolve(mtp))["megatron_args.txt"])
    _megatron_accepts_the_pipeline(args)  # the MTP layer in the last chunk, before the loss
    assert _values(args)["--pipeline-model-parallel-layout"].endswith("|tttmL")
    assert chunk_layers(61, 16) == [3] + [4] * 13 + [3, 3] and chunk_layers(7, 3) == [2, 3, 2]
    even = shlex.split(launch_files(Plan.parse("dp=64,tp=4,pp=4,mbs=2,zero=1,sp=true,schedule=interleaved,v=8"),
                                    resolve(GPT3))["megatron_args.txt"])
    assert "--pipeline-model-parallel-layout" not in even  # 96 layers on 32 chunks: even


def test_torchrun_script_passes_each_argument_whole(tmp_path: Path) -> None:
    """The arguments file quotes what the shell would split or glob (a layout's |, *, parentheses): the script hands
    torchrun every argument whole (a stand-in torchrun prints what it gets)."""
    plan = Plan.parse("dp=16,pp=16,mbs=1,zero=1,ep=16")
    files = launch_files(plan, resolve(DSV3))
    _write(files, tmp_path)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "torchrun").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (tmp_path / "bin" / "torchrun").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "NODE_RANK": "0", "MASTER_ADDR": "h"}
    out = subprocess.run(["sh", str(tmp_path / "torchrun.sh")], env=env, capture_output=True, text=True, check=True)
    got = out.stdout.splitlines()
    assert got[got.index("pretrain_gpt.py") + 1:] == shlex.split(files["megatron_args.txt"])
    assert "([0]*3+[1]*58)" in got


def test_deepspeed_launch_trains_the_experts() -> None:
    """Mixtral under Megatron-DeepSpeed: its experts in every layer with top-2 gating (without --num-experts it would
    train a dense model); a mixture it cannot build is refused, naming what."""
    config = json.loads(launch_files(Plan.parse("dp=32,mbs=1,zero=1"), resolve(MIXTRAL_DS))["deepspeed_config.json"])
    value = _values(config["megatron_deepspeed_args"])
    assert (value["--num-experts"], value["--topk"], value["--expert-interval"]) == ("8", "2", "1")
    assert "--create-moe-param-group" in config["megatron_deepspeed_args"]
    dsv3 = _spec("deepspeed", "deepseek-v3", "a100-80gb", 32, 4096)
    notes = launch_settings(Plan.parse("dp=32,tp=8,mbs=1,zero=1,sp=true"), resolve(dsv3))["notes"]
    assert "shared experts" in notes[0] and "multi-latent attention" in notes[0] and "sigmoid router" in notes[0]
    dense = json.loads(launch_files(Plan(dp=16, mbs=4, zero=3), resolve(DS))["deepspeed_config.json"])
    assert "--num-experts" not in dense["megatron_deepspeed_args"]


def test_torchtitan_names_its_shipped_flavor_or_how_to_register_one() -> None:
    for preset, flavor in (("llama3-8b", "8B"), ("llama3-70b", "70B"), ("llama3.1-405b", "405B"),
                           ("deepseek-v3", "671B"), ("qwen3-30b-a3b", "30B-A3B"), ("qwen3-8b", "8B"),
                           ("qwen3-32b", "32B")):
        spec = _spec("torchtitan", preset, "h100", 16, 1024)
        text = launch_files(Plan(dp=128, mbs=1, zero=3), resolve(spec))["torchtitan.toml"]
        assert tomllib.loads(text)["model"]["flavor"] == flavor and "register" not in text
        assert tomllib.loads(text)["model"]["name"] == ("qwen3" if preset.startswith("qwen3") else
                                                        "deepseek_v3" if preset == "deepseek-v3" else "llama3")
    mixtral = _spec("torchtitan", "mixtral-8x7b", "h100", 4, 256)
    text = launch_files(Plan.parse("dp=32,mbs=1,zero=3,ep=8"), resolve(mixtral))["torchtitan.toml"]
    config = tomllib.loads(text)
    assert config["model"] == {"name": "llama4", "flavor": "scaledl"}
    assert "register it in torchtitan/models/llama4/__init__.py" in text and "experts=8, top_k=2" in text
    assert config["parallelism"]["expert_parallel_degree"] == 8
    assert config["parallelism"]["expert_tensor_parallel_degree"] == 1  # the routed experts priced without tp
    assert "expert_tensor_parallel_degree" not in tomllib.loads(launch_files(Plan(dp=8, mbs=1), resolve(TITAN_1))
                                                                ["torchtitan.toml"])["parallelism"]


def test_torchtitan_cuts_uneven_pipelines_with_its_stage_weights() -> None:
    """61 layers on 32 stages: one layer per stage and the embedding's and output's stages one lighter
    (ceil((61 + 1 + 1) / 2) = 32 stages); a cut its balance check refuses is a launch refusal that says why."""
    config = tomllib.loads(launch_files(Plan.parse("dp=32,pp=8,mbs=1,zero=2,schedule=interleaved,v=4,ep=8"),
                                        resolve(DSV3_TITAN))["torchtitan.toml"])["parallelism"]
    assert (config["pipeline_parallel_layers_per_stage"], config["pipeline_parallel_first_stage_less_layers"],
            config["pipeline_parallel_last_stage_less_layers"]) == (2, 1, 1)
    refused = launch_settings(Plan.parse("dp=16,pp=16,mbs=1,zero=2,schedule=interleaved,v=3,ep=16"), resolve(DSV3_TITAN))
    assert refused["files"] == {} and "cannot cut 61 layers into 48 pipeline stages" in refused["notes"][0]


@pytest.mark.parametrize("preset, present, absent", [("llama3.2-1b", [], ["--untie-embeddings-and-output-weights"]),
                                                     ("qwen2.5-7b", ["--add-qkv-bias"], []),
                                                     ("llama3-8b", ["--untie-embeddings-and-output-weights"],
                                                      ["--add-qkv-bias", "--qk-layernorm", "--kv-channels"]),
                                                     # Qwen3's per-head q/k norms; 32B's heads are 128 wide, not 80
                                                     ("qwen3-8b", ["--qk-layernorm", "--swiglu"], ["--kv-channels"]),
                                                     ("qwen3-32b", ["--qk-layernorm", "--kv-channels", "128"], []),
                                                     ("qwen3-30b-a3b", ["--qk-layernorm", "--kv-channels", "128"], []),
                                                     ("mistral-nemo-12b", ["--kv-channels", "128"],
                                                      ["--qk-layernorm"]),
                                                     ("deepseek-v3", ["--multi-latent-attention"], ["--qk-layernorm"])])
def test_megatron_args_build_the_presets_model(preset: str, present: list[str], absent: list[str]) -> None:
    """The flags are Megatron-LM's (megatron/training/arguments.py: --kv-channels and --qk-layernorm in
    _add_network_size_args and _add_vision_args)."""
    spec = parse_spec({"model": {"preset": preset}, "training": {"global_batch": 64, "precision": "bf16"},
                       "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}})
    args = launch_files(Plan.parse("dp=8,mbs=1,zero=1" + (",ep=8" if spec.model.is_moe else "")),
                        resolve(spec))["megatron_args.txt"].split()
    assert all(a in args for a in present) and not any(a in args for a in absent)
