"""The paper's baselines keep the predictor contract and learn from real measurements."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.costs.prediction import TIME_PARTS
from predictor.data.evaluate import mre, predict_samples
from predictor.models.baselines import BiRNN, MLPAcc, RFHyperParams
from predictor.models.features import TrainingData, graph_of
from tests.vtrain_rows import a100_rows


@pytest.fixture(scope="module")
def rows():
    """Real A100 rows (vTrain single-node), hidden 1024, 12 and 24 layers, shuffled with a seed."""
    data = a100_rows()
    order = np.random.default_rng(0).permutation(len(data))
    return [data[i] for i in order]


@pytest.mark.parametrize("make", [lambda: RFHyperParams(seed=1), lambda: MLPAcc(epochs=60, seed=1),
                                  lambda: BiRNN(epochs=60, seed=1)], ids=["rf", "mlp-acc", "birnn"])
def test_baseline_contract_learning_and_determinism(make, rows):
    train, test = rows[:150], rows[150:250]
    true = np.asarray([s.iter_time_s for s in test])
    model = make().fit(TrainingData(train))
    pred, mem = predict_samples(model, test)
    assert np.all(np.isfinite(pred)) and np.all(pred > 0) and np.all(mem > 0)
    # Learned: far better than predicting the training mean for every row.
    mean_only = np.full_like(true, np.mean([s.iter_time_s for s in train]))
    assert mre(pred, true) < 0.5 * mre(mean_only, true)
    again, _ = predict_samples(make().fit(TrainingData(train)), test)
    np.testing.assert_array_equal(pred, again)
    spec = test[0].spec
    one = model.predict(spec, graph_of(spec), [test[0].plan])[0]
    assert set(one.breakdown) == set(TIME_PARTS) and one.iter_time_s == pytest.approx(sum(one.breakdown.values()))
    assert one.extra["memory_from"] == "analytical"


def test_sequence_baseline_must_be_fitted(rows):
    with pytest.raises(RuntimeError, match="not fitted"):
        BiRNN().predict(rows[0].spec, graph_of(rows[0].spec), [rows[0].plan])
