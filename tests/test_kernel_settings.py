"""The framework settings that change the kernels (`training.kernels`): each framework's defaults, the refusals with
their reasons, what each setting costs, and the round trip through the launch files."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.costs.parallel import apply_plan
from predictor.frameworks import FRAMEWORKS, as_run
from predictor.frameworks.kernels import FIELDS, Kernels, kernels_of
from predictor.frameworks.launch import kernels_back, launch_files, read_back
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.cuda_graphs import host_ops
from predictor.models.roofline import HOST_OPS
from predictor.plan import Plan
from predictor.spec.resolver import get_device, resolve
from predictor.spec.workload import SpecError, parse_spec


def _spec(kernels: dict | None = None, preset: str = "gpt3-2.7b", framework: str = "megatron", device: str = "a100-80gb",
          nodes: int = 1, precision: str = "bf16", **model: object):
    training = {"global_batch": 64, "framework": framework, "precision": precision,
                **({"kernels": kernels} if kernels is not None else {})}
    return parse_spec({"model": {"preset": preset, **model}, "training": training,
                       "cluster": {"device": device, "nodes": nodes, "gpus_per_node": 8}})


def _predict(spec, plan: str):
    return AnalyticalPredictor().predict(spec, graph_for(spec.model), [Plan.parse(plan)])[0]


def test_each_framework_has_its_defaults():
    megatron, titan, deepspeed = (FRAMEWORKS[n].kernels for n in ("megatron", "torchtitan", "deepspeed"))
    assert megatron.default("ampere").attention == "flash" and megatron.default("hopper").attention == "cudnn"
    assert megatron.defaults.transformer_engine and not megatron.defaults.cuda_graphs
    assert titan.default("hopper").attention == "flash" and not titan.defaults.transformer_engine
    assert deepspeed.default("ampere").attention == "unfused"
    # without Transformer Engine, Megatron-Core's attention is its local, unfused one
    assert kernels_of(_spec({"transformer_engine": False}), megatron, "ampere").attention == "unfused"


@pytest.mark.parametrize("kernels, framework, preset, precision, words", [
    ({"cuda_graphs": True}, "torchtitan", "llama3-8b", "bf16", "torchtitan captures no CUDA graphs"),
    ({"attention": "cudnn"}, "deepspeed", "gpt3-2.7b", "bf16", "not cuDNN's"),
    ({"transformer_engine": False}, "megatron", "llama3-8b", "fp8", "fp8 GEMMs are Transformer Engine's"),
    ({"transformer_engine": False, "attention": "flash"}, "megatron", "gpt3-2.7b", "bf16", "through Transformer Engine"),
    ({"fused_bias_gelu": False}, "megatron", "llama3-8b", "bf16", "is gated (SwiGLU)"),
])
def test_settings_a_framework_cannot_run_are_refused_with_the_field(kernels, framework, preset, precision, words):
    with pytest.raises(SpecError, match="training.kernels") as err:
        resolve(_spec(kernels, preset, framework, "h100", precision=precision))
    assert words in str(err.value)


PLAN = "dp=2,tp=4,mbs=1,zero=1,sp=true"


def test_unfused_attention_costs_time_and_keeps_its_scores():
    """Unfused attention runs the scores through memory and keeps them for backward unless attention is recomputed;
    its softmax without the fusion runs eager operators and more passes."""
    fused, unfused = _predict(_spec(), PLAN), _predict(_spec({"attention": "unfused"}), PLAN)
    eager = _predict(_spec({"attention": "unfused", "fused_softmax": False}), PLAN)
    assert fused.iter_time_s < unfused.iter_time_s < eager.iter_time_s
    assert unfused.memory_breakdown["activations"] > 1.5 * fused.memory_breakdown["activations"]
    recomputed = [_predict(_spec(k), PLAN + ",recompute=selective") for k in ({}, {"attention": "unfused"})]
    assert recomputed[1].memory_breakdown["activations"] == pytest.approx(recomputed[0].memory_breakdown["activations"])
    assert unfused.extra["attention_rate"].startswith("first principles: unfused")


def test_switched_off_fusions_cost_memory_passes():
    base = _predict(_spec(), PLAN)
    for setting in ("fused_bias_gelu", "fused_grad_accum"):
        off = _predict(_spec({setting: False}), PLAN)
        assert off.breakdown["compute"] > base.breakdown["compute"], setting
        assert off.peak_memory_gib == base.peak_memory_gib


def test_cuda_graphs_remove_the_host_bound():
    """A small model at micro-batch 1 is host-bound; replaying each layer as a graph launches it once."""
    eager, graphs = (_predict(_spec(k, "gpt3-125m", seq_len=512), "dp=8,mbs=1") for k in ({}, {"cuda_graphs": True}))
    assert eager.extra["framework_s"]["host"] > 0
    assert graphs.extra["framework_s"]["host"] < eager.extra["framework_s"]["host"]
    assert graphs.iter_time_s < eager.iter_time_s


def test_cuda_graph_scopes_remove_the_host_time_they_capture_and_keep_static_buffers():
    """Megatron-LM's --cuda-graph-scope: a whole layer launches once, the attention sublayer alone leaves the MLP
    eager, a full-iteration graph launches nothing per operator; each per-layer graph keeps static buffers."""
    def run(**kernels):
        return _predict(_spec(kernels, "gpt3-125m", seq_len=512), "dp=8,mbs=1")
    eager, layer, full = run(), run(cuda_graphs=True), run(cuda_graphs=True, cuda_graph_scope="full_iteration")
    spec = _spec({}, "gpt3-125m", seq_len=512)
    nodes = apply_plan(spec, graph_for(spec.model), Plan(dp=8), get_device(spec.cluster.device)).nodes
    ops = np.array([HOST_OPS.get(k, 1) for k in nodes.kind], dtype=float)
    launched = [float(host_ops(ops, nodes, Kernels(cuda_graphs=graphs, cuda_graph_scope=scope)).sum())
                for graphs, scope in ((False, "layer"), (True, "attn"), (True, "layer"), (True, "full_iteration"))]
    assert launched[0] > launched[1] > launched[2] > launched[3] == 0
    assert eager.extra["framework_s"]["host"] > layer.extra["framework_s"]["host"]
    assert layer.memory_breakdown["buffers"] > eager.memory_breakdown["buffers"]
    assert full.memory_breakdown["buffers"] == eager.memory_breakdown["buffers"]


@pytest.mark.parametrize("kernels, words", [
    ({"cuda_graphs": True, "cuda_graph_scope": "mlp+attn"}, "use layer, full_iteration"),
    ({"cuda_graph_scope": "attn"}, "set cuda_graphs: true"),
])
def test_a_cuda_graph_scope_it_cannot_capture_is_refused(kernels, words):
    with pytest.raises(SpecError, match=words):
        resolve(_spec(kernels))


def test_without_transformer_engine_no_tensor_parallel_overlap():
    on, off = _predict(_spec(), PLAN), _predict(_spec({"transformer_engine": False}), PLAN)
    assert on.hidden_comm.get("tp_comm", 0) > 0 and "tp_comm" not in off.hidden_comm


@pytest.mark.parametrize("framework, kernels, plan", [
    ("megatron", {}, PLAN),
    ("megatron", {"attention": "unfused", "transformer_engine": False, "cuda_graphs": True, "fused_softmax": False,
                  "fused_bias_gelu": False, "fused_grad_accum": False}, PLAN),
    ("megatron", {"attention": "cudnn", "cuda_graphs": True}, PLAN),
    ("megatron", {"cuda_graphs": True, "cuda_graph_scope": "attn+moe_router"}, PLAN),
    ("megatron", {"cuda_graphs": True, "cuda_graph_scope": "full_iteration"}, PLAN),
    ("deepspeed", {}, "dp=8,mbs=1,zero=1"),
    ("deepspeed", {"attention": "flash", "fused_softmax": False, "fused_grad_accum": False}, "dp=8,mbs=1,zero=1"),
])
def test_the_launch_file_runs_the_settings_it_was_written_with(tmp_path, framework, kernels, plan):
    spec = _spec(kernels, framework=framework)
    files = launch_files(Plan.parse(plan), resolve(spec))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    first = tmp_path / next(iter(files))
    want = kernels_of(spec, FRAMEWORKS[framework].kernels, "ampere")
    got = kernels_back(first)
    assert got == {k: getattr(want, k) for k in got}
    assert set(got) == set(FIELDS) - {k for k, (values, _) in FRAMEWORKS[framework].kernels.allowed.items()
                                      if len(values) == 1}
    assert read_back(first, spec) == as_run(Plan.parse(plan), FRAMEWORKS[framework], spec)


def test_kernels_default_to_nothing_switched():
    assert Kernels().fused_softmax and Kernels().fused_bias_gelu and Kernels().fused_grad_accum
