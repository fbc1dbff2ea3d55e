"""Evaluation protocols: splits never leak test configurations, metrics, table layout."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictor.data.evaluate import (format_average, format_table, in_domain_splits, mre, out_of_domain_splits,
                                overall, rmse_ms, spec_for)
from predictor.models.features import Sample, TrainingData
from predictor.models.records import LayerObs
from predictor.plan import Plan

MODEL = '{"family": "bert", "hidden": 64, "layers": 2, "heads": 2, "seq_len": 32, "vocab": 1000}'


def _data(per_family: dict[str, int]) -> TrainingData:
    samples, layers = [], []
    for fam, n in per_family.items():
        for i in range(n):
            spec = spec_for(MODEL, 1 + i % 4, Plan())
            s = Sample(spec, Plan(), 0.1 + i * 1e-3, model=fam, config_id=f"{fam}-{i}")
            samples.append(s)
            layers.append(LayerObs(spec, None, 0, None, 1e-3, 2e-3))  # type: ignore[arg-type]
    return TrainingData(samples, layers, {"dataset": "synthetic ids"})


def test_in_domain_split_is_seeded_disjoint_and_160_40():
    data = _data({"bert": 200, "gpt2": 50})
    splits = {s.model: s for s in in_domain_splits(data, 160, seed=4)}
    bert = splits["bert"]
    train_ids = {s.config_id for s in bert.train.samples}
    assert len(train_ids) == 160 and len(bert.test) == 40
    assert train_ids.isdisjoint({s.config_id for s in bert.test})
    assert all(s.model == "bert" for s in bert.train.samples)
    # the layer timings that come along are exactly the training configurations' own
    assert {id(o.spec) for o in bert.train.layers} == {id(s.spec) for s in bert.train.samples}
    assert len(splits["gpt2"].train.samples) == 40 and len(splits["gpt2"].test) == 10  # 80 % when fewer than 200
    again = {s.model: s for s in in_domain_splits(data, 160, seed=4)}
    assert [s.config_id for s in again["bert"].test] == [s.config_id for s in bert.test]
    other = {s.model: s for s in in_domain_splits(data, 160, seed=5)}
    assert [s.config_id for s in other["bert"].test] != [s.config_id for s in bert.test]


def test_out_of_domain_leaves_the_architecture_out():
    data = _data({"bert": 10, "gpt2": 8, "vit": 6})
    for split in out_of_domain_splits(data):
        assert all(s.model != split.model for s in split.train.samples)
        assert all(s.model == split.model for s in split.test)
        assert len(split.train.samples) + len(split.test) == 24


def test_metrics():
    true = np.array([1.0, 2.0, 4.0])
    pred = np.array([1.1, 1.8, 4.0])
    assert mre(pred, true) == pytest.approx((10 + 10 + 0) / 3)
    assert rmse_ms(pred, true) == pytest.approx(np.sqrt((0.01 + 0.04) / 3) * 1000)


def test_tables_pool_overall_and_list_every_model():
    rows = []
    for proto in ("id", "ood"):
        for method, err in (("scaledl", 0.05), ("rf", 0.3)):
            for model, true in (("bert", [1.0, 2.0]), ("gpt2", [0.5, 0.25])):
                rows.append({"protocol": proto, "method": method, "model": model, "mre": 100 * err,
                             "rmse_ms": 0.0, "mem_mre": np.nan, "pred": [t * (1 + err) for t in true], "true": true})
    frame = pd.DataFrame(rows)
    summary = overall(frame[frame.protocol == "id"])
    assert summary.set_index("method").loc["scaledl", "mre"] == pytest.approx(5.0)
    text = format_table(frame, "id", "Table I")
    assert "Overall" in text and "bert" in text and "gpt2" in text and "5.00 /" in text and "30.00 /" in text
    average = format_average(frame, "id", "ID average").splitlines()
    assert average[0] == "ID average"
    assert [line.split()[:2] for line in average[2:]] == [["scaledl", "5.00"], ["rf", "30.00"]]


def test_shipped_gpu_dataset_loads_as_its_device_and_precision():
    from predictor.data.evaluate import load_profile_dataset

    data = load_profile_dataset("predictor/data/h200", with_layers=False)
    assert len(data.samples) == 197 and {s.model for s in data.samples} == {"t5", "gpt2", "bert", "vit", "deit"}
    assert {(s.spec.cluster.device, s.spec.training.precision) for s in data.samples} == {("h200", "bf16")}
    assert data.provenance["device"] == ["cuda:NVIDIA H200"]
    cpu = load_profile_dataset(families=("bert",), with_layers=False)
    assert {(s.spec.cluster.device, s.spec.training.precision) for s in cpu.samples} == {("cpu", "fp32")}


def test_seed_spread_reports_mean_and_spread_of_each_methods_pooled_error():
    from predictor.data.evaluate import format_seed_spread

    def run(scale: float) -> pd.DataFrame:
        return pd.DataFrame([{"protocol": "id", "method": "m", "model": "bert", "mre": 0.0, "rmse_ms": 0.0,
                              "mem_mre": float("nan"), "pred": [1.0 * scale, 2.0], "true": [1.0, 2.0]}])

    text = format_seed_spread({0: run(1.1), 1: run(1.3)})  # pooled MRE 5 % and 15 %
    line = [ln for ln in text.splitlines() if ln.startswith("id")][0]
    assert "10.00 ± 5.00" in line and "5.00 / " in line and "15.00 / " in line
    assert "seeds 0, 1" in text
