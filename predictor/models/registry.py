"""Which predictor a command uses: `analytical`, `auto` (the ScaleDL checkpoint of the device, else
analytical with a warning) or the path of a ScaleDL checkpoint.

`auto` prefers the checkpoint `scaledl adapt` fine-tuned to this machine's hardware (kept in the
user's cache, `$SCALEDL_CACHE`) over the shipped one: a measured device such as `cpu` is whatever
machine runs the prediction, and a checkpoint trained on another CPU model is off by 20-30 % there
(bench/results/transfer.txt)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from predictor.machine import hardware_slug
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.base import Predictor

CHECKPOINT_DIR = Path(__file__).resolve().parent.parent / "checkpoints"
# The analytical model's accuracy per device where it was measured against real runs (bench/vtrain_eval.py --record).
ANALYTICAL_ACCURACY = CHECKPOINT_DIR / "analytical-accuracy.json"
INTERVAL_COVERAGE = 0.8  # the share of real runs a prediction interval is meant to hold
# An 80 % normal interval is +-1.2816 sigma, and a normal error's mean absolute value is sigma * sqrt(2 / pi).
_NORMAL_FROM_MAPE = 1.2816 * math.sqrt(math.pi / 2)


def checkpoint_path(device_name: str) -> Path:
    """Where the shipped ScaleDL checkpoint of `device_name` lives (it may not exist)."""
    return CHECKPOINT_DIR / f"scaledl-{device_name}.pt"


def adapted_checkpoint_path(device_name: str, hardware: str) -> Path:
    """Where `scaledl adapt` keeps the checkpoint of `device_name` fine-tuned to `hardware` (a CPU model)."""
    from predictor.measure.device import cache_dir  # lazy: imports torch

    return cache_dir() / "checkpoints" / f"scaledl-{device_name}-{hardware_slug(hardware)}.pt"


def _load_scaledl(path: Path) -> Predictor:
    from predictor.models.scaledl import ScaleDLPredictor  # lazy: pulls in torch-geometric

    return ScaleDLPredictor.load(path)


def load_predictor(name_or_path: str, device_name: str, hardware: str = "") -> tuple[Predictor, str]:
    """(predictor, label for reports). `hardware`: the measured device's CPU model, whose adapted
    checkpoint `auto` takes first. Raises FileNotFoundError for a path that does not exist."""
    if name_or_path == "analytical":
        return AnalyticalPredictor(), "analytical"
    if name_or_path == "auto":
        adapted = adapted_checkpoint_path(device_name, hardware) if hardware else None
        if adapted is not None and adapted.is_file():
            return _load_scaledl(adapted), f"scaledl ({adapted.name}, adapted to this hardware)"
        path = checkpoint_path(device_name)
        if path.is_file():
            return _load_scaledl(path), f"scaledl ({path.name})"
        warnings.warn(f"no ScaleDL checkpoint for device {device_name!r} (looked for {path}); "
                      "using the analytical predictor", stacklevel=2)
        return AnalyticalPredictor(), "analytical"
    check_predictor_name(name_or_path)
    return _load_scaledl(Path(name_or_path)), f"scaledl ({name_or_path})"


def check_predictor_name(name_or_path: str) -> None:
    """Fail fast (before replicas start) on a predictor that is neither a known name nor a checkpoint file."""
    if name_or_path not in ("analytical", "auto") and not Path(name_or_path).is_file():
        raise FileNotFoundError(f"predictor {name_or_path!r} is neither 'analytical', 'auto' nor an existing checkpoint file")


def measured_accuracy(predictor: Predictor, device_name: str) -> dict[str, Any] | None:
    """How accurate `predictor` was measured to be on this device (reports show it), or None if never measured:
    a checkpoint carries its held-out accuracy; the analytical model's is recorded per device."""
    if isinstance(predictor, AnalyticalPredictor):
        if not ANALYTICAL_ACCURACY.is_file():
            return None
        return json.loads(ANALYTICAL_ACCURACY.read_text()).get(device_name)
    return predictor.accuracy


def residual_quantiles(measured: np.ndarray, predicted: np.ndarray, coverage: float = INTERVAL_COVERAGE) -> dict[str, Any]:
    """The tails of the signed relative residuals r = measured / predicted - 1 that leave (1 - coverage) / 2 out on
    each side: an iteration predicted at t lies in [t (1 + low), t (1 + high)] as often as these held-out runs did."""
    r = np.asarray(measured, float) / np.asarray(predicted, float) - 1
    low, high = np.quantile(r, [(1 - coverage) / 2, (1 + coverage) / 2])
    return {"coverage": coverage, "low": round(float(low), 4), "high": round(float(high), 4), "rows": len(r),
            "residual": "measured / predicted - 1"}


def interval_factors(accuracy: dict[str, Any] | None) -> dict[str, Any] | None:
    """The prediction interval of this accuracy record, relative to the prediction: its recorded residual quantiles,
    else (a record with only a MAPE) a normal error of that mean absolute size; None when never measured."""
    if not accuracy:
        return None
    if "residual_quantiles" in accuracy:
        q = accuracy["residual_quantiles"]
        return {**q, "basis": f"quantiles of {q['rows']} held-out residuals, {accuracy['source']}"}
    half = _NORMAL_FROM_MAPE * accuracy["mape_pct"] / 100
    return {"coverage": INTERVAL_COVERAGE, "low": -half, "high": half, "rows": accuracy["rows"],
            "basis": f"a normal error with the measured {accuracy['mape_pct']:.1f} % mean absolute error "
                     f"({accuracy['source']}; no residuals recorded)"}
