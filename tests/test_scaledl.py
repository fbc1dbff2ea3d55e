"""ScaleDL predictor: contract, determinism, learning on real measurements, checkpoint round trip, auto pick."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
import torch

from predictor.costs.prediction import MEMORY_PARTS, TIME_PARTS
from predictor.data.evaluate import mre, predict_samples
from predictor.models.analytical import AnalyticalPredictor, kernel_model_config
from predictor.models.features import TrainingData, graph_of, overhead_seconds
from predictor.models.registry import checkpoint_path, load_predictor
from predictor.models.roofline import AnalyticalConfig
from predictor.models.scaledl import ScaleDLPredictor
from predictor.spec.resolver import resolve
from tests.vtrain_rows import a100_rows


@pytest.fixture(scope="module")
def vtrain_slice():
    """Real A100 measurements (vTrain single-node): hidden 1024, 12 layers to train, 24 layers held out."""
    rows = a100_rows()
    train = [s for s in rows if s.spec.model.layers == 12]
    test = [s for s in rows if s.spec.model.layers == 24]
    return train, test


@pytest.fixture(scope="module")
def fitted(vtrain_slice):
    train, _ = vtrain_slice
    return ScaleDLPredictor(epochs=120, seed=3).fit(TrainingData(train, provenance={"source": "vtrain slice"}))


def test_contract_one_prediction_per_plan_with_consistent_breakdowns(fitted, vtrain_slice):
    _, test = vtrain_slice
    spec = test[0].spec
    plans = [s.plan for s in test if s.spec == spec][:7]
    preds = fitted.predict(spec, graph_of(spec), plans)
    assert len(preds) == len(plans)
    for p in preds:
        assert set(p.breakdown) == set(TIME_PARTS)
        assert p.iter_time_s == pytest.approx(sum(p.breakdown.values()))
        assert p.iter_time_s > 0 and all(v >= 0 for v in p.breakdown.values())
        assert set(p.memory_breakdown) == set(MEMORY_PARTS)
        assert p.peak_memory_gib == pytest.approx(max(p.memory_per_stage_gib))
        assert set(p.extra["factors"]) == {"compute", "dp_comm", "tp_comm", "pp", "optimizer", "overhead"}
    assert fitted.predict(spec, graph_of(spec), []) == []


def test_training_beats_the_untrained_composition_on_held_out_real_rows(fitted, vtrain_slice):
    train, test = vtrain_slice
    true = np.asarray([s.iter_time_s for s in test])
    learned, _ = predict_samples(fitted, test)
    plain = ScaleDLPredictor(use_gnn=False, use_global=False).fit(TrainingData(train))  # factors all 1
    untrained, _ = predict_samples(plain, test)
    # ScaleDL composes the kernel model: the constants the analytical model prices these rows with (DeepSpeed's on
    # Ampere), pipeline p2p at its α-β time.
    kernel_model = replace(kernel_model_config(resolve(train[0].spec)), step_p2p=False)
    analytical, _ = predict_samples(AnalyticalPredictor(kernel_model), test)
    # No layer data for A100 and no dispatch term on a GPU: the plain sum is the analytical time.
    assert all(overhead_seconds(graph_of(s.spec), s.plan, s.spec) == 0 for s in test)
    np.testing.assert_allclose(untrained, analytical, rtol=1e-9)
    first_principles, _ = predict_samples(AnalyticalPredictor(AnalyticalConfig()), test)
    assert mre(learned, true) < mre(analytical, true) < 0.6 * mre(first_principles, true)


def test_same_seed_same_model(vtrain_slice):
    train, test = vtrain_slice
    a = ScaleDLPredictor(epochs=30, seed=7).fit(TrainingData(train[:60]))
    b = ScaleDLPredictor(epochs=30, seed=7).fit(TrainingData(train[:60]))
    np.testing.assert_array_equal(predict_samples(a, test[:20])[0], predict_samples(b, test[:20])[0])


def test_checkpoint_round_trip_predicts_identically(fitted, vtrain_slice, tmp_path):
    _, test = vtrain_slice
    path = tmp_path / "scaledl.pt"
    fitted.save(path)
    loaded = ScaleDLPredictor.load(path)
    np.testing.assert_array_equal(predict_samples(fitted, test)[0], predict_samples(loaded, test)[0])
    assert loaded.provenance["source"] == "vtrain slice" and loaded.provenance["samples"] > 0
    assert loaded.domain == fitted.domain and loaded.domain.ranges["blocks"] == [12, 12]
    assert path.stat().st_size < 3 * 1024**2


def test_ensemble_factors_are_the_geometric_mean_of_its_members(vtrain_slice):
    train, test = vtrain_slice
    ens = ScaleDLPredictor(epochs=30, seed=1, ensemble=3).fit(TrainingData(train[:60]))
    assert len(ens.net.members) == 3
    spec = test[0].spec
    plans = [s.plan for s in test if s.spec == spec][:5]
    comp = ens._compose(spec, graph_of(spec), plans)
    emb = torch.stack(ens._per_key(graph_of(spec), comp))[torch.as_tensor(comp.key_of)]
    z = ens._z(comp.z)
    with torch.no_grad():
        members = torch.stack([m.factors(e, z) for m, e in zip(ens.net.members, emb.chunk(3, dim=1))])
        assert not torch.allclose(members[0], members[1])  # trained apart, they differ
        np.testing.assert_allclose(ens.net.factors(emb, z), members.log().mean(0).exp(), rtol=1e-5)
    got = [p.extra["factors"]["compute"] for p in ens.predict(spec, graph_of(spec), plans)]
    np.testing.assert_allclose(got, members[:, :, 0].log().mean(0).exp(), rtol=1e-5)


def test_predictions_outside_the_training_data_say_so(fitted, vtrain_slice):
    train, test = vtrain_slice
    inside = fitted.predict(train[0].spec, graph_of(train[0].spec), [train[0].plan])[0]
    assert "outside_training" not in inside.extra
    outside = fitted.predict(test[0].spec, graph_of(test[0].spec), [test[0].plan])[0]
    assert "blocks 24 (trained 12)" in outside.extra["outside_training"]


def test_unfitted_and_missing_checkpoint_errors(tmp_path, vtrain_slice):
    _, test = vtrain_slice
    with pytest.raises(RuntimeError, match="not fitted"):
        ScaleDLPredictor().predict(test[0].spec, None, [test[0].plan])  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="scaledl train"):
        ScaleDLPredictor.load(tmp_path / "nope.pt")
    with pytest.raises(ValueError, match="samples is empty"):
        ScaleDLPredictor().fit(TrainingData([]))


def test_auto_picks_the_shipped_cpu_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEDL_CACHE", str(tmp_path))  # no checkpoint adapted to any hardware
    path = checkpoint_path("cpu")
    assert path.is_file(), "the CPU checkpoint is shipped in predictor/checkpoints/"
    predictor, label = load_predictor("auto", "cpu", "Some CPU")
    assert isinstance(predictor, ScaleDLPredictor)
    assert path.name in label


def test_auto_prefers_the_checkpoint_adapted_to_the_hardware(tmp_path, monkeypatch):
    """`scaledl adapt` keeps its checkpoint in the user's cache under the CPU model's name; `auto` takes it
    on that hardware only."""
    import shutil

    from predictor.models.registry import adapted_checkpoint_path

    monkeypatch.setenv("SCALEDL_CACHE", str(tmp_path))
    adapted = adapted_checkpoint_path("cpu", "Some CPU (R) 9000")
    assert adapted.parent == tmp_path / "checkpoints" and adapted.name == "scaledl-cpu-some-cpu-r-9000.pt"
    adapted.parent.mkdir()
    shutil.copy(checkpoint_path("cpu"), adapted)
    assert load_predictor("auto", "cpu", "Some CPU (R) 9000")[1] == f"scaledl ({adapted.name}, adapted to this hardware)"
    assert checkpoint_path("cpu").name in load_predictor("auto", "cpu", "Other CPU")[1]
    assert checkpoint_path("cpu").name in load_predictor("auto", "cpu")[1]  # hardware unknown: the shipped one


def test_checkpoint_from_other_features_is_refused(fitted, tmp_path):
    import torch

    path = tmp_path / "old.pt"
    fitted.save(path)
    state = torch.load(path, weights_only=False)
    state["features"] = dict(state["features"], version=state["features"]["version"] - 1)
    torch.save(state, path)
    with pytest.raises(ValueError, match="other features.*scaledl train"):
        ScaleDLPredictor.load(path)


def test_update_fine_tunes_towards_new_measurements(fitted, vtrain_slice):
    """Active learning: a checkpoint trained on 12-layer models, updated with half of the 24-layer
    runs, gets better on the other half; its z range grows and the update is recorded."""
    _, test = vtrain_slice
    new, held = test[::2], test[1::2]
    true = np.asarray([s.iter_time_s for s in held])
    before = mre(predict_samples(fitted, held)[0], true)
    import copy

    updated = copy.deepcopy(fitted).update(TrainingData(new, provenance={"source": "validation runs"}), epochs=60)
    after = mre(predict_samples(updated, held)[0], true)
    assert after < before
    assert updated.provenance["updates"][-1]["source"] == "validation runs"
    assert np.all(updated.z_min <= fitted.z_min) and np.all(updated.z_max >= fitted.z_max)
    assert updated.domain.ranges["blocks"] == [12, 24]  # the runs it was updated with are now inside
    with pytest.raises(RuntimeError, match="fitted"):
        ScaleDLPredictor().update(TrainingData(new))


def test_train_command_records_held_out_accuracy_and_update_keeps_or_swaps(tmp_path, capsys):
    """`scaledl train` on a vTrain single-node CSV slice: the checkpoint carries its held-out error,
    which `measured_accuracy` (what reports show) returns; `--update` writes a checkpoint."""
    import pandas as pd

    from orchestrator.cli import main
    from predictor.models.registry import measured_accuracy
    from tests.vtrain_rows import SINGLE

    a100_rows()  # skips when shared/ is absent
    frame = pd.read_csv(SINGLE, encoding="utf-8-sig")
    csv = tmp_path / "slice.csv"
    frame[frame["hidden size"] == 1024].to_csv(csv, index=False)
    ckpt = tmp_path / "a.pt"
    assert main(["train", "--data", str(csv), "--out", str(ckpt), "--epochs", "20", "--holdout", "0.25"]) == 0
    model = ScaleDLPredictor.load(ckpt)
    acc = measured_accuracy(model, "a100-80gb", "deepspeed")
    assert acc is not None and acc["rows"] > 0 and 0 < acc["mape_pct"] < 100 and "held-out" in acc["source"]
    capsys.readouterr()
    assert main(["train", "--data", str(csv), "--update", str(ckpt), "--out", str(tmp_path / "b.pt"),
                 "--epochs", "5", "--holdout", "0.25"]) == 0
    # b.pt is written exactly when the update did not make the held-out error worse
    after, before = map(float, re.search(r"held-out error: ([\d.]+)% .*before the update: ([\d.]+)%",
                                         capsys.readouterr().out).groups())
    assert (tmp_path / "b.pt").is_file() == (after <= before)
    assert main(["train", "--data", str(csv), "--holdout", "1.5", "--out", str(ckpt)]) == 2


@pytest.mark.slow
def test_train_command_calibrates_gpu_data_and_refuses_cpu_data(tmp_path, capsys):
    """`--calibrate` fits the fixed costs into the checkpoint; a measured CPU dataset is refused with the fix,
    and so is `--op-costs` on a CSV without layer timings."""
    import pandas as pd

    from orchestrator.cli import main
    from tests.vtrain_rows import SINGLE

    a100_rows()  # skips when shared/ is absent
    frame = pd.read_csv(SINGLE, encoding="utf-8-sig")
    csv = tmp_path / "slice.csv"
    frame[(frame["hidden size"] == 1024) & (frame["# layers"] == 12)].to_csv(csv, index=False)
    ckpt = tmp_path / "calibrated.pt"
    assert main(["train", "--data", str(csv), "--out", str(ckpt), "--epochs", "5", "--calibrate"]) == 0
    assert "fitted fixed costs: host_op_s" in capsys.readouterr().out
    model = ScaleDLPredictor.load(ckpt)
    assert model.config["calibrate"] and model.fixed_costs_s["host_op_s"] != AnalyticalConfig.host_op_s  # the fitted base kept
    assert main(["train", "--data", "predictor/data/cpu", "--out", str(tmp_path / "cpu.pt"), "--calibrate"]) == 2
    assert "cpu is a measured device" in capsys.readouterr().err
    assert main(["train", "--data", str(csv), "--update", str(ckpt), "--calibrate"]) == 2
    assert main(["train", "--data", str(csv), "--out", str(tmp_path / "ops.pt"), "--op-costs"]) == 2
    assert "has none" in capsys.readouterr().err and not (tmp_path / "ops.pt").exists()


def test_layer_timings_rescale_a_host_bound_gpu_stage_without_counting_the_host_twice():
    """On a GPU the analytical compute of a host-bound stage is the host's pace: the layer-wise ratio
    rescales the kernels under it, and the host keeps its floor. On a CPU the isolated layer timings carry
    their calls' host work: the ratio rescales the kernels and replaces the analytical host time."""
    from predictor.models.composition import compute_scale

    def scale(compute: float, kernels: float, ratio: float, synchronous: bool, host_once: bool = True) -> float:
        return float(compute_scale(np.array([compute]), np.array([kernels]), np.array([ratio]), synchronous, host_once)[0])

    assert scale(10.0, 4.0, 2.0, synchronous=False) == pytest.approx(1.0)  # kernels 8 s: still host-bound
    assert scale(10.0, 4.0, 3.0, synchronous=False) == pytest.approx(1.2)  # kernels 12 s exceed the host
    assert scale(4.0, 4.0, 0.5, synchronous=False) == pytest.approx(0.5)  # kernel-bound: the ratio
    assert scale(10.0, 4.0, 2.0, synchronous=True) == pytest.approx(0.8)  # 4 s of kernels x 2 = 8 s
    assert scale(10.0, 4.0, 2.0, synchronous=True, host_once=False) == 2.0  # older checkpoints
    assert scale(0.0, 0.0, 2.0, synchronous=False) == 2.0  # nothing computed: the ratio as it is


def test_small_data_chooses_its_epochs_by_cross_validation_and_may_keep_the_composition(vtrain_slice, monkeypatch):
    """Below MIN_VALIDATION samples the epoch count is cross-validated, none included: iterations that are
    the plain composition times noise unrelated to the plans are often left exactly uncorrected, and never
    trained for long (3 folds of 45 rows are a noisy judge: over noise draws 0-13, 8 kept the composition and
    the others stopped at 5 or 15 of 60 epochs); real ones, which the composition misprices, are corrected."""
    from predictor.models import gnn_training

    train, test = vtrain_slice
    small = train[::4]
    assert len(small) < gnn_training.MIN_VALIDATION
    chosen: list[int] = []
    cv_epochs = gnn_training.cv_epochs
    monkeypatch.setattr(gnn_training, "cv_epochs", lambda *a: chosen.append(cv_epochs(*a)) or chosen[-1])
    # what ScaleDL composes, before any calibration: the kernel model (DeepSpeed's constants on Ampere)
    kernel_model = AnalyticalPredictor(replace(kernel_model_config(resolve(small[0].spec)), step_p2p=False))
    priced, _ = predict_samples(kernel_model, small)  # A100 has no layer timings: plain sum = analytical
    composition, _ = predict_samples(kernel_model, test)
    kept = 0
    for draw in range(6):
        noise = np.random.default_rng(draw).normal(0.0, 0.2, len(small))
        noisy = [replace(s, iter_time_s=float(t)) for s, t in zip(small, priced * np.exp(noise - noise.mean()))]
        model = ScaleDLPredictor(epochs=60, seed=1, ensemble=1).fit(TrainingData(noisy))  # one network's own choice
        if chosen[-1] == 0:
            np.testing.assert_allclose(predict_samples(model, test)[0], composition, rtol=1e-9)
            kept += 1
    assert kept >= 3 and max(chosen) <= 30
    learned = ScaleDLPredictor(epochs=60, seed=1).fit(TrainingData(small))
    true = np.asarray([s.iter_time_s for s in small])
    assert mre(predict_samples(learned, small)[0], true) < mre(priced, true)


@pytest.mark.slow
def test_a_checkpoint_fitted_counting_the_host_twice_keeps_its_composition(tmp_path):
    """Real CPU rows: a predictor fitted to the composition that counts the host twice (host_once=False) saves and
    loads with that composition and predicts as it did; counting it once prices every plan lower."""
    from predictor.data.evaluate import CPU_DATASET, load_profile_dataset, subset

    data = load_profile_dataset(CPU_DATASET, families=("bert",))
    train = subset(data, lambda s: s.config_id < "4")
    test = [s for s in data.samples if s.config_id >= "f"][:15]
    before = ScaleDLPredictor(host_once=False, epochs=20, seed=0).fit(train)
    path = tmp_path / "before.pt"
    before.save(path)
    old = ScaleDLPredictor.load(path)
    assert old.config["host_once"] is False
    np.testing.assert_array_equal(predict_samples(before, test)[0], predict_samples(old, test)[0])
    now = ScaleDLPredictor(use_gnn=False, use_global=False).fit(train)  # the plain composition, host once
    twice = ScaleDLPredictor(use_gnn=False, use_global=False, host_once=False).fit(train)
    assert np.all(predict_samples(now, test)[0] < predict_samples(twice, test)[0])


@pytest.mark.slow
def test_the_cpu_checkpoint_on_another_cpu_model_says_so_and_fine_tuning_fits_it():
    """Real runs of an AMD EPYC priced with its own profile (predictor/data/cpu-amd-epyc): the shipped
    checkpoint, trained on an Intel Xeon's data, flags them as other hardware, and fine-tuning it on 40 of
    them (as `scaledl train --update`) cuts its error on the others by more than half."""
    from predictor.data.evaluate import holdout_split, load_profile_dataset, subset

    data = load_profile_dataset("predictor/data/cpu-amd-epyc", designs=None, with_layers=False)
    pool, test = holdout_split(data, 0.25, seed=0)
    true = np.asarray([s.iter_time_s for s in test])
    shipped = ScaleDLPredictor.load(checkpoint_path("cpu"))
    pred = shipped.predict(test[0].spec, graph_of(test[0].spec), [test[0].plan])[0]
    assert any(w.startswith("hardware=AMD EPYC (trained Intel") for w in pred.extra["outside_training"])
    some = {s.config_id for s in pool.samples[:40]}
    tuned = ScaleDLPredictor.load(checkpoint_path("cpu")).update(subset(pool, lambda s: s.config_id in some))
    assert mre(predict_samples(tuned, test)[0], true) < 0.5 * mre(predict_samples(shipped, test)[0], true)
