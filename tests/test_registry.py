"""The one predictor registry: the names `scaledl evaluate` trains, the ones a command uses as they are, and the
checkpoint loader, which builds the class the file names."""

from __future__ import annotations

import pytest

from predictor.data import evaluate as ev
from predictor.models import registry
from predictor.models.scaledl import ScaleDLPredictor


def test_evaluate_and_the_cli_choose_from_the_same_registry() -> None:
    assert set(ev.ALL_METHODS) == set(registry.PREDICTORS)
    assert list(ev.METHODS) == ["scaledl", "rf", "mlp-acc", "birnn", "analytical"]
    assert type(ev.METHODS["rf"](0)).__name__ == "RFHyperParams"
    assert registry.load_predictor("analytical", "a100-80gb")[1] == "analytical"
    with pytest.raises(FileNotFoundError, match="must be trained first"):
        registry.check_predictor_name("rf")  # a trainable name is not a ready predictor


def test_a_checkpoint_names_the_class_it_holds(tmp_path) -> None:
    import torch

    shipped = registry.checkpoint_path("cpu")
    model = registry.load_checkpoint(shipped)
    assert isinstance(model, ScaleDLPredictor)
    model.save(tmp_path / "again.pt")
    saved = torch.load(tmp_path / "again.pt", map_location="cpu", weights_only=False)
    assert saved["predictor"] == "scaledl"
    saved["predictor"] = "rf"
    torch.save(saved, tmp_path / "rf.pt")
    with pytest.raises(ValueError, match="holds a 'rf' predictor, which this version of ScaleDL cannot load"):
        registry.load_checkpoint(tmp_path / "rf.pt")
