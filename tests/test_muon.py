"""The Muon optimizer as Megatron-Core runs it (predictor.costs.muon): one momentum on the matrices, its Newton-Schulz
FLOPs (counted against torch's own FLOP counter on the iteration), whole-gradient all-reduces under dist_muon, the
launch file's --optimizer read back, and the refusals of what Megatron-Core's Muon and other frameworks lack."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from predictor.costs.muon import NS_STEPS, muon_nodes, newton_schulz_flops
from predictor.costs.parallel import shard_nodes
from predictor.frameworks.launch import launch_files, read_back, run_errors
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.plan.share import RankShare
from predictor.spec.resolver import resolve
from predictor.spec.workload import SpecError, parse_spec


def _spec(optimizer: str, framework: str = "megatron") -> object:
    return parse_spec({"model": {"preset": "moonlight-16b-a3b"},
                       "training": {"global_batch": 512, "optimizer": optimizer, "framework": framework},
                       "cluster": {"device": "h100", "nodes": 32, "gpus_per_node": 8}})


def _newton_schulz(x: torch.Tensor) -> torch.Tensor:
    """emerging_optimizers' quintic iteration on a momentum of m x M (m <= M)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    for _ in range(NS_STEPS):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


def test_newton_schulz_flops_are_the_iterations() -> None:
    spec = _spec("muon")
    nodes = shard_nodes(graph_for(spec.model), RankShare.split({"tp": 4}, True))
    flops = newton_schulz_flops(nodes)
    i = int(np.flatnonzero(muon_nodes(nodes) & ~nodes.experts & (nodes.gemm_k != nodes.gemm_n))[0])
    k, n = int(nodes.gemm_k[i]), int(nodes.gemm_n[i])
    with FlopCounterMode(display=False) as counter:
        _newton_schulz(torch.zeros(min(k, n), max(k, n)))
    assert flops[i] == counter.get_total_flops()
    assert not flops[nodes.group == "post"].any()  # the output layer steps with Adam


def test_muon_keeps_one_momentum_and_all_reduces_whole_gradients() -> None:
    plans = [Plan(dp=64, tp=4, sp=True, zero=0), Plan(dp=64, tp=4, sp=True, zero=1)]
    adam, muon = (AnalyticalPredictor().predict_table(s, graph_for(s.model), plans) for s in (_spec("adam"),
                                                                                           _spec("muon")))
    # replicated states: 4 bytes less per matrix parameter (Moonlight's routed experts are whole on every rank)
    assert 40 < adam.peak_memory_gib[0] - muon.peak_memory_gib[0] < 60
    assert muon.iter_time_s[1] > adam.iter_time_s[1]  # all-reduce instead of reduce-scatter, plus Newton-Schulz
    assert muon.iter_time_s[0] > muon.iter_time_s[1]  # zero=0: every rank orthogonalises every matrix


def test_megatron_writes_dist_muon_and_refuses_what_muon_lacks(tmp_path: Path) -> None:
    spec = _spec("muon")
    resolved = resolve(spec)
    plan = Plan(dp=64, tp=4, sp=True, zero=1)
    args = launch_files(plan, resolved)["megatron_args.txt"]
    assert "--optimizer dist_muon" in args and "--use-distributed-optimizer" not in args
    if importlib.util.find_spec("megatron.core") is not None:  # Megatron-Core's own checks accept the file
        from tests.framework_checks import megatron_refusals

        assert megatron_refusals(args, spec.cluster.gpus) == []
    path = tmp_path / "megatron_args.txt"
    path.write_text(args)
    assert read_back(path, spec).zero == 1
    assert any("Megatron-FSDP" in e for e in run_errors(plan.with_(zero=3), resolved))
    assert any("precision-aware" in e for e in run_errors(plan.with_(moments="bf16"), resolved))
    with pytest.raises(SpecError, match="training.optimizer 'muon': torchtitan runs adam, sgd"):
        resolve(_spec("muon", "torchtitan"))


def test_kimi_k2_with_muon_is_planned_end_to_end(scaledl, tmp_path: Path) -> None:
    """Kimi K2 as Moonshot trained it, with Muon: scaledl plan searches Megatron-Core's plans (zero 0/1 only) and
    writes the winner's --optimizer."""
    run, _ = scaledl.plan_spec({"model": {"preset": "kimi-k2"},
                                "training": {"global_batch": 1024, "optimizer": "muon"},
                                "cluster": {"device": "h100", "nodes": 64, "gpus_per_node": 8},
                                "search": {"max_pp": 8}}, tmp_path / "out")
    if run.returncode == 0:
        assert "--optimizer" in (tmp_path / "out" / "launch" / "megatron_args.txt").read_text()
