"""The slice of vTrain's single-node A100 measurements (training data) that the predictor tests learn from."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from predictor.data.evaluate import load_vtrain
from predictor.models.features import Sample

SINGLE = Path(__file__).resolve().parents[2] / "shared" / "ground_truth" / "vtrain_ground_truth_single.csv"


def a100_rows() -> list[Sample]:
    """Rows of hidden 1024 with 12 or 24 layers, in file order; skips the test when shared/ is absent."""
    if not SINGLE.is_file():
        pytest.skip(f"{SINGLE} not present")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [s for s in load_vtrain(SINGLE) if s.spec.model.hidden == 1024 and s.spec.model.layers in (12, 24)]
