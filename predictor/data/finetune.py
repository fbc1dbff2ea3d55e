"""Fine-tuning a ScaleDL checkpoint on new measurements, judged on configurations it is not tuned on.

`scaledl train --update` (a dataset that grew by validation runs) and `scaledl adapt` (another
machine's runs) share it: a seeded share of each architecture's configurations is held out, the
checkpoint's error on them is measured before and after the update, and the caller keeps the update
only when it did not make that error worse.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictor.data.evaluate import accuracy_of, holdout_source, holdout_split
from predictor.models.base import TrainingDataError
from predictor.models.features import TrainingData
from predictor.models.scaledl import ScaleDLPredictor


@dataclass
class FineTuned:
    """The updated predictor and its held-out accuracy before and after the update (None: nothing held out)."""

    model: ScaleDLPredictor
    trained_on: int  # iterations the update saw
    held_out: int
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    @property
    def improved(self) -> bool:
        """Whether to keep the update: it did not raise the held-out error (or nothing was held out)."""
        return self.before is None or self.after["mape_pct"] <= self.before["mape_pct"]

    def summary(self) -> str:
        """One line on what the update did to the held-out error."""
        if self.after is None or self.before is None:
            return "no configurations held out: the update's accuracy is not measured"
        return (f"held-out error: {self.after['mape_pct']:.1f}% MAPE, RMSE {self.after['rmse_ms']:.1f} ms over "
                f"{self.held_out} configurations (before the update: {self.before['mape_pct']:.1f}%)")


def fine_tune(model: ScaleDLPredictor, data: TrainingData, where: str | Path, holdout: float, seed: int = 0,
              epochs: int = 60) -> FineTuned:
    """Hold out `holdout` of each architecture's configurations of `data` (read from `where`; seeded) and
    update the loaded `model` in place on the rest; the updated model records its held-out accuracy."""
    train, held = holdout_split(data, holdout, seed) if holdout else (data, [])
    if not train.samples:
        raise TrainingDataError(f"nothing left to fine-tune on: all {len(data.samples)} iterations are held out "
                                f"(holdout {holdout:.0%}); measure more configurations or lower the holdout")
    source = holdout_source(where, holdout, seed)
    before = accuracy_of(model, held, source) if held else None
    model.update(train, epochs=epochs)
    after = None
    if held:
        after = model.provenance["accuracy"] = accuracy_of(model, held, source)
    return FineTuned(model, len(train.samples), len(held), before, after)
