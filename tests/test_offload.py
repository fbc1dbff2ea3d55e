"""Offloading and the optimizer's dtype as plan fields: what each saves on the device and what its host copies cost."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from predictor.frameworks import FRAMEWORKS, as_run
from predictor.frameworks.launch import launch_files, read_back
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.stage_costs import offload_waits
from predictor.plan import Plan, PlanError
from predictor.spec.hardware import DEVICES
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec


def _spec(device: str = "h100", nodes: int = 8, gpus_per_node: int = 8):
    return parse_spec({"model": {"preset": "llama3-70b", "seq_len": 8192},
                       "training": {"global_batch": 128, "precision": "bf16", "framework": "megatron"},
                       "cluster": {"device": device, "nodes": nodes, "gpus_per_node": gpus_per_node}})


def _predict(spec, base: str, *levers: str):
    plans = [Plan.parse(base + lever) for lever in ("", *levers)]
    return AnalyticalPredictor().predict(spec, graph_for(spec.model), plans)


def test_offload_values_are_canonical_and_checked() -> None:
    plan = Plan.parse("dp=2,offload=moe_act+core_attn,optimizer_offload=0.5,moments=bf16")
    assert plan.offload == "core_attn+moe_act" and plan.optimizer_offload == 0.5 and plan.moments == "bf16"
    assert Plan.parse(str(plan)) == plan
    assert "offload" not in str(Plan(dp=2))  # plans written before these fields keep their strings
    for text, field in (("offload=layers:0", "'offload'"), ("offload=attention", "'offload'"),
                        ("optimizer_offload=1.5", "'optimizer_offload'"), ("optimizer_offload=half", "'optimizer_offload'"),
                        ("moments=fp8", "'moments'")):
        with pytest.raises(PlanError, match=field):
            Plan.parse("dp=2," + text)


def test_activation_offloading_saves_its_tensors_and_hides_its_copies_behind_compute() -> None:
    base, layers, modules = _predict(_spec(), "dp=8,tp=8,mbs=1,zero=1,sp=true", ",offload=layers:20",
                                     ",offload=core_attn+attn_proj")
    acts = base.memory_breakdown["activations"]
    assert layers.memory_breakdown["activations"] < modules.memory_breakdown["activations"] < acts
    assert layers.iter_time_s == pytest.approx(base.iter_time_s)  # 50 GB/s PCIe copies outpaced by the layers


def test_offload_copies_that_outlast_the_pass_stall_it() -> None:
    pcie, c2c = DEVICES["h100"], DEVICES["gb200"]
    t = np.array([0.01, 0.01])
    to_host = np.array([2e9, 0.0])  # 2 GB one way: 40 ms over PCIe Gen5, ~9 ms over NVLink-C2C
    fwd, bwd = offload_waits(t, t, to_host, pcie)
    assert fwd[0] == pytest.approx(2e9 / pcie.host_link.bandwidth - 0.01, rel=1e-3) and fwd[1] == 0.0
    assert offload_waits(t, t, to_host, c2c).max() == 0.0


def test_optimizer_offload_moves_the_state_to_the_host_at_the_host_links_price() -> None:
    base = "dp=8,tp=8,mbs=1,zero=1,sp=true"
    for device, nodes, per_node in (("h100", 8, 8), ("gb200", 16, 4)):
        spec = _spec(device, nodes, per_node)
        plain, half, whole, bf16 = _predict(spec, base, ",optimizer_offload=0.5", ",optimizer_offload=1",
                                            ",moments=bf16")
        assert whole.memory_breakdown["optimizer"] == 0.0
        assert half.memory_breakdown["optimizer"] == pytest.approx(plain.memory_breakdown["optimizer"] / 2, rel=1e-6)
        assert plain.breakdown["optimizer"] < half.breakdown["optimizer"] < whole.breakdown["optimizer"]
        # BF16 moments: 4 of Adam's 12 state bytes per parameter less, and a faster step
        assert bf16.memory_breakdown["optimizer"] == pytest.approx(plain.memory_breakdown["optimizer"] * 8 / 12, rel=1e-6)
        assert bf16.breakdown["optimizer"] < plain.breakdown["optimizer"]
    h100, gb200 = (_predict(_spec(d, n, g), base, ",optimizer_offload=1")[1].breakdown["optimizer"]
                   for d, n, g in (("h100", 8, 8), ("gb200", 16, 4)))
    assert gb200 < h100  # NVLink-C2C and Grace's LPDDR5X against PCIe Gen5 and DDR5


def _round_trip(plan: Plan, spec, tmp_path: Path) -> Plan:
    files = launch_files(plan, resolve(spec))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return read_back(tmp_path / next(iter(files)), spec)


@pytest.mark.parametrize("levers", ["offload=layers:4", "offload=core_attn+expert_fc1,moments=bf16",
                                    "optimizer_offload=0.5,grads=bf16", "optimizer_offload=1,moments=bf16,grads=bf16"])
def test_megatron_launch_files_write_the_levers_and_read_them_back(levers: str, tmp_path: Path) -> None:
    spec = _spec()
    plan = Plan.parse("dp=8,tp=8,mbs=1,zero=1,sp=true," + levers)
    args = launch_files(plan, resolve(spec))["megatron_args.txt"]
    assert "--cross-entropy-fusion-impl" in args  # the fused loss the memory prediction assumes
    assert ("--cpu-offloading-num-layers" in args) == ("layers:" in levers)
    assert ("--optimizer-cpu-offload" in args) == ("optimizer_offload" in levers)
    assert _round_trip(plan, spec, tmp_path) == as_run(plan, FRAMEWORKS["megatron"])


def test_deepspeed_offloads_the_whole_optimizer_under_zero(tmp_path: Path) -> None:
    spec = parse_spec({"model": {"preset": "llama3-8b", "seq_len": 4096},
                       "training": {"global_batch": 64, "precision": "bf16", "framework": "deepspeed"},
                       "cluster": {"device": "a100-80gb", "nodes": 1, "gpus_per_node": 8}})
    framework = FRAMEWORKS["deepspeed"]
    plan = Plan.parse("dp=8,mbs=1,zero=2,optimizer_offload=1")
    assert not framework.errors(plan, spec) and not framework.lever_errors(plan)
    config = json.loads(launch_files(plan, resolve(spec))["deepspeed_config.json"])
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert _round_trip(plan, spec, tmp_path) == as_run(plan, framework)
    assert any("whole optimizer or none" in e for e in framework.errors(plan.with_(optimizer_offload=0.5), spec))
    assert any("use zero >= 1" in e for e in framework.errors(plan.with_(zero=0), spec))
    assert any("moments=fp32" in e for e in framework.lever_errors(plan.with_(moments="bf16")))


def test_frameworks_without_a_lever_name_it_and_its_fix() -> None:
    (error,) = FRAMEWORKS["torchtitan"].lever_errors(Plan.parse("dp=8,offload=layers:2"))
    assert "offload=layers:2" in error and "use offload=none" in error
