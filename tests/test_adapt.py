"""`scaledl adapt` end to end, for real: runs measured on this machine, the CPU checkpoint fine-tuned on
them, and `--predictor auto` then using the result on this hardware."""

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.cli import main
from predictor.data import dataset
from predictor.measure import device as measure_device
from predictor.measure.machine import hardware_slug
from predictor.models.domain import HARDWARE
from predictor.models.registry import adapted_checkpoint_path
from predictor.models.scaledl import ScaleDLPredictor

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FAST = ["--budget", "1", "--holdout", "0", "--epochs", "5"]


@pytest.fixture()
def own_cache(measured_cpu_profile, tmp_path, monkeypatch):
    """A fresh $SCALEDL_CACHE holding this machine's measured profile (copied: measuring it anew takes 45 s)."""
    hardware = measure_device.measured_cpu().model
    shutil.copy(measured_cpu_profile, tmp_path / measure_device.CACHE_FILE)
    monkeypatch.setenv("SCALEDL_CACHE", str(tmp_path))
    return tmp_path, hardware


@pytest.mark.slow
def test_adapt_measures_fine_tunes_and_auto_uses_the_result(own_cache, capsys):
    cache, hardware = own_cache
    # --force: on the machine the shipped checkpoint was trained on there would be nothing to adapt.
    assert main(["adapt", *FAST, "--force"]) == 0
    out = capsys.readouterr().out
    adapted = adapted_checkpoint_path("cpu", hardware)
    assert f"wrote {adapted}" in out and adapted.is_file()
    runs = cache / "adapt" / hardware_slug(hardware)
    rows = dataset.load(runs, "iterations")
    assert len(rows) == 5 and set(rows["family"]) == {"t5", "gpt2", "bert", "vit", "deit"}
    assert json.loads((runs / "device.json").read_text())["fingerprint"]["cpu"] == hardware

    model = ScaleDLPredictor.load(adapted)
    assert hardware in model.domain.seen[HARDWARE]
    assert len(model.provenance["updates"]) == 1 and model.provenance["updates"][0]["samples"] == 5

    assert main(["predict", str(EXAMPLES / "bert-cpu2.yaml"), "--plan", "dp=2,mbs=4", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["predictor"] == f"scaledl ({adapted.name}, adapted to this hardware)"
    assert f"{HARDWARE}=" not in captured.err  # this hardware is inside the adapted checkpoint's domain

    # The adapted checkpoint knows this hardware: nothing to do without --force.
    assert main(["adapt", *FAST, "--checkpoint", str(adapted)]) == 0
    assert "was trained on this hardware" in capsys.readouterr().out
    # Run again, the measurements are kept: none is repeated.
    assert main(["adapt", *FAST, "--checkpoint", str(adapted), "--force", "--out", str(cache / "again.pt")]) == 0
    out = capsys.readouterr().out
    assert f"0 measured ({{}}), 5 already in {runs}" in out and f"`--predictor {cache / 'again.pt'}`" in out
    assert len(dataset.load(runs, "iterations")) == 5


@pytest.mark.parametrize("argv, message", [
    (["--budget", "0"], "--budget must be at least 1"),
    (["--holdout", "1"], "--holdout 1.0: give a share in [0, 1)"),
    (["--checkpoint", "/nonexistent/x.pt"], "--checkpoint /nonexistent/x.pt does not exist"),
])
def test_bad_flags_are_clear(argv, message, capsys):
    assert main(["adapt", *argv]) == 2
    assert message in capsys.readouterr().err

