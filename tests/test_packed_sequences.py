"""Packed sequences (`training.document_tokens`): s/d documents of d tokens per sequence attend within each, so a
fused kernel computes d/s of the causal tiles (on a local layer the band of each document); the launch files as
ScaleDL writes them pack nothing and are refused naming Megatron-Bridge's packed fine-tuning."""

from __future__ import annotations

import pytest

from predictor.frameworks.launch import launch_settings
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.roofline import sliding_window_work
from predictor.plan import Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec


def _spec(preset: str, document: int | None = None):
    return parse_spec({"model": {"preset": preset}, "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8},
                       "training": {"global_batch": 64, **({"document_tokens": document} if document else {})}})


def test_documents_cut_the_causal_tiles() -> None:
    llama = _spec("llama3-8b").model  # 8,192 tokens, global attention
    assert sliding_window_work(llama, 2048) == pytest.approx(2048 / 8192)
    assert sliding_window_work(llama, 10**6) == sliding_window_work(llama) == 1.0
    gemma = _spec("gemma3-4b").model  # 32,768 tokens, five local layers (window 1,024) to one global
    s, w, d = 32768, 1024, 4096
    local, layers = gemma.local_layers, gemma.layers
    expected = ((layers - local) * d / s + local * (2 * w - w * w / d) / s) / layers
    assert sliding_window_work(gemma, d) == pytest.approx(expected)


def test_shorter_documents_train_faster_and_are_not_launched() -> None:
    plan = Plan(dp=8, zero=1)
    times = [AnalyticalPredictor().predict_table(s, graph_for(s.model), [plan]).iter_time_s[0]
             for s in (_spec("llama3-8b", d) for d in (None, 2048, 512))]
    assert times[0] > times[1] > times[2]
    assert "packed_sequence_specs" in launch_settings(plan, resolve(_spec("llama3-8b", 2048)))["notes"][0]
