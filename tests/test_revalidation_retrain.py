"""`scaledl revalidate --retrain` for real: a tiny real profile dataset, a drifted predictor, a refit
ScaleDL model judged on a held-out slice of the history; the checkpoint changes only on improvement."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.revalidation.history import History
from orchestrator.revalidation.retrain import held_out_slice, retrain
from predictor.data import dataset
from tests.stored_predictions import store


@pytest.mark.slow
def test_retrain_swaps_the_checkpoint_only_when_held_out_error_improves(two_nodes, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "profile"
    assert main(["profile", "--families", "gpt2", "--design", "doptimal", "--budget", "6", "--plans", "single",
                 "--procs", "1", "--steps", "2", "--warmup", "1", "--layer-repeats", "2", "--flop-cap", "2e9",
                 "--out", str(data)]) == 0
    url = f"sqlite:///{tmp_path}/history.db"
    with History.open(url) as h:
        store(h, "gpt2", 10.0, "analytical-10x-wrong")
    ckpt = tmp_path / "scaledl-cpu.pt"
    code = main(["revalidate", "--history", url, "--once", "--sample", "2", "--steps", "2", "--warmup", "1",
                 "--threshold", "0.5", "--dataset", str(data), "--retrain", "--checkpoint", str(ckpt)])
    out, err = capsys.readouterr()
    assert code == 1 and "DRIFT ALERT: gpt2" in err
    assert "held-out error over 1 runs" in out
    assert (dataset.load(data)["design"] == "validate").sum() == 2  # the round's runs joined the dataset

    match = re.search(r"current ([\d.]+)%, retrained ([\d.]+)%; (swapped|kept)", out)
    assert match, out
    cli_new = float(match.group(2)) / 100
    assert (match.group(3) == "swapped") == (cli_new < float(match.group(1)) / 100) == ckpt.is_file()

    with History.open(url) as h:
        assert len(held_out_slice(h)) == 1
        before = ckpt.read_bytes() if ckpt.is_file() else None
        again = retrain(h, ckpt, data)
        if before is not None:  # the checkpoint on disk is the model the command reported on
            assert again.old_error == pytest.approx(cli_new, abs=6e-4)
        assert again.trained_on == 6 + 2 - 1  # the profile rows and the round's runs, minus the held-out one
        assert again.swapped == (again.new_error < again.old_error)
        assert (ckpt.read_bytes() if ckpt.is_file() else None) != before if again.swapped else \
            (ckpt.read_bytes() if ckpt.is_file() else None) == before
