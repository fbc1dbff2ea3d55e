"""`module: "pkg.mod:build"` at the scale of today's models: a 117B-parameter decoder written in plain PyTorch
(tests.model_specs:build_decoder) is built on the meta device, traced whole and priced in under a minute, its
layers recognised by kind (embedding, norms, linears, attention, activation, loss) and its linears' tensor-parallel
roles by their names."""

from __future__ import annotations

import time
from collections import Counter

from predictor.graph.build import build_graph
from predictor.graph.modelzoo import build_model, param_count
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.spec.workload import parse_spec

# GPT-3 175B's width at 64 layers: 117.2B parameters.
DECODER = {"hidden": 12288, "layers": 64, "heads": 96, "ffn": 49152, "vocab": 51200}


def test_a_100b_module_is_traced_and_priced_in_under_a_minute() -> None:
    start = time.perf_counter()
    spec = parse_spec({"model": {"module": "tests.model_specs:build_decoder", "kwargs": DECODER,
                                 "inputs": [{"shape": [2048], "dtype": "int64", "high": DECODER["vocab"]}]},
                       "training": {"global_batch": 1024}, "cluster": {"device": "h100", "nodes": 16}},
                      trust_module=True)
    graph = build_graph(spec.model)
    table = AnalyticalPredictor().predict_table(spec, graph, [Plan(dp=8, tp=8, pp=2, sp=True, zero=1,
                                                                   recompute="full")])
    seconds = time.perf_counter() - start
    assert seconds < 60, seconds
    assert graph.params == param_count(build_model(spec.model)) > 100e9
    assert graph.num_blocks == 64
    roles = Counter((n.kind, n.tp) for n in graph.nodes if n.group == "block")
    assert roles[("attention", "heads")] == roles[("linear", "row")] / 2 == roles[("linear", "column")] / 2 == 64
    assert 0 < table.iter_time_s[0] < 1e3 and 0 < table.peak_memory_gib[0] < 1e4
