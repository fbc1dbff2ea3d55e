"""LoRA fine-tuning (predictor.costs.lora): adapters on every block linear (as many parameters as r·(in + out) of the
model's own block linears), the frozen base without gradients, optimizer state or gradient sync, its linears'
backward without weight gradients; launch files refuse it naming Megatron-Bridge's PEFT, and frameworks whose LoRA
is not priced are refused at load."""

from __future__ import annotations

import pytest
from torch import nn

from predictor.costs.lora import adapter_params
from predictor.costs.parallel import shard_nodes
from predictor.frameworks.launch import launch_settings, run_errors
from predictor.graph.cache import graph_for
from predictor.graph.modelzoo import build_model
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.plan.share import RankShare
from predictor.spec.resolver import resolve
from predictor.spec.workload import SpecError, parse_spec

RANK = 16


def _spec(rank: int | None = RANK, framework: str = "megatron"):
    return parse_spec({"model": {"preset": "llama3-8b"}, "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8},
                       "training": {"global_batch": 64, "framework": framework,
                                    **({"lora_rank": rank} if rank else {})}})


def test_adapters_are_rank_times_the_block_linears_widths() -> None:
    spec = _spec()
    graph = graph_for(spec.model)
    nodes = shard_nodes(graph, RankShare())
    counts = [n.count for n in graph.nodes]
    traced = sum(c * p for c, p in zip(counts, adapter_params(nodes, RANK)))
    model = build_model(spec.model)
    blocks = [m for name, m in model.named_modules() if isinstance(m, nn.Linear) and ".layers." in name]
    assert traced == RANK * sum(m.in_features + m.out_features for m in blocks)


def test_the_frozen_base_trains_nothing_and_backward_skips_weight_gradients() -> None:
    plans = [Plan(dp=8, zero=0), Plan(dp=8, zero=1)]
    full, lora = (AnalyticalPredictor().predict_table(s, graph_for(s.model), plans) for s in (_spec(None), _spec()))
    # zero=0: 8B parameters' fp32 main gradients, fp32 master and moments (16 bytes each) are gone, the weights stay
    assert full.peak_memory_gib[0] - lora.peak_memory_gib[0] == pytest.approx(8.03e9 * 16 / 2**30, rel=0.05)
    assert 0.6 < lora.iter_time_s[1] / full.iter_time_s[1] < 0.95  # no weight gradients, no gradient sync


def test_launch_and_frameworks_refuse_what_is_not_priced() -> None:
    resolved = resolve(_spec())
    assert "Megatron-Bridge's PEFT LoRA" in launch_settings(Plan(dp=8, zero=1), resolved)["notes"][0]
    assert any("zero=0 or 1" in e for e in run_errors(Plan(dp=8, zero=3), resolved))
    with pytest.raises(SpecError, match="training.lora_rank: torchtitan's LoRA is not priced"):
        resolve(_spec(framework="torchtitan"))
