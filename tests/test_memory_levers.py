"""The memory levers as plan fields: what they save, what they cost, who runs them and how launch files say them."""

from __future__ import annotations

from pathlib import Path

import pytest

from predictor.frameworks import FRAMEWORKS, LaunchError, as_run
from predictor.frameworks.launch import launch_files, read_back
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan, PlanError
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec


def _spec(preset: str = "llama3-8b", framework: str = "megatron", nodes: int = 1, seq: int = 8192,
          precision: str = "bf16", device: str = "h100", batch: int = 64):
    return parse_spec({"model": {"preset": preset, "seq_len": seq},
                       "training": {"global_batch": batch, "precision": precision, "framework": framework},
                       "cluster": {"device": device, "nodes": nodes, "gpus_per_node": 8}})


def _predict(spec, *texts):
    return AnalyticalPredictor().predict(spec, graph_for(spec.model), [Plan.parse(t) for t in texts])


@pytest.mark.parametrize("framework", ["megatron", "torchtitan", "deepspeed"])
def test_selective_recomputation_never_uses_more_memory_than_none(framework) -> None:
    spec = _spec(framework=framework)
    base = "dp=2,tp=4,pp=1,mbs=1,sp=true" + (",zero=2" if framework == "torchtitan" else "")
    none, selective = _predict(spec, base + ",recompute=none", base + ",recompute=selective")
    assert selective.peak_memory_gib <= none.peak_memory_gib
    assert selective.iter_time_s >= none.iter_time_s


def test_recompute_modules_save_activations_and_cost_their_forward() -> None:
    spec = _spec("mixtral-8x7b", nodes=4, seq=4096)
    base = "dp=4,tp=2,pp=4,ep=8,mbs=1,zero=1,sp=true"
    none, modules, full = _predict(spec, base, base + ",recompute=layernorm+moe_act", base + ",recompute=full")
    saved = none.memory_breakdown["activations"] - modules.memory_breakdown["activations"]
    assert 0 < saved < none.memory_breakdown["activations"] - full.memory_breakdown["activations"]
    assert none.breakdown["compute"] < modules.breakdown["compute"] < full.breakdown["compute"]


def test_full_recomputation_of_some_layers_lies_between_none_and_all() -> None:
    spec = _spec(nodes=2)
    base = "dp=2,tp=2,pp=4,mbs=1,sp=true"
    none, two, every = _predict(spec, base, base + ",recompute=full,recompute_layers=2", base + ",recompute=full")
    assert every.peak_memory_gib < two.peak_memory_gib < none.peak_memory_gib
    assert none.breakdown["compute"] < two.breakdown["compute"] < every.breakdown["compute"]


def test_module_names_are_canonical_and_checked() -> None:
    assert Plan.parse("dp=2,recompute=moe_act+layernorm").recompute == "layernorm+moe_act"
    assert Plan.parse("dp=2,recompute=core_attn").recompute == "selective"
    with pytest.raises(PlanError, match="module names joined by"):
        Plan.parse("dp=2,recompute=layernorm+attention")
    with pytest.raises(PlanError, match="needs recompute=full"):
        Plan.parse("dp=2,recompute_layers=3")


def test_only_megatron_recomputes_modules_and_only_it_and_torchtitan_some_layers() -> None:
    modules, some = Plan.parse("dp=8,recompute=layernorm"), Plan.parse("dp=8,recompute=full,recompute_layers=1")
    assert FRAMEWORKS["megatron"].lever_errors(modules) == FRAMEWORKS["megatron"].lever_errors(some) == []
    assert FRAMEWORKS["torchtitan"].lever_errors(some) == []  # every N-th block (selective_ac_option = N)
    for name in ("torchtitan", "deepspeed", "pytorch"):
        assert "--recompute-modules" in " ".join(FRAMEWORKS[name].lever_errors(modules))
        assert not FRAMEWORKS[name].runs_value("recompute", "layernorm")
    for name in ("deepspeed", "pytorch"):
        assert "recompute_layers=0" in " ".join(FRAMEWORKS[name].lever_errors(some))
    spec = _spec(framework="deepspeed")
    with pytest.raises(LaunchError, match="recompute"):
        launch_files(modules, resolve(spec))


@pytest.mark.parametrize("text", ["dp=8,recompute=layernorm+moe_act,mbs=1", "dp=4,tp=2,sp=true,recompute=full,"
                                  "recompute_layers=3", "dp=2,tp=2,pp=2,sp=true,recompute=selective"])
def test_megatron_launch_files_write_the_levers_and_read_them_back(text, tmp_path: Path) -> None:
    spec = _spec("mixtral-8x7b", seq=4096)
    plan = Plan.parse(text + (",ep=8" if "pp=2" not in text else ""))
    for name, content in launch_files(plan, resolve(spec)).items():
        (tmp_path / name).write_text(content)
    args = (tmp_path / "megatron_args.txt").read_text()
    if plan.recompute_layers:
        assert "--recompute-method block" in args.replace("\n", " ")
    elif "+" in plan.recompute:
        assert "--recompute-modules" in args
    assert read_back(tmp_path / "megatron_args.txt", spec) == as_run(plan, FRAMEWORKS["megatron"])
