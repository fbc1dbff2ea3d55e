"""The checkpoint loader: the shipped checkpoints are older formats, upgraded on load to predict as they did;
a format newer than the code is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from predictor.models import checkpoint
from predictor.models.features import graph_of
from predictor.models.registry import CHECKPOINT_DIR
from predictor.models.scaledl import ScaleDLPredictor
from predictor.plan import Plan
from predictor.workload import load_spec

SHIPPED = sorted(CHECKPOINT_DIR.rglob("*.pt"))
SPEC = load_spec(Path(__file__).resolve().parents[1] / "examples" / "bert-cpu2.yaml")
PLANS = [Plan(dp=2), Plan(dp=2, mbs=2, zero=1), Plan(pp=2, mbs=2), Plan(tp=2)]


def test_the_steps_run_one_format_to_the_next_each_saying_what_it_changed() -> None:
    assert checkpoint.FORMAT == checkpoint.FIRST + len(checkpoint.STEPS)
    for version, step in enumerate(checkpoint.STEPS, checkpoint.FIRST + 1):
        assert step.__doc__.startswith(f"{version}: "), step.__name__


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_checkpoint_is_an_older_format_upgraded_to_predict_as_it_did(path: Path, tmp_path: Path) -> None:
    on_disk = torch.load(path, map_location="cpu", weights_only=False)
    assert "overlap_dp" in on_disk["analytical"]  # format 2 saved the fields format 11 retired
    state, saved = checkpoint.read(path)
    assert saved == on_disk["format"] == 2 < checkpoint.FORMAT == state["format"]
    assert "overlap_dp" not in state["analytical"] and "overlap_tp" not in state["analytical"]
    shipped = ScaleDLPredictor.load(path)
    shipped.save(tmp_path / "now.pt")  # rewritten in the current format, it predicts bitwise the same
    rewritten, saved = checkpoint.read(tmp_path / "now.pt")
    assert saved == checkpoint.FORMAT and rewritten["config"] == state["config"]
    again = ScaleDLPredictor.load(tmp_path / "now.pt")
    graph = graph_of(SPEC)
    before, after = shipped.predict(SPEC, graph, PLANS), again.predict(SPEC, graph, PLANS)
    assert [(p.iter_time_s, p.peak_memory_gib) for p in before] == [(p.iter_time_s, p.peak_memory_gib) for p in after]

def test_a_checkpoint_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    state = torch.load(SHIPPED[0], map_location="cpu", weights_only=False)
    state["format"] = checkpoint.FORMAT + 1
    torch.save(state, tmp_path / "future.pt")
    with pytest.raises(ValueError, match=f"is format {checkpoint.FORMAT + 1}, newer than this version of ScaleDL "
                                         f"reads \\(formats 2 to {checkpoint.FORMAT}\\); update ScaleDL"):
        ScaleDLPredictor.load(tmp_path / "future.pt")
