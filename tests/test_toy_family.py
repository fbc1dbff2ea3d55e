"""A family added in one place: one `Family` record registered, and the spec types, the graph builder, the
tensor-parallel roles, the pricing, the rules and every framework's launch file know it."""

from __future__ import annotations

from typing import Any

import pytest

from predictor.frameworks import LaunchError
from predictor.frameworks.launch import launch_files
from predictor.graph import cache as graph_cache
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan, plan_errors
from predictor.spec.families import FAMILIES, Family
from predictor.spec.resolver import resolve
from predictor.spec.workload import SpecError, parse_spec


def _toy_config(m: Any, extra: dict[str, Any]) -> Any:
    """Mistral's transformers config (a Llama-shaped decoder with a sliding window) from the spec's dims."""
    import transformers

    return transformers.MistralConfig(vocab_size=m.vocab, hidden_size=m.hidden, intermediate_size=m.ffn_hidden_size,
                                      num_hidden_layers=m.layers, num_attention_heads=m.heads,
                                      num_key_value_heads=m.kv_heads or m.heads, max_position_embeddings=m.seq_len,
                                      **extra)


TOY = Family("toy", "decoder", "MistralForCausalLM", _toy_config, hf_model_type="toy_mistral", gated_ffn=True,
             llama_args=True, qk_norm=True, layout="hf_decoder", launch_names={"torchtitan": None},
             roles={"o_proj": "replicated"}, honours=frozenset({"kv_heads", "ffn_hidden", "kwargs"}))


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Family:
    monkeypatch.setitem(FAMILIES, TOY.name, TOY)
    monkeypatch.setattr(graph_cache, "CACHE_DIR", tmp_path)  # its builder is this file's: keep its graph off the cache
    return TOY


def _spec(framework: str = "megatron") -> Any:
    return parse_spec({"model": {"family": "toy", "hidden": 256, "layers": 4, "heads": 8, "kv_heads": 2,
                                 "seq_len": 512, "vocab": 4096},
                       "training": {"global_batch": 32, "precision": "bf16", "framework": framework},
                       "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}})


def test_an_unregistered_family_is_refused_with_the_known_ones() -> None:
    with pytest.raises(SpecError, match="unknown family; did you mean 'llama'"):
        parse_spec({"model": {"family": "lama", "hidden": 64, "layers": 2, "heads": 4, "seq_len": 64, "vocab": 100},
                    "training": {"global_batch": 8}, "cluster": {"device": "h100"}})


def test_a_registered_family_is_built_traced_priced_and_launched(toy: Family) -> None:
    spec = _spec()
    assert spec.model.ffn_hidden_size == 768  # the gated convention: 8h/3 rounded up to 256
    graph = graph_for(spec.model)
    kinds = {n.kind for n in graph.nodes}
    assert {"embedding", "attention", "linear", "rmsnorm", "loss"} <= kinds and graph.num_blocks == 4
    roles = {n.name.rpartition(".")[2]: n.tp for n in graph.nodes if n.kind == "linear"}
    assert roles["q_proj"] == "column" and roles["o_proj"] == "replicated"  # its own role beside the common table
    plans = [Plan(tp=2, dp=4, mbs=1), Plan(tp=1, dp=4, cp=2, mbs=1)]
    assert all(not plan_errors(p, spec) for p in plans)  # a decoder: context parallelism splits its sequence
    table = AnalyticalPredictor().predict_table(spec, graph, plans)
    assert (table.iter_time_s > 0).all()
    args = launch_files(plans[0], resolve(spec))["megatron_args.txt"]
    assert "--swiglu" in args and "--qk-layernorm" in args
    with pytest.raises(LaunchError, match="torchtitan ships no toy model"):
        launch_files(plans[0], resolve(_spec("torchtitan")))


def test_an_hf_config_of_its_model_type_is_the_family(toy: Family) -> None:
    spec = parse_spec({"model": {"hf_config": {"model_type": "toy_mistral", "hidden_size": 128,
                                               "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512,
                                               "max_position_embeddings": 256}},
                       "training": {"global_batch": 8}, "cluster": {"device": "h100"}})
    assert spec.model.family == "toy" and spec.model.decoder
