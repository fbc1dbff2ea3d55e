"""Megatron-Core's delay_wgrad_compute (the overlap kind `wgrad`): the experts' weight-gradient GEMMs moved beside the
dispatch's backward all-to-all in the combined 1F1B, priced by that schedule's phases, written to and read back from
Megatron-LM's arguments, and refused where it cannot run."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.frameworks import FRAMEWORKS
from predictor.frameworks.base import as_run
from predictor.frameworks.launch import launch_files, read_back
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.overlap import combined_1f1b_exposed
from predictor.plan import Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec


def _exposed(comm: float, delayed: bool, layer: float = 1.0) -> float:
    """One MoE layer whose experts' forward, data and weight gradients take `layer` each, its attention long."""
    out = combined_1f1b_exposed(np.array([4 * comm]), np.array([10.0 + layer]), np.array([10.0 + 2 * layer]),
                                np.array([layer]), np.array([2 * layer]), np.array([1.0]), np.array([delayed]))
    return float(out[0])


@pytest.mark.parametrize("comm, gain", [(1.5, 0.5), (1.0, 0.0), (2.0, 0.0), (0.5, 0.0)])
def test_delaying_the_weight_gradients_helps_where_a_dispatch_outlasts_one_gemm_but_not_two(comm, gain):
    """Each all-to-all c beside MLP phases of F = D = W = 1: inline, the dispatch backward waits for D + W and then
    has F beside it; delayed, it starts after D and has W + F."""
    assert _exposed(comm, False) - _exposed(comm, True) == pytest.approx(gain)
    assert _exposed(comm, True) >= 0


def _spec(framework: str = "megatron"):
    return parse_spec({"model": {"preset": "qwen3-30b-a3b", "seq_len": 4096},
                       "training": {"global_batch": 512, "precision": "bf16", "framework": framework},
                       "cluster": {"device": "h100", "nodes": 2, "gpus_per_node": 8}})


PLAN = Plan.parse("dp=16,ep=16,zero=1,overlap=ep+dp+param")


def test_it_hides_more_of_the_expert_all_to_all():
    spec = _spec()
    inline, delayed = AnalyticalPredictor().predict(spec, graph_for(spec.model), [PLAN, PLAN.with_(overlap="ep+wgrad+dp+param")])
    assert delayed.hidden_comm["ep_comm"] > inline.hidden_comm["ep_comm"]
    assert delayed.iter_time_s < inline.iter_time_s


def test_megatron_writes_and_reads_it_back_and_refuses_it_without_the_overlap(tmp_path):
    spec = _spec()
    plan = PLAN.with_(overlap="ep+wgrad+dp+param")
    files = launch_files(plan, resolve(spec))
    assert "--delay-wgrad-compute" in files["megatron_args.txt"].split("\n")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert read_back(tmp_path / "megatron_args.txt", spec) == as_run(plan, FRAMEWORKS["megatron"], spec)
    assert "--delay-wgrad-compute" not in launch_files(PLAN, resolve(spec))["megatron_args.txt"].split("\n")
    assert any("overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute" in e
               for e in FRAMEWORKS["megatron"].errors(PLAN.with_(overlap="wgrad+dp+param"), spec))


def test_torchtitan_has_no_such_schedule():
    spec = _spec("torchtitan")
    assert any("cannot overlap wgrad" in e
               for e in FRAMEWORKS["torchtitan"].errors(Plan.parse("dp=16,ep=16,zero=3,overlap=dp+wgrad"), spec))
