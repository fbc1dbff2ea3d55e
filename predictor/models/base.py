"""The contract every predictor keeps (like a scikit-learn estimator), so they are interchangeable.

`predict` is batched: one workload (spec + its layer graph) and many plans, because a
search asks for thousands of plans of the same workload at once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from predictor.costs.prediction import Prediction
from predictor.costs.prediction_table import PredictionTable
from predictor.graph.layer_graph import LayerGraph
from predictor.plan import Plan
from predictor.spec.workload import WorkloadSpec


@dataclass(frozen=True)
class Dominated:
    """A plan field's value a predictor never prices faster nor in less memory than the value `by`, the rest of the
    plan alike (`why`: what in its pricing makes it so). A search that holds the plan with `by` leaves it out unpriced
    (`search_spaces.enumerate`), since it could never be the faster plan that fits."""

    field: str
    value: Any
    by: Any
    why: str


class TrainingDataError(ValueError):
    """Measured data this predictor cannot be trained on; the message says what to do instead."""


class Predictor(ABC):
    """Predicts time and memory of (workload, plan) pairs."""

    name: str = "predictor"
    # Measured accuracy of this fitted predictor (held-out figures and where they come from), if known.
    accuracy: dict[str, Any] | None = None
    # Plan values it never prices better than another value of their field (none known: a learned model's may be).
    dominated: tuple[Dominated, ...] = ()

    def fit(self, data: Any) -> "Predictor":
        """Learn from a profile dataset; predictors without parameters return self."""
        return self

    @abstractmethod
    def predict(self, spec: WorkloadSpec, graph: LayerGraph, plans: Sequence[Plan]) -> list[Prediction]:
        """One Prediction per plan, in order. Plans must be valid for the spec (see plan_errors)."""

    def predict_table(self, spec: WorkloadSpec, graph: LayerGraph, plans: Sequence[Plan]) -> PredictionTable:
        """The predictions of `plans` as columns (what a search ranks); predictors that vectorise over plans
        override it, the others' Predictions are tabulated."""
        return PredictionTable.from_predictions(self.predict(spec, graph, plans))

    def save(self, path: str | Path) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no learned state to save")

    @classmethod
    def load(cls, path: str | Path) -> "Predictor":
        raise NotImplementedError(f"{cls.__name__} has no learned state to load")
