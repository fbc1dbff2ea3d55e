"""The framework registry: one module per framework, one rule for which applies, the spec's choices derived from it."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Callable

import pytest

from predictor.frameworks.kernels import KernelChoices, Kernels
import yaml

from orchestrator.cli import main
from orchestrator.commands import plan as plan_command
from predictor.costs.prediction import Prediction
from predictor.frameworks import FRAMEWORKS, LaunchError, as_run
from predictor.frameworks import base
from predictor.frameworks.base import FACT_SCALES, Framework, Launch, LaunchTarget, recorded_constants
from predictor.frameworks.launch import launch_files, read_back, run_errors
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.roofline import AnalyticalConfig, device_config, framework_config
from predictor.plan import Plan
from predictor.spec.hardware import DEVICES
from predictor.spec.resolver import resolve
from predictor.spec.workload import SpecError, WorkloadSpec, parse_spec
from search_spaces import enumerate_plans, resolve_space

PROFILE = "predictor/data/cpu/device.json"


def _spec(device: str = "h100", framework: str | None = None, profile: str | None = None):
    training = {"global_batch": 8, **({"framework": framework} if framework else {})}
    cluster = {"device": device, "gpus_per_node": 2, **({"device_profile": profile} if profile else {})}
    return parse_spec({"model": {"preset": "gpt2"}, "training": training, "cluster": cluster})


def test_each_framework_is_one_module_holding_its_whole_profile():
    assert tuple(FRAMEWORKS) == ("megatron", "torchtitan", "deepspeed", "pytorch")
    for name, framework in FRAMEWORKS.items():
        assert framework.name == name == framework.memory.framework
        assert type(framework).__module__ == "predictor.frameworks.base"
        assert (framework.launch is None) == (name == "pytorch")  # ScaleDL's runner runs plans itself
    # Megatron-Core's constants calibrated on Megatron-Bridge's Hopper and Blackwell recipes price those generations
    # only; A100s and the other frameworks keep first principles.
    megatron = FRAMEWORKS["megatron"].constants
    assert set(megatron) == {"hopper", "blackwell", "b200"}
    # over the generation's device facts: the FP8/FP4 GEMM kernels' efficiency is not fitted
    assert framework_config(FRAMEWORKS["megatron"], "hopper") == dataclasses.replace(device_config("hopper"),
                                                                                      **megatron["hopper"])
    assert "fp8_gemm_eff" not in megatron["hopper"]
    assert megatron["hopper"]["gemm_eff_max"] < AnalyticalConfig().gemm_eff_max
    # its BF16 linears' rate measured on B200 alone (SimuMax's runs, bench/simumax_time.py) prices B200 only
    b200 = framework_config(FRAMEWORKS["megatron"], "blackwell", "b200")
    assert b200 == dataclasses.replace(framework_config(FRAMEWORKS["megatron"], "blackwell"), **megatron["b200"])
    assert b200.bf16_gemm_eff_max < device_config("blackwell").gemm_eff_max
    assert framework_config(FRAMEWORKS["megatron"], "blackwell", "gb200").bf16_gemm_eff_max is None
    assert framework_config(FRAMEWORKS["megatron"], "ampere") == device_config("ampere")  # first principles
    # torchtitan's constant, chosen leave-one-source-out on its published runs, scales the device facts and keeps them
    titan = FRAMEWORKS["torchtitan"]
    assert set(titan.constants) == {"hopper", "blackwell"} and set(titan.constants["hopper"]) <= FACT_SCALES
    assert not titan.fitted_on("hopper", "h100") and FRAMEWORKS["megatron"].fitted_on("hopper", "h100")
    assert framework_config(titan, "hopper") == dataclasses.replace(device_config("hopper"), **titan.constants["hopper"])
    assert device_config("hopper") != AnalyticalConfig()  # device facts
    assert framework_config(titan, "ampere") == device_config("ampere")


def test_a_devices_own_constants_go_over_its_generations(tmp_path, monkeypatch):
    """Constants measured on one device alone (by_device) price that device over its generation's; the generation's
    other devices keep the generation's."""
    path = tmp_path / "framework-constants.json"
    path.write_text(json.dumps({"toy": {"constants": {"gemm_eff_max": 0.6, "grouped_gemm_eff": 0.5},
                                        "generations": ["hopper", "blackwell"],
                                        "by_device": {"b200": {"constants": {"bf16_gemm_eff_max": 0.45,
                                                                             "grouped_gemm_eff": 0.3}}}}}))
    monkeypatch.setattr(base, "CONSTANTS_FILE", path)
    constants = recorded_constants("toy")
    assert constants == {"hopper": {"gemm_eff_max": 0.6, "grouped_gemm_eff": 0.5},
                         "blackwell": {"gemm_eff_max": 0.6, "grouped_gemm_eff": 0.5},
                         "b200": {"bf16_gemm_eff_max": 0.45, "grouped_gemm_eff": 0.3}}
    toy = dataclasses.replace(FRAMEWORKS["pytorch"], constants=constants)
    assert framework_config(toy, "blackwell", "b200") == dataclasses.replace(
        device_config("blackwell"), gemm_eff_max=0.6, grouped_gemm_eff=0.3, bf16_gemm_eff_max=0.45)
    assert framework_config(toy, "blackwell", "gb200") == dataclasses.replace(
        device_config("blackwell"), gemm_eff_max=0.6, grouped_gemm_eff=0.5)


def test_the_resolver_decides_once_which_framework_applies():
    assert resolve(_spec()).framework.name == "megatron"  # the default on a catalogue GPU
    assert resolve(_spec(framework="torchtitan")).framework.name == "torchtitan"
    assert resolve(_spec("cpu")).framework.name == "pytorch"  # a measured device runs ScaleDL's runner
    assert resolve(_spec("cpu", profile=PROFILE)).framework.name == "pytorch"
    # A device given decides: a measured one prices any spec with ScaleDL's runner, a catalogue one with the spec's.
    measured = resolve(_spec("cpu", profile=PROFILE)).device
    assert resolve(_spec(framework="deepspeed"), measured).framework.name == "pytorch"
    assert resolve(_spec(framework="deepspeed"), DEVICES["h100"]).framework.name == "deepspeed"


def test_the_analytical_predictor_prices_with_the_framework_the_resolver_names():
    spec, predictor = _spec(framework="torchtitan"), AnalyticalPredictor()
    pieces = predictor.pieces(spec, graph_for(spec.model))
    assert pieces.framework is FRAMEWORKS["torchtitan"] and pieces.config == framework_config(FRAMEWORKS["torchtitan"], "hopper")


def test_the_resolver_takes_the_registrys_names_with_a_did_you_mean():
    for name in tuple(FRAMEWORKS)[:-1]:
        assert resolve(_spec(framework=name)).framework.name == name
    with pytest.raises(SpecError, match=r"training.framework: unknown framework; did you mean 'torchtitan'\? "
                                        r"frameworks: megatron, torchtitan, deepspeed, pytorch \(got 'torchtitn'\)"):
        resolve(_spec(framework="torchtitn"))
    with pytest.raises(SpecError, match="frameworks: megatron"):
        resolve(_spec(framework="jax"))
    with pytest.raises(SpecError, match="runs on GPUs"):
        resolve(_spec("cpu", framework="megatron"))


def test_a_prediction_says_which_constants_price_it():
    notes = {}
    for device in ("h100", "a100-80gb"):
        spec = parse_spec({"model": {"preset": "gpt2"}, "training": {"global_batch": 8, "framework": "megatron"},
                           "cluster": {"device": device, "gpus_per_node": 8}})
        (pred,) = AnalyticalPredictor().predict(spec, graph_for(spec.model), [Plan.parse("dp=8")])
        notes[device] = pred.extra["constants"]
    assert notes["h100"] == "megatron constants calibrated on hopper"
    assert notes["a100-80gb"].startswith("first principles: megatron has no constants fitted on ampere "
                                         "(fitted on blackwell, hopper; on b200 alone)")


# A framework added in one place: this module object, registered by the fixture below. Nothing else names it.
def _toy_rules(plan: Plan, spec: WorkloadSpec) -> list[str]:
    return ["shards with ZeRO 0 or 1 only"] if plan.zero > 1 else []


def _toy_write(plan: Plan, target: LaunchTarget) -> dict[str, str]:
    return {"toy.json": json.dumps({"dp": plan.dp, "tp": plan.tp, "mbs": plan.mbs, "zero": plan.zero, "sp": plan.sp,
                                    "overlap": plan.overlap})}


def _toy_read(text: str, spec: WorkloadSpec) -> Plan:
    return Plan(**json.loads(text))


TOY = Framework("toy", "ToyTrain", _toy_rules, lambda plan: frozenset({"dp"}), frozenset({"dp"}),
                attention_kernel="fused: a toy kernel", kernels=KernelChoices(Kernels(attention="flash")),
                precisions=("bf16",), memory=dataclasses.replace(FRAMEWORKS["megatron"].memory, framework="toy"),
                space={"dp": "auto", "tp": "auto", "pp": [1], "mbs": [1, 2], "zero": [0, 1], "recompute": ["none"],
                       "sp": [False, True], "schedule": ["1f1b"], "placement": ["tp-dp-pp"]},
                axes={"dp": "", "tp": ""}, constants={"hopper": {"gemm_eff_max": 0.3}}, launch=Launch("toy.json", _toy_write, _toy_read))


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Callable[[Framework], None]:
    """Registers TOY (or a variant of it given) for one test; the registry is as it was afterwards."""
    def register(framework: Framework = TOY) -> None:
        monkeypatch.setitem(FRAMEWORKS, framework.name, framework)

    register()
    return register


def test_an_unregistered_framework_is_refused_by_the_resolver():
    with pytest.raises(SpecError, match="unknown framework"):
        resolve(_spec(framework="toy"))


def _priced(spec: WorkloadSpec, plan: Plan) -> Prediction:
    (prediction,) = AnalyticalPredictor().predict(spec, graph_for(spec.model), [plan])
    return prediction


def test_a_framework_added_in_one_place_is_chosen_validated_searched_priced_and_launched(toy, tmp_path, capsys):
    spec = _spec(framework="toy")
    assert resolve(spec).framework is TOY
    # validated: its rules (and its precisions) beside the structural ones
    # an axis it does not declare, refused with the reason
    assert run_errors(Plan(pp=2, mbs=1), resolve(spec)) == ["ToyTrain has no pipeline parallelism (pp=2): it runs dp, "
                                                            "tp; use pp=1"]
    assert run_errors(Plan(dp=2, zero=2), resolve(spec)) == ["ToyTrain shards with ZeRO 0 or 1 only"]
    assert run_errors(Plan(dp=2), resolve(spec)) == []
    # searched in its own space by default
    name, space = resolve_space(spec)
    plans = enumerate_plans(spec, space).plans
    assert name == "toy" and plans and {p.pp for p in plans} == {1} and {p.zero for p in plans} == {0, 1}
    # priced with its constants, its overlap and its memory facts
    plan = Plan(dp=2, mbs=2)
    base = _priced(spec, plan)
    assert base.extra["constants"] == "toy constants calibrated on hopper"
    toy(dataclasses.replace(TOY, constants={}))
    assert _priced(spec, plan).iter_time_s < base.iter_time_s  # first principles: gemm_eff_max 0.8, not 0.3
    toy(dataclasses.replace(TOY, default_overlap=lambda plan: frozenset()))
    assert _priced(spec, plan).iter_time_s > base.iter_time_s  # the gradient all-reduce no longer hidden
    toy(dataclasses.replace(TOY, memory=dataclasses.replace(TOY.memory, workspace_bytes=TOY.memory.workspace_bytes
                                                            + 2**30)))
    assert _priced(spec, plan).peak_memory_gib > base.peak_memory_gib + 0.9
    toy()
    # launched: its file written, and read back as the plan it runs
    files = launch_files(plan, resolve(spec))
    assert list(files) == ["toy.json"]
    (tmp_path / "toy.json").write_text(files["toy.json"])
    assert read_back(tmp_path / "toy.json", spec) == as_run(plan, TOY)
    with pytest.raises(LaunchError, match="has no pipeline parallelism"):
        launch_files(Plan(pp=2, mbs=1), resolve(spec))
    # the CLI: its help names it, and `scaledl predict` takes a spec of it
    parser = argparse.ArgumentParser()
    plan_command.add_arguments(parser)
    assert "own (megatron, torchtitan, deepspeed, pytorch, toy)" in " ".join(parser.format_help().split())
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump({"model": {"preset": "gpt2"}, "training": {"global_batch": 8, "framework": "toy"},
                                    "cluster": {"device": "h100", "gpus_per_node": 2}}))
    capsys.readouterr()
    main(["predict", str(path), "--plan", str(plan), "--plan", "pp=2,mbs=1", "--predictor", "analytical", "--json"])
    good, bad = json.loads(capsys.readouterr().out)
    assert good["iter_time_s"] == pytest.approx(base.iter_time_s) and "has no pipeline parallelism" in bad["error"]
