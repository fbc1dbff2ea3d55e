"""Prediction intervals: how far a real iteration lies from its prediction, from the predictor's held-out residuals.

`scaledl train` and the bench scripts record `residual_quantiles` of held-out runs; a report turns a predictor's
accuracy record into an `Interval` and applies it to every ranked plan, so a user sees which plans the predictor
cannot tell apart.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

INTERVAL_COVERAGE = 0.8  # the share of real runs a prediction interval is meant to hold
# An 80 % normal interval is +-1.2816 sigma, and a normal error's mean absolute value is sigma * sqrt(2 / pi).
_NORMAL_FROM_MAPE = 1.2816 * math.sqrt(math.pi / 2)


def residual_quantiles(measured: np.ndarray, predicted: np.ndarray, coverage: float = INTERVAL_COVERAGE) -> dict[str, Any]:
    """The tails of the signed relative residuals r = measured / predicted - 1 that leave (1 - coverage) / 2 out on
    each side: an iteration predicted at t lies in [t (1 + low), t (1 + high)] as often as these held-out runs did."""
    r = np.asarray(measured, float) / np.asarray(predicted, float) - 1
    low, high = np.quantile(r, [(1 - coverage) / 2, (1 + coverage) / 2])
    return {"coverage": coverage, "low": round(float(low), 4), "high": round(float(high), 4), "rows": len(r),
            "residual": "measured / predicted - 1"}


# How much wider than the widest recorded interval a (framework, device) without residuals of its own is quoted.
UNMEASURED_WIDENING = 2.0


def lent(record: dict[str, Any], why: str, framework: str) -> dict[str, Any]:
    """The accuracy record quoted where `framework` was never measured (`why`): `record`'s residual quantiles widened
    UNMEASURED_WIDENING times, no rows of its own, and marked unmeasured."""
    q = record["residual_quantiles"]
    return {"mape_pct": None, "rows": 0, "framework": framework, "measured": False,
            "source": f"{why}: the widest recorded interval ({record['source']}) widened {UNMEASURED_WIDENING:g}x",
            "residual_quantiles": {**q, "low": q["low"] * UNMEASURED_WIDENING, "high": q["high"] * UNMEASURED_WIDENING,
                                   "rows": 0}}


@dataclass(frozen=True)
class Interval:
    """A prediction t's interval [t (1 + low), t (1 + high)], holding `coverage` of the `rows` runs it came from."""

    coverage: float
    low: float
    high: float
    rows: int
    basis: str  # which held-out residuals, in words

    @classmethod
    def of(cls, accuracy: dict[str, Any] | None) -> "Interval | None":
        """The interval of an accuracy record: its recorded residual quantiles, else (a record with only a MAPE) a
        normal error of that mean absolute size; None when never measured."""
        if not accuracy:
            return None
        if "residual_quantiles" in accuracy:
            q = accuracy["residual_quantiles"]
            basis = (accuracy["source"] if accuracy.get("measured") is False
                     else f"quantiles of {q['rows']} held-out residuals, {accuracy['source']}")
            return cls(q["coverage"], q["low"], q["high"], q["rows"], basis)
        half = _NORMAL_FROM_MAPE * accuracy["mape_pct"] / 100
        return cls(INTERVAL_COVERAGE, -half, half, accuracy["rows"],
                   f"a normal error with the measured {accuracy['mape_pct']:.1f} % mean absolute error "
                   f"({accuracy['source']}; no residuals recorded)")

    def around(self, t: np.ndarray) -> np.ndarray:
        """(len(t), 2): each prediction's low and high end."""
        t = np.asarray(t, float)
        return np.stack([t * (1 + self.low), t * (1 + self.high)], axis=1)

    def overlaps_first(self, measure: np.ndarray) -> np.ndarray:
        """Which of `measure` (ascending, the first is the winner's) have an interval overlapping the winner's: the
        predictor cannot tell those apart. The winner itself is False."""
        measure = np.asarray(measure, float)
        alike = measure * (1 + self.low) <= measure[0] * (1 + self.high) if len(measure) else np.zeros(0, bool)
        if len(alike):
            alike[0] = False
        return alike

    def contains(self, measured: float, predicted: float) -> bool:
        """Whether a measured time lies inside the interval of its prediction."""
        return predicted * (1 + self.low) <= measured <= predicted * (1 + self.high)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
