"""`scaledl predict` end to end through the real CLI entry point (real spec files, real graph)."""

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from predictor.costs.prediction import TIME_PARTS

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

SPEC = """\
model:
  family: gpt
  hidden: 512
  layers: 4
  heads: 8
  seq_len: 256
  vocab: 50304
training:
  global_batch: 32
  precision: bf16
cluster:
  device: a100-80gb
  nodes: 1
  gpus_per_node: 8
"""


@pytest.fixture()
def spec_path(tmp_path):
    path = tmp_path / "gpt.yaml"
    path.write_text(SPEC)
    return str(path)


def _run(capsys, *argv):
    code = main(["predict", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_single_plan_is_one_object(spec_path, capsys):
    code, out, _ = _run(capsys, spec_path, "--plan", "dp=2,tp=2,pp=2,mbs=2,recompute=full", "--json",
                        "--predictor", "analytical")
    assert code == 0
    obj = json.loads(out)
    assert {"iter_time_s", "breakdown", "peak_memory_gib", "memory_per_stage_gib", "memory_breakdown",
            "tflops_per_gpu", "mfu", "predictor", "plan", "device"} <= set(obj)
    assert obj["predictor"] == "analytical" and obj["device"] == "a100-80gb"
    assert obj["plan"].startswith("dp=2,tp=2,pp=2,mbs=2,zero=0,recompute=full")
    assert set(obj["breakdown"]) == set(TIME_PARTS)
    assert sum(obj["breakdown"].values()) == pytest.approx(obj["iter_time_s"], rel=0.01)
    assert len(obj["memory_per_stage_gib"]) == 2


def test_many_plans_array_in_order_with_errors_in_place(spec_path, tmp_path, capsys):
    plans = tmp_path / "plans.txt"
    plans.write_text("# candidates\ndp=8,mbs=1\n\ndp=3\ndp=4,tp=2,sp=true  # with sequence parallelism\n")
    code, out, err = _run(capsys, spec_path, "--plan", "dp=1,tp=8", "--plans-file", str(plans), "--json",
                          "--predictor", "analytical")
    assert code == 0
    arr = json.loads(out)
    assert [("error" in o) for o in arr] == [False, False, True, False]
    assert arr[0]["plan"].startswith("dp=1,tp=8") and arr[3]["plan"].startswith("dp=4,tp=2")
    assert "cluster has 8 GPUs" in arr[2]["error"] and arr[2]["plan"] == "dp=3"
    assert "invalid plan 'dp=3'" in err


def test_table_output(spec_path, capsys):
    code, out, _ = _run(capsys, spec_path, "--plan", "dp=8", "--predictor", "analytical")
    assert code == 0
    assert "TFLOP/s/GPU" in out and "dp_comm" in out and "activations" in out


def test_cpu_table_counts_ranks_and_shows_their_small_throughput(tmp_path, capsys):
    """A CPU rank does hundredths of a TFLOP/s: the table prints them, per rank, rather than 0.0 per GPU."""
    path = tmp_path / "cpu.yaml"
    path.write_text(SPEC.replace("device: a100-80gb", "device: cpu\n  device_profile: "
                                 f"{Path(__file__).resolve().parents[1] / 'predictor/data/cpu/device.json'}")
                    .replace("gpus_per_node: 8", "gpus_per_node: 2").replace("bf16", "fp32"))
    code, out, _ = _run(capsys, str(path), "--plan", "dp=2", "--predictor", "analytical", "--json")
    tflops = json.loads(out)["tflops_per_gpu"]
    assert code == 0 and 0.001 <= tflops < 1
    code, out, _ = _run(capsys, str(path), "--plan", "dp=2", "--predictor", "analytical")
    assert code == 0 and "TFLOP/s/rank" in out and f"{tflops:.3f}" in out


def test_auto_without_checkpoint_warns_and_uses_analytical(tmp_path, capsys):
    path = tmp_path / "v100.yaml"  # no ScaleDL checkpoint is shipped for the V100
    path.write_text(SPEC.replace("a100-80gb", "v100-32gb"))
    code, out, err = _run(capsys, str(path), "--plan", "dp=8", "--json")
    assert code == 0 and json.loads(out)["predictor"] == "analytical"
    assert "no ScaleDL checkpoint for device 'v100-32gb'" in err


def test_outside_training_warns_once_for_the_workload_and_per_plan_for_the_rest(capsys):
    """The shipped CPU checkpoint never saw BERT's 30,522-token vocabulary (shared by every plan: said
    once) nor ZeRO-1 (only the second plan: said for it alone)."""
    code, _, err = _run(capsys, str(EXAMPLES / "bert-cpu2.yaml"), "--predictor", "auto",
                        "--plan", "dp=2,mbs=4", "--plan", "dp=2,mbs=4,zero=1")
    assert code == 0
    assert err.count("vocab 30522") == 1 and "all 2 plans lie outside" in err
    lines = [line for line in err.splitlines() if "zero=1 (trained" in line]
    assert len(lines) == 1 and lines[0].startswith("scaledl predict: warning: dp=2,tp=1,pp=1,mbs=4,zero=1 also lies")


@pytest.mark.parametrize("argv, message", [
    (["--plan", "dp=3"], "cluster has 8 GPUs"),
    (["--plan", "dq=8"], "unknown plan field 'dq'"),
    ([], "give at least one --plan"),
    (["--plan", "dp=8", "--plans-file", "/nonexistent/plans.txt"], "plans file /nonexistent/plans.txt does not exist"),
    (["--plan", "dp=8", "--predictor", "/nonexistent.pt"], "neither 'analytical', 'auto' nor an existing checkpoint"),
])
def test_bad_input_exits_2_with_message(spec_path, capsys, argv, message):
    code, _, err = _run(capsys, spec_path, *argv)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_bad_spec_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPEC.replace("heads: 8", "heads: 7"))
    code, _, err = _run(capsys, str(bad), "--plan", "dp=8")
    assert code == 2 and "heads=7 must divide hidden=512" in err
    code, _, err = _run(capsys, str(tmp_path / "missing.yaml"), "--plan", "dp=8")
    assert code == 2 and "cannot read spec" in err


def test_a_plan_typed_without_plan_is_refused_by_predict_with_the_fix(spec_path, capsys):
    """An unknown argument is reported by the subcommand with its own usage; a plan string gets the --plan hint."""
    with pytest.raises(SystemExit) as exit_:
        main(["predict", spec_path, "dp=8,mbs=2"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("usage: scaledl predict")
    assert "unrecognized arguments: dp=8,mbs=2; pass a plan with --plan, e.g. --plan dp=8,mbs=2" in err
    with pytest.raises(SystemExit):
        main(["predict", spec_path, "--plan", "dp=8", "--bogus"])
    err = capsys.readouterr().err
    assert "scaledl predict: error: unrecognized arguments: --bogus" in err and "--plan, e.g." not in err


def test_json_says_whether_the_plan_fits_the_device(spec_path, capsys):
    code, out, _ = _run(capsys, spec_path, "--plan", "dp=8", "--json", "--predictor", "analytical")
    obj = json.loads(out)
    assert code == 0 and obj["capacity_gib"] == pytest.approx(80.0, rel=0.01)
    assert obj["fits"] == (obj["peak_memory_gib"] <= obj["limit_gib"] < obj["capacity_gib"]) and obj["fits"]


def test_a_plan_that_does_not_fit_names_what_overflows_and_the_cheapest_fix(tmp_path, capsys):
    path = tmp_path / "llama70b.yaml"
    path.write_text("model: {preset: llama3-70b, seq_len: 8192}\n"
                    "training: {global_batch: 128, precision: bf16, framework: megatron}\n"
                    "cluster: {device: h100, nodes: 8, gpus_per_node: 8}\n")
    plan = "dp=8,tp=8,mbs=1,zero=1,sp=true"
    code, out, _ = _run(capsys, str(path), "--plan", plan, "--json", "--predictor", "analytical")
    obj = json.loads(out)
    assert code == 0 and not obj["fits"] and obj["overflow"]["over_gib"] > 0
    assert obj["overflow"]["part"] in obj["memory_breakdown"]
    fix = obj["fix"]
    assert fix["peak_memory_gib"] <= obj["limit_gib"] and fix["saves_gib"] > obj["overflow"]["over_gib"]
    code, _, err = _run(capsys, str(path), "--plan", plan, "--predictor", "analytical")
    assert f"{fix['lever']} saves" in err and "over the" in err


def test_a_bad_search_section_is_refused_with_a_did_you_mean(spec_path, tmp_path, capsys):
    bad = tmp_path / "bad-search.yaml"
    bad.write_text(Path(spec_path).read_text() + "search:\n  max_ppp: 4\n")
    code, out, err = _run(capsys, str(bad), "--plan", "dp=8", "--predictor", "analytical")
    assert code == 2 and "search.max_ppp: unknown field; did you mean 'max_pp'?" in err
    assert "Extra inputs" not in err and out == ""


def test_no_empty_table_before_the_errors(spec_path, capsys):
    code, out, err = _run(capsys, spec_path, "--plan", "dp=3", "--predictor", "analytical")
    assert code == 2 and out == "" and "invalid plan 'dp=3'" in err
