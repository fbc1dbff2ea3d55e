"""Offloading and the optimizer's dtype as plan fields: what each saves on the device and what its host copies cost."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.graph_cache import graph_for
from predictor.hardware import DEVICES
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.stage_costs import offload_waits
from predictor.plan import Plan, PlanError
from predictor.workload import parse_spec


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
