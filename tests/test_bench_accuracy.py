"""bench.accuracy's check against its record, on a toy table: a MAPE more than TOLERANCE points above the recorded
figure (or a recorded table left unmeasured) fails the run; --record stores the run's figures instead."""

import json

import numpy as np
import pytest

from bench import accuracy
from bench.common import leave_one_group_out, record_constants

MEASURED = np.array([1.0, 2.0, 4.0])


def toy(predicted: list[float], name: str = "toy") -> accuracy.Figures:
    return accuracy.figures(name, MEASURED, np.array(predicted), np.array(["one workload"] * 3), "nothing",
                            sizes=("params", np.array([1e9, 1e9, 2e9])))


def test_a_worse_mape_fails_and_one_within_tolerance_passes():
    recorded = {"toy": accuracy.record_entry(toy([1.1, 2.2, 4.4]))}  # 10 %
    assert recorded["toy"]["mape_pct"] == 10.0
    assert accuracy.regressions([toy([1.1, 2.2, 4.4])], recorded) == []
    assert accuracy.regressions([toy([1.105, 2.21, 4.42])], recorded) == []  # 10.5 %: within the point allowed
    worse = accuracy.regressions([toy([1.12, 2.24, 4.48])], recorded)  # 12 %
    assert len(worse) == 1 and worse[0].startswith("toy: MAPE 12.00 %")
    assert accuracy.regressions([toy([1.1, 2.2, 4.4], "other")], recorded) == ["toy: recorded, not measured by this run"]


def test_ranking_of_one_workload():
    right = toy([1.5, 2.5, 3.5])  # the right order
    assert (right.workloads, right.spearman, right.regret_pct) == (1, pytest.approx(1.0), 0.0)
    reversed_ = toy([3.0, 2.0, 1.0])  # predicts the slowest plan best: it ran 4x the best
    assert reversed_.spearman == pytest.approx(-1.0) and reversed_.regret_pct == pytest.approx(300.0)
    assert reversed_.max_pct == pytest.approx(200.0)


def test_the_run_exits_1_on_a_worse_table(tmp_path, monkeypatch):
    predicted = [1.1, 2.2, 4.4]
    monkeypatch.setattr(accuracy, "SOURCES", (lambda shared: iter([toy(predicted)]),))
    monkeypatch.setattr(accuracy.accuracy_tables, "headline", lambda: [])
    for name in ("RECORD", "REPORT", "DOC", "README"):
        monkeypatch.setattr(accuracy, name, tmp_path / name.lower())
    assert accuracy.main(["--record"]) == 0
    assert json.loads((tmp_path / "record").read_text())["tables"]["toy"]["mape_pct"] == 10.0
    assert "| toy | 3 | 10.0 |" in (tmp_path / "doc").read_text()
    predicted[:] = [1.12, 2.24, 4.48]
    assert accuracy.main([]) == 1
    assert "# WORSE: toy: MAPE 12.00 %" in (tmp_path / "report").read_text()
    assert json.loads((tmp_path / "record").read_text())["tables"]["toy"]["mape_pct"] == 10.0  # the record stays


def test_interval_coverage_per_key_holds_out_each_workload():
    rng = np.random.default_rng(0)
    measured = rng.uniform(1, 2, 40)
    held = [accuracy.HeldOut("a", np.array(["fw/gen"] * 40), measured, measured * rng.uniform(0.9, 1.1, 40),
                             np.arange(40) % 8),
            accuracy.HeldOut("b", np.array(["fw/other"] * 3), MEASURED, MEASURED, np.zeros(3))]
    covered = accuracy.coverage(held)
    assert covered["fw/gen"]["rows"] == 40 and 50 < covered["fw/gen"]["coverage_pct"] < 95
    assert covered["fw/other"] == {"rows": 3, "coverage_pct": None}  # one workload: no interval without it
    accuracy.HELD_OUT.clear()


def test_a_held_out_group_is_predicted_by_the_candidate_the_other_groups_choose():
    measured = np.array([1.0, 1.0, 2.0, 2.0])
    groups = np.array(["a", "a", "b", "b"])
    # Candidate 0 is exact on group a and 50 % off on b; candidate 1 the reverse; candidate 2 is 10 % off everywhere.
    predicted = np.array([[1.0, 1.0, 3.0, 3.0], [1.5, 1.5, 2.0, 2.0], [1.1, 1.1, 2.2, 2.2]])
    choice = leave_one_group_out(predicted, measured, groups)
    assert choice.in_file == 2
    assert choice.without == {"a": 1, "b": 0}
    assert choice.cv.tolist() == [1.5, 1.5, 3.0, 3.0]


def test_recording_one_framework_keeps_the_other_fits(tmp_path):
    """Each calibration script records its own entry of the constants file: a generation fit keeps the per-device fits
    another file chose, a device fit keeps the generation's, and other frameworks are untouched."""
    path = tmp_path / "framework-constants.json"
    record_constants(path, "deepspeed", {"constants": {"call_s": 1e-4}, "generations": ["ampere"]})
    record_constants(path, "megatron", {"constants": {"bf16_gemm_eff_max": 0.45}}, device="b200")
    record_constants(path, "megatron", {"constants": {"gemm_eff_max": 0.65}, "generations": ["hopper"]})
    assert json.loads(path.read_text()) == {
        "deepspeed": {"constants": {"call_s": 1e-4}, "generations": ["ampere"]},
        "megatron": {"constants": {"gemm_eff_max": 0.65}, "generations": ["hopper"],
                     "by_device": {"b200": {"constants": {"bf16_gemm_eff_max": 0.45}}}}}
    record_constants(path, "megatron", {"constants": {"bf16_gemm_eff_max": 0.5}}, device="b200")
    assert json.loads(path.read_text())["megatron"]["constants"] == {"gemm_eff_max": 0.65}
    assert json.loads(path.read_text())["megatron"]["by_device"]["b200"]["constants"] == {"bf16_gemm_eff_max": 0.5}
    assert not list(tmp_path.glob("*.tmp"))


def test_a_bridge_row_is_priced_with_its_recipe_levers():
    """The Megatron-Bridge rows are predicted as their recipes ran: GPT-OSS on H100 recomputes its layernorms and
    expert activations and reduces BF16 gradients (Megatron-Bridge scripts/performance), and those levers lower
    the predicted peak below the bare parallel plan's, where a Qwen3 recipe also keeps BF16 Adam moments."""
    from bench.memory_eval import recipe_workload
    from predictor.data.evaluate import bridge_workload
    from predictor.graph.cache import graph_for
    from predictor.models.analytical import AnalyticalPredictor

    row = {"system": "DGX-H100", "model": "GPT_OSS_120B", "gpus": 64, "precision": "BF16", "gbs": 512, "mbs": 4,
           "seq_len": 4096, "fsdp": 0, "tp": 1, "pp": 4, "cp": 1, "vp": 1, "ep": 8, "ga": 2}
    spec, plan = recipe_workload(row)
    bare = bridge_workload(row)[1]
    assert (plan.recompute, plan.grads, plan.moments) == ("layernorm+moe_act", "bf16", "fp32")
    assert plan.with_(recompute=bare.recompute, grads=bare.grads) == bare
    model = AnalyticalPredictor()
    levered, plain = model.predict(spec, graph_for(spec.model), [plan, bare])
    assert levered.peak_memory_gib < plain.peak_memory_gib
    qwen = recipe_workload({**row, "model": "Qwen3_30B_a3B", "precision": "FP8-CS", "gpus": 16, "pp": 2, "vp": 12,
                            "mbs": 2})[1]
    assert (qwen.recompute, qwen.grads, qwen.moments) == ("none", "bf16", "bf16")


def test_the_readme_accuracy_paragraph_is_the_records(tmp_path) -> None:
    """The README quotes the recorded figures (bench.accuracy writes it with docs/accuracy.md); a stale copy fails."""
    stored = json.loads(accuracy.RECORD.read_text())
    readme = accuracy.README.read_text()
    quoted = readme.split(accuracy.README_START)[1].split(accuracy.README_END)[0]
    assert " ".join(quoted.split()) == accuracy.readme_paragraph(stored["tables"])
    stale = tmp_path / "README.md"
    stale.write_text(readme.replace(quoted, "\nOn all 109 runs it is 9.6 % off.\n"))
    accuracy.write_readme(stored["tables"], stale)
    assert stale.read_text() == readme
