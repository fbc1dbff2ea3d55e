"""Checkpoints pickle trees without their training statistics: predictions must not change."""

import lzma
import pickle

import numpy as np
from sklearn.ensemble import RandomForestRegressor

from predictor.models.compact_pickle import TRAINING_STATISTICS, dumps_for_prediction


def _forest() -> tuple[RandomForestRegressor, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 5))
    y = np.sin(x[:, 0]) + x[:, 1] * x[:, 2] + 0.1 * rng.normal(size=400)
    return RandomForestRegressor(n_estimators=20, random_state=0).fit(x, y), rng.normal(size=(200, 5))


def test_prediction_only_pickle_predicts_bitwise_the_same_and_is_smaller():
    forest, x = _forest()
    shared = {"a": forest, "b": forest}  # one forest reached twice is stored once, as pickle does
    compact = dumps_for_prediction(shared)
    loaded = pickle.loads(compact)
    assert loaded["a"] is loaded["b"]
    assert np.array_equal(loaded["a"].predict(x), forest.predict(x))
    assert len(lzma.compress(compact)) < 0.9 * len(lzma.compress(pickle.dumps(shared)))
    assert dumps_for_prediction(shared) == compact  # the same bytes every time (no uninitialised padding)


def test_only_the_pickled_form_loses_the_statistics():
    forest, _ = _forest()
    loaded = pickle.loads(dumps_for_prediction(forest))
    for field in TRAINING_STATISTICS:
        assert not loaded.estimators_[0].tree_.__getstate__()["nodes"][field].any()
        assert forest.estimators_[0].tree_.__getstate__()["nodes"][field].any()  # the live model keeps them
