"""The checkpoint loader: the shipped checkpoints are in the one format the code reads, name the class they hold and
predict bitwise the same once saved again; any other format is refused with what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from predictor.models import checkpoint
from predictor.models.features import graph_of
from predictor.models.registry import CHECKPOINT_DIR, load_checkpoint
from predictor.models.scaledl import ScaleDLPredictor
from predictor.plan import Plan
from predictor.spec.workload import load_spec

SHIPPED = sorted(CHECKPOINT_DIR.rglob("*.pt"))
SPEC = load_spec(Path(__file__).resolve().parents[1] / "examples" / "bert-cpu2.yaml")
PLANS = [Plan(dp=2), Plan(dp=2, mbs=2, zero=1), Plan(pp=2, mbs=2), Plan(tp=2)]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_checkpoint_is_the_current_format_and_predicts_the_same_saved_again(path: Path, tmp_path: Path) -> None:
    on_disk = torch.load(path, map_location="cpu", weights_only=False)
    assert on_disk["format"] == checkpoint.FORMAT and on_disk["predictor"] == "scaledl"
    shipped = load_checkpoint(path)
    assert isinstance(shipped, ScaleDLPredictor)
    shipped.save(tmp_path / "now.pt")
    again = ScaleDLPredictor.load(tmp_path / "now.pt")
    assert checkpoint.read(tmp_path / "now.pt")["config"] == checkpoint.read(path)["config"]
    graph = graph_of(SPEC)
    before, after = shipped.predict(SPEC, graph, PLANS), again.predict(SPEC, graph, PLANS)
    assert [(p.iter_time_s, p.peak_memory_gib) for p in before] == [(p.iter_time_s, p.peak_memory_gib) for p in after]


@pytest.mark.parametrize("format_, remedy", [(checkpoint.FORMAT + 1, "update ScaleDL"),
                                             (2, "retrain it with `scaledl train`")])
def test_a_checkpoint_of_another_format_is_refused_with_what_to_do(format_: int, remedy: str, tmp_path: Path) -> None:
    state = torch.load(SHIPPED[0], map_location="cpu", weights_only=False)
    state["format"] = format_
    torch.save(state, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=f"is format {format_}; this version of ScaleDL reads format "
                                         f"{checkpoint.FORMAT} only: {remedy}"):
        ScaleDLPredictor.load(tmp_path / "other.pt")


def test_a_checkpoint_names_the_class_it_holds(tmp_path: Path) -> None:
    state = torch.load(SHIPPED[0], map_location="cpu", weights_only=False)
    state["predictor"] = "birnn"  # a registered predictor without a checkpoint loader
    torch.save(state, tmp_path / "birnn.pt")
    with pytest.raises(ValueError, match="holds a 'birnn' predictor, which this version of ScaleDL cannot load"):
        load_checkpoint(tmp_path / "birnn.pt")
