"""torchtitan's activation checkpointing and torch.compile as its code runs them: per-op selective checkpointing
keeps its policy's saved outputs and recomputes the rest (pytorch/torchtitan torchtitan/models/llama3/infra/
parallelize.py `_op_sac_save_list`, torchtitan/distributed/activation_checkpoint.py), compile keeps what the compiled
backward reads, and both reach the launch file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from predictor.frameworks import FRAMEWORKS, as_run
from predictor.frameworks.base import LaunchError
from predictor.frameworks.launch import launch_files, read_back, run_errors
from predictor.frameworks.torchtitan import TOML_FILE
from predictor.graph.cache import graph_for
from predictor.memory.facts import GIB, HEADROOM
from predictor.memory.lever_settings import op_sac_recomputed
from predictor.memory.saved import Dims, layer_tensors, op_sac_tensors
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.plan.share import RankShare
from predictor.spec.resolver import get_device, resolve
from predictor.spec.workload import WorkloadSpec, parse_spec

TITAN = FRAMEWORKS["torchtitan"]


def _spec(preset: str = "llama3.1-8b", nodes: int = 1, batch: int = 16, precision: str = "bf16",
          compile_: bool | None = None, device: str = "h100") -> WorkloadSpec:
    training = {"global_batch": batch, "framework": "torchtitan", "precision": precision,
                **({} if compile_ is None else {"compile": compile_})}
    return parse_spec({"model": {"preset": preset, "seq_len": 8192}, "training": training,
                       "cluster": {"device": device, "nodes": nodes}})


PLANS = [  # (spec, plan without recompute): FSDP alone, FSDP+TP, FSDP+TP+async TP in float8, compiled and eager
    (_spec(), Plan(dp=8, mbs=2, zero=3)),
    (_spec(compile_=True), Plan(dp=8, mbs=2, zero=2)),
    (_spec(nodes=8, batch=96), Plan(dp=8, tp=8, sp=True, mbs=12, zero=3)),
    (_spec(nodes=8, batch=96, precision="fp8"), Plan(dp=8, tp=8, sp=True, mbs=12, zero=3, overlap="dp+param+tp")),
    (_spec("llama3.1-70b", nodes=32, batch=512), Plan(dp=32, tp=8, sp=True, mbs=16, zero=3)),
]


@pytest.mark.parametrize("spec,plan", PLANS, ids=[f"{s.model.preset}-{p}" for s, p in PLANS])
def test_per_op_selective_lies_between_no_and_full_checkpointing(spec: WorkloadSpec, plan: Plan) -> None:
    graph = graph_for(spec.model)
    runs = {mode: AnalyticalPredictor().predict(spec, graph, [plan.with_(recompute=mode)])[0]
            for mode in ("none", "selective", "full")}
    memory = {mode: p.peak_memory_gib for mode, p in runs.items()}
    compute = {mode: p.breakdown["compute"] for mode, p in runs.items()}
    assert memory["full"] < memory["selective"] < memory["none"]
    assert compute["none"] < compute["selective"] < compute["full"]


def test_the_policy_saves_every_odd_mm_and_the_attention_kernel_and_recomputes_the_rest() -> None:
    graph = graph_for(_spec().model)
    again = op_sac_recomputed(graph)
    block = {n.name.rsplit(".", 1)[-1] if n.kind != "attention" else "sdpa": bool(r)
             for n, r in zip(graph.nodes, again) if ".layers.0." in f"{n.name}."}
    # forward order wq, wk, wv, wo, w1 (gate), w3 (up), w2 (down): the 2nd, 4th and 6th mm are recomputed
    assert block == {"input_layernorm": True, "q_proj": False, "k_proj": True, "v_proj": False, "sdpa": False,
                     "o_proj": True, "post_attention_layernorm": True, "gate_proj": False, "act_fn": True,
                     "up_proj": True, "down_proj": False}
    assert not again[[n.group != "block" for n in graph.nodes]].any()


def test_compiled_blocks_keep_only_what_backward_reads() -> None:
    d = Dims.of(_spec().model, RankShare.split({"tp": 8}, True), precision="bf16")
    eager, compiled = op_sac_tensors(d, False), op_sac_tensors(d, False, compiled=True)
    dropped = {s.name for s in eager} - {s.name for s in compiled}
    assert dropped == {"w2 output (unreduced)", "attention reduce-scatter output",
                       "mlp reduce-scatter output"}
    full = sum(s.per_token for s in layer_tensors(d, TITAN.memory, False))
    assert sum(s.per_token for s in compiled) < sum(s.per_token for s in eager) < full


@pytest.mark.parametrize("nodes", [1, 16])
def test_torchtitans_shipped_llama3_8b_plan_fits_on_h100(nodes: int) -> None:
    """llama3_8b.toml: FSDP over every GPU, local batch 2 of 8,192 tokens, selective per-op checkpointing, eager;
    it ran at 62-77 GiB on 8 and 128 H100."""
    spec = _spec(nodes=nodes, batch=16 * nodes)
    plan = Plan(dp=8 * nodes, mbs=2, zero=3, recompute="selective")
    peak = AnalyticalPredictor().predict(spec, graph_for(spec.model), [plan])[0].peak_memory_gib
    assert 50 < peak <= get_device("h100").mem_capacity / GIB * (1 - HEADROOM)


@pytest.mark.parametrize("compile_,precision,expected", [(None, "bf16", False), (None, "fp8", True),
                                                          (True, "bf16", True), (False, "fp8", False)])
def test_compile_is_written_to_the_toml_and_read_back(compile_, precision, expected, tmp_path: Path) -> None:
    spec = _spec(nodes=8, batch=96, precision=precision, compile_=compile_)
    plan = Plan(dp=8, tp=8, sp=True, mbs=12, zero=3, recompute="selective")
    path = tmp_path / TOML_FILE
    path.write_text(launch_files(plan, resolve(spec))[TOML_FILE])
    assert f"[compile]\nenable = {str(expected).lower()}" in path.read_text()
    assert read_back(path, spec) == as_run(plan, TITAN)
    other = _spec(nodes=8, batch=96, precision=precision, compile_=not expected)
    with pytest.raises(LaunchError, match="training.compile"):
        read_back(path, other)


def test_a_framework_that_does_not_compile_refuses_training_compile() -> None:
    spec = parse_spec({"model": {"preset": "llama3.1-8b", "seq_len": 8192},
                       "training": {"global_batch": 16, "framework": "megatron", "compile": True},
                       "cluster": {"device": "h100"}})
    assert any("training.compile" in e for e in run_errors(Plan(dp=8, mbs=2, zero=1), resolve(spec)))


@pytest.mark.parametrize("text,option", [("dp=8,mbs=2,zero=3,recompute=full,recompute_layers=8", "4"),
                                         ("dp=4,pp=2,v=2,mbs=1,zero=2,recompute=full,recompute_layers=2,"
                                          "schedule=interleaved", "4"),
                                         ("dp=8,mbs=2,zero=3,recompute=full", None),
                                         ("dp=8,mbs=2,zero=3,recompute=selective", "op")])
def test_checkpointing_every_nth_layer_is_written_and_read_back(text: str, option: str | None,
                                                                tmp_path: Path) -> None:
    """recompute=full of k blocks per chunk is torchtitan's selective-by-layer: every (blocks/k)-th block."""
    spec, plan = _spec(), Plan.parse(text)
    assert run_errors(plan, resolve(spec)) == []
    path = tmp_path / TOML_FILE
    path.write_text(launch_files(plan, resolve(spec))[TOML_FILE])
    table = tomllib.loads(path.read_text())["activation_checkpoint"]
    assert table.get("selective_ac_option") == option
    assert read_back(path, spec) == as_run(plan, TITAN)


def test_a_layer_count_that_no_every_nth_block_spells_is_refused() -> None:
    errors = run_errors(Plan.parse("dp=8,mbs=2,zero=3,recompute=full,recompute_layers=3"), resolve(_spec()))
    assert any("recompute_layers=3" in e and "32 blocks" in e for e in errors)


def test_async_tp_without_compile_is_refused() -> None:
    plan = Plan(dp=8, tp=8, sp=True, mbs=12, zero=3, overlap="dp+param+tp")
    errors = run_errors(plan, resolve(_spec(nodes=8, batch=96, compile_=False)))
    assert any("Async TP requires torch.compile" in e and "training.compile" in e for e in errors)
    assert run_errors(plan, resolve(_spec(nodes=8, batch=96))) == []  # unset: compiled, as async TP needs


@pytest.mark.parametrize("device,recipe,converter", [("h100", None, "quantize.linear.float8"),
                                                     ("b200", None, "quantize.linear.mx"),
                                                     ("b200", "current", "quantize.linear.float8")])
def test_the_float8_recipe_picks_torchaos_converter(device: str, recipe: str | None, converter: str,
                                                    tmp_path: Path) -> None:
    training = {"global_batch": 16, "framework": "torchtitan", "precision": "fp8", **({"recipe": recipe} if recipe else {})}
    spec = parse_spec({"model": {"preset": "llama3.1-8b", "seq_len": 8192}, "training": training,
                       "cluster": {"device": device}})
    plan = Plan(dp=8, mbs=2, zero=3, recompute="selective")
    path = tmp_path / TOML_FILE
    path.write_text(launch_files(plan, resolve(spec))[TOML_FILE])
    config = tomllib.loads(path.read_text())
    assert config["model"]["converters"] == [converter]
    assert read_back(path, spec) == as_run(plan, TITAN)
    bf16 = parse_spec({**spec.model_dump(exclude_none=True), "training": {"global_batch": 16, "framework": "torchtitan"}})
    with pytest.raises(LaunchError, match="training.recipe"):
        read_back(path, bf16)


def test_a_recipe_torchao_does_not_run_is_refused() -> None:
    spec = parse_spec({"model": {"preset": "llama3.1-8b", "seq_len": 8192},
                       "training": {"global_batch": 16, "framework": "torchtitan", "precision": "fp8",
                                    "recipe": "delayed"}, "cluster": {"device": "h100"}})
    assert any("training.recipe delayed" in e for e in run_errors(Plan(dp=8, mbs=2, zero=3), resolve(spec)))


def test_expert_parallel_all_to_all_outputs_are_kept_and_not_sent_again() -> None:
    spec = parse_spec({"model": {"preset": "qwen3-30b-a3b", "seq_len": 4096},
                       "training": {"global_batch": 8, "framework": "torchtitan"}, "cluster": {"device": "h100"}})
    d = Dims.of(spec.model, RankShare.split({"ep": 8}), precision="bf16")
    kept = {s.name: s.per_token for s in op_sac_tensors(d, True)}
    assert kept["dispatched tokens (all-to-all output)"] == kept["combined tokens (all-to-all output)"] \
        == spec.model.top_k * spec.model.hidden * 2
    assert "dispatched tokens (all-to-all output)" not in {s.name for s in op_sac_tensors(Dims.of(
        spec.model, RankShare(), precision="bf16"), True)}
    graph, plan = graph_for(spec.model), Plan(dp=8, ep=8, mbs=1, zero=3)
    runs = {mode: AnalyticalPredictor().predict(spec, graph, [plan.with_(recompute=mode)])[0]
            for mode in ("none", "selective", "full")}
    assert runs["full"].peak_memory_gib < runs["selective"].peak_memory_gib < runs["none"].peak_memory_gib
    assert runs["selective"].breakdown["ep_comm"] == runs["none"].breakdown["ep_comm"] < runs["full"].breakdown["ep_comm"]
