"""ScaleDL's companion: workloads of a model family the training data lacks go to a model with operator costs.

The routing's cross-validation is read off its two parts' (bench/results/ensemble_cv.txt, the rule at the
top), which holds only if each part predicts exactly as it would trained alone: these tests say it does.
"""

from __future__ import annotations

import numpy as np
import pytest

from predictor.data.evaluate import load_profile_dataset, predict_samples, subset
from predictor.graph.cache import graph_for
from predictor.models.features import TrainingData
from predictor.models.scaledl import ScaleDLPredictor

SETTINGS = dict(epochs=10, seed=4)


@pytest.fixture(scope="module")
def data() -> tuple[TrainingData, list, list]:
    """(training data: 24 BERT configurations, 8 held-out BERT iterations, 8 GPT-2 iterations, a family not trained on)."""
    measured = load_profile_dataset(families=("bert", "gpt2"))
    bert_ids = sorted({s.config_id for s in measured.samples if s.spec.model.family == "bert"})
    train = subset(measured, lambda s: s.config_id in set(bert_ids[:24]))
    seen = [s for s in measured.samples if s.config_id in set(bert_ids[24:32])]
    unseen = [s for s in measured.samples if s.spec.model.family == "gpt2"][:8]
    return train, seen, unseen


@pytest.fixture(scope="module")
def routed(data) -> ScaleDLPredictor:
    return ScaleDLPredictor(**SETTINGS).fit(data[0])


def test_a_trained_family_gets_three_networks_and_an_unseen_one_the_operator_cost_model(data, routed) -> None:
    train, seen, unseen = data
    assert routed.config["ensemble"] == 3 and routed.companion is not None
    assert routed.companion.config["op_costs"] and routed.companion.config["ensemble"] == 1
    assert routed.companion.layerwise.models[("cpu", "linear")] is routed.layerwise.models[("cpu", "linear")]
    assert routed.companion.layerwise.models[("cpu", "activation")] is not routed.layerwise.models[("cpu", "activation")]
    alone_seen = ScaleDLPredictor(**SETTINGS, unseen=None).fit(train)
    alone_unseen = ScaleDLPredictor(**SETTINGS, op_costs=True, ensemble=1, unseen=None).fit(train)
    np.testing.assert_array_equal(predict_samples(routed, seen)[0], predict_samples(alone_seen, seen)[0])
    np.testing.assert_array_equal(predict_samples(routed, unseen)[0], predict_samples(alone_unseen, unseen)[0])
    assert not np.array_equal(predict_samples(routed, unseen)[0], predict_samples(alone_seen, unseen)[0])
    pred = routed.predict(unseen[0].spec, graph_for(unseen[0].spec.model), [unseen[0].plan])[0]
    assert "companion" in pred.extra["model"]
    assert any(w.startswith("family=gpt2") for w in pred.extra["outside_training"])  # still outside, and says so


def test_the_companion_survives_a_checkpoint_and_an_update(data, routed, tmp_path) -> None:
    train, seen, unseen = data
    routed.save(tmp_path / "m.pt")
    loaded = ScaleDLPredictor.load(tmp_path / "m.pt")
    assert loaded.companion.layerwise.models[("cpu", "linear")] is loaded.layerwise.models[("cpu", "linear")]  # stored once
    for samples in (seen, unseen):
        np.testing.assert_array_equal(predict_samples(loaded, samples)[0], predict_samples(routed, samples)[0])
    loaded.update(train, epochs=5)
    assert len(loaded.companion.provenance["updates"]) == 1  # `scaledl adapt` fine-tunes the companion too


def test_no_companion_without_layer_timings_or_when_asked_for_none(data) -> None:
    train = data[0]
    without_layers = TrainingData(train.samples[:30])  # like a vTrain CSV: whole iterations only
    assert ScaleDLPredictor(**SETTINGS, ensemble=1).fit(without_layers).companion is None
    assert ScaleDLPredictor(**SETTINGS, ensemble=1, unseen=None).fit(train).companion is None
