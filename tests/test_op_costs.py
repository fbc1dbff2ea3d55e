"""Operator costs: the graph records what each layer runs, and non-GEMM layers are priced by it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from predictor.data.evaluate import load_profile_dataset, predict_samples, subset
from predictor.graph.cache import graph_for
from predictor.models.features import TrainingData
from predictor.models.layerwise import LayerwiseModel, analytical_layer_time
from predictor.models.op_costs import OpCosts, OpRow, is_gemm
from predictor.models.scaledl import ScaleDLPredictor
from predictor.spec.resolver import resolve
from predictor.spec.workload import ModelSpec
from tests.gpt_graph import gpt_graph

SMALL = dict(hidden=64, layers=2, heads=4)


def _first(graph, kind):
    return next(n for n in graph.nodes if n.kind == kind)


def test_graph_records_each_layers_forward_operators() -> None:
    gpt2 = graph_for(ModelSpec(family="gpt2", seq_len=32, vocab=128, **SMALL))
    bert = graph_for(ModelSpec(family="bert", seq_len=32, vocab=128, **SMALL))
    vit = graph_for(ModelSpec(family="vit", image_size=32, patch_size=16, **SMALL))
    tanh_gelu, gelu = _first(gpt2, "activation").ops, _first(bert, "activation").ops
    assert "tanh" in tanh_gelu and sum(calls for calls, _ in tanh_gelu.values()) >= 6  # GPT-2's GELU: a chain
    assert gelu == {"gelu": (1, 2.0 * 32 * 4 * 64)}  # one op, reading and writing seq x 4h elements per sample
    # ViT's dropouts have p = 0 and return their input: recorded apart from real dropouts.
    assert "dropout(p=0)" in _first(vit, "dropout").ops and "dropout" in _first(bert, "dropout").ops
    assert all(n.ops for n in gpt2.nodes if n.kind != "other")


def _with_ops(graph, ops_of: dict[str, dict[str, tuple[int, float]]]):
    return replace(graph, nodes=[replace(n, ops=ops_of.get(n.name, {})) for n in graph.nodes])


def test_fit_recovers_per_call_and_per_element_costs_and_prices_only_non_gemm_layers() -> None:
    graph = _with_ops(gpt_graph(hidden=64, heads=4, seq=32, layers=2, vocab=128), {
        "gelu": {"tanh": (1, 1000.0), "mul": (4, 4000.0)}, "ln1": {"layer_norm": (1, 500.0)},
        "drop1": {"unseen_op": (1, 100.0)}, "qkv": {"linear": (1, 900.0)}})
    true = {"tanh": (20e-6, 3e-9), "mul": (5e-6, 1e-9), "layer_norm": (9e-6, 2e-9)}

    def seconds(node, mbs):
        return sum(true[o][0] * c + true[o][1] * e * mbs for o, (c, e) in node.ops.items())

    nodes = [_first(graph, "activation"), _first(graph, "layernorm")]
    rows = [OpRow(n, mbs, seconds(n, mbs), 2 * seconds(n, mbs)) for n in nodes for mbs in (1, 2, 4, 8, 16)]
    # mul and tanh always run together at fixed shares: only their sum is identifiable, which is what pricing needs
    costs = OpCosts.fit(rows)
    base = np.full((len(graph.nodes), 2), 7.0)
    priced = costs.apply(graph, tp=1, sp=False, heads=4, mbs=3, base=base)
    for name in ("gelu", "ln1"):
        i = next(j for j, n in enumerate(graph.nodes) if n.name == name)
        assert priced[i] == pytest.approx([seconds(graph.nodes[i], 3), 2 * seconds(graph.nodes[i], 3)], rel=1e-3)
    untouched = [j for j, n in enumerate(graph.nodes) if n.name in ("qkv", "drop1", "ln2")]  # GEMM, unseen op, no ops
    np.testing.assert_array_equal(priced[untouched], base[untouched])
    # Under tp the activation (column-sharded) holds half its elements on a rank; the call costs stay.
    i = next(j for j, n in enumerate(graph.nodes) if n.name == "gelu")
    half = costs.apply(graph, tp=2, sp=False, heads=4, mbs=3, base=base)[i, 0]
    calls = true["tanh"][0] + 4 * true["mul"][0]
    assert half - calls == pytest.approx((priced[i, 0] - calls) / 2, rel=1e-3)
    assert OpCosts.fit([OpRow(replace(nodes[0], ops={}), 1, 1e-3, 1e-3)]) is None  # graphs without operators


@pytest.fixture(scope="module")
def bert() -> TrainingData:
    """BERT's measured CPU iterations and layer timings (the shipped dataset)."""
    return load_profile_dataset(families=("bert",))


def test_operator_costs_price_real_non_gemm_layers_closer_than_the_roofline(bert: TrainingData) -> None:
    """Fitted on half of BERT's measured CPU layers, judged on the other half's non-GEMM layers."""
    data = bert
    ids = sorted({s.config_id for s in data.samples})
    fit_ids = set(ids[::2])
    spec_ids = {id(s.spec): s.config_id for s in data.samples}
    fit_on = [o for o in data.layers if spec_ids[id(o.spec)] in fit_ids]
    held = [o for o in data.layers if spec_ids[id(o.spec)] not in fit_ids
            and not is_gemm(o.graph, o.index, o.key.heads)]
    with_ops = LayerwiseModel(analytical_layer_time, resolve, op_costs=True).fit(fit_on)
    assert set(with_ops.op_costs_by_device) == {"cpu"}
    roofline_err, op_err = [], []
    for o in held:
        roofline = analytical_layer_time(resolve(o.spec), o.graph, o.key)[o.index, 0]
        priced = with_ops.op_costs_by_device["cpu"].apply(o.graph, 1, False, o.key.heads, o.key.mbs,
                                               np.full((len(o.graph.nodes), 2), roofline))[o.index, 0]
        roofline_err.append(abs(np.log(roofline / o.fwd_s)))
        op_err.append(abs(np.log(priced / o.fwd_s)))
    assert len(held) > 100
    assert np.median(op_err) < 0.5 * np.median(roofline_err)


def test_a_checkpoint_keeps_its_operator_costs(bert: TrainingData, tmp_path) -> None:
    ids = {s.config_id for s in bert.samples[:40]}
    model = ScaleDLPredictor(op_costs=True, epochs=20, seed=1).fit(subset(bert, lambda s: s.config_id in ids))
    assert set(model.layerwise.op_costs_by_device) == {"cpu"}
    model.save(tmp_path / "m.pt")
    loaded = ScaleDLPredictor.load(tmp_path / "m.pt")
    assert loaded.layerwise.op_costs_by_device["cpu"].ops == model.layerwise.op_costs_by_device["cpu"].ops
    test = bert.samples[40:60]
    np.testing.assert_array_equal(predict_samples(loaded, test)[0], predict_samples(model, test)[0])


@pytest.mark.slow
def test_train_command_fits_operator_costs_into_the_checkpoint(tmp_path, capsys) -> None:
    """`scaledl train --op-costs` prices non-GEMM layers by operators in the checkpoint it writes."""
    from orchestrator.cli import main

    ckpt = tmp_path / "m.pt"
    assert main(["train", "--data", "predictor/data/cpu", "--designs", "doptimal-large", "--out", str(ckpt),
                 "--epochs", "5", "--op-costs"]) == 0
    loaded = ScaleDLPredictor.load(ckpt)
    assert loaded.config["op_costs"] and set(loaded.layerwise.op_costs_by_device) == {"cpu"}
    assert {"layer_norm", "gelu", "tanh"} <= set(loaded.layerwise.op_costs_by_device["cpu"].ops)
    assert main(["train", "--data", "predictor/data/cpu", "--update", str(ckpt), "--op-costs"]) == 2
    assert "--op-costs applies to a new checkpoint" in capsys.readouterr().err
