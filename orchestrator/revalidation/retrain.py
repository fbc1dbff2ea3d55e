"""`scaledl revalidate --retrain`: fine-tune the predictor on what the rounds measured, and swap it in only if it
predicts a held-out slice of the history better than the current one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.revalidation.history import History
from predictor.measure.design import ProfileConfig
from predictor.plan import Plan
from predictor.spec.workload import parse_spec


@dataclass
class RetrainOutcome:
    swapped: bool
    old_error: float | None  # mean |relative time error| on the held-out slice
    new_error: float | None
    held_out: int
    trained_on: int
    message: str


def held_out_slice(history: History, every: int = 4) -> list[tuple[dict[str, Any], str, float]]:
    """(spec, plan, measured s) of every `every`-th successful re-measurement: never trained on, only judged on."""
    rows = history.conn.execute(
        """SELECT m.id, p.spec_json, m.plan, m.measured_time_s FROM measurements m JOIN predictions p
           ON p.id = m.prediction_id WHERE m.status = 'ok' AND m.measured_time_s > 0 ORDER BY m.id"""
    ).fetchall()
    return [(json.loads(spec), plan, t) for i, (_, spec, plan, t) in enumerate(rows) if i % every == 0]


def _error_on(predictor: Any, held: list[tuple[dict[str, Any], str, float]]) -> float:
    from predictor.graph.cache import graph_for

    errors = []
    for spec_data, plan, measured in held:
        spec = parse_spec(spec_data)
        (pred,) = predictor.predict(spec, graph_for(spec.model), [Plan.parse(plan)])
        errors.append(abs(pred.iter_time_s - measured) / measured)
    return sum(errors) / len(errors)


def retrain(history: History, checkpoint: str | Path, dataset_dir: str | Path, epochs: int | None = None) -> RetrainOutcome:
    """Fine-tune the checkpoint on the profile dataset (which the rounds appended to), minus the held-out
    configurations, and replace `checkpoint` only if the held-out error improves on the current predictor's.

    The current predictor is the checkpoint when it exists (fine-tuned with `ScaleDLPredictor.update`,
    as `scaledl train --update` does), else the analytical model (what `auto` falls back to), and
    then ScaleDL is fitted from scratch; `epochs` overrides the epochs of either.
    `ScaleDLPredictor.save` writes atomically: readers see the old or the new file.
    """
    from predictor.data.evaluate import load_profile_dataset
    from predictor.models.analytical import AnalyticalPredictor
    from predictor.models.scaledl import ScaleDLPredictor

    checkpoint = Path(checkpoint)
    held = held_out_slice(history)
    if not held:
        return RetrainOutcome(False, None, None, 0, 0, "no successful re-measurements to judge a new predictor on; "
                                                       "kept the current one")
    held_ids = {ProfileConfig(parse_spec(s).model, parse_spec(s).training.global_batch, Plan.parse(p)).config_id
                for s, p, _ in held}
    data = load_profile_dataset(dataset_dir, designs=None)
    data.samples = [s for s in data.samples if s.config_id not in held_ids]
    if not data.samples:
        return RetrainOutcome(False, None, None, len(held), 0, f"{dataset_dir} has no measured iterations outside "
                                                               "the held-out slice; kept the current one")
    epochs_arg = {"epochs": epochs} if epochs is not None else {}
    if checkpoint.is_file():
        old = ScaleDLPredictor.load(checkpoint)
        old_error = _error_on(old, held)  # before `update` changes it in place
        new = old.update(data, **epochs_arg)
        how = "fine-tuned"
    else:
        old = AnalyticalPredictor()
        old_error = _error_on(old, held)
        new = ScaleDLPredictor(**epochs_arg).fit(data)
        how = "trained"
    new_error = _error_on(new, held)
    swapped = new_error < old_error
    if swapped:
        new.save(checkpoint)
    verdict = f"swapped {checkpoint}" if swapped else f"kept the current predictor ({checkpoint if checkpoint.is_file() else 'analytical'})"
    return RetrainOutcome(swapped, old_error, new_error, len(held), len(data.samples),
                          f"{how} on {len(data.samples)} iterations; held-out error over {len(held)} runs: "
                          f"current {100 * old_error:.1f}%, retrained {100 * new_error:.1f}%; {verdict}")
