"""Pickling fitted scikit-learn trees with only what prediction reads, so shipped checkpoints stay small.

A decision tree's node array also holds each node's impurity and (weighted) sample counts: statistics of the
training data that `predict` never reads (it walks children, features and thresholds to a leaf's value), and
that compress badly. Zeroing them shrinks the shipped CPU checkpoint by a third while every prediction stays
bitwise the same; what is lost is `feature_importances_` (impurity based) of a loaded model. The live objects
are not changed: only their pickled form.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from sklearn.tree._tree import Tree

# Fields of sklearn's node array that prediction does not read.
TRAINING_STATISTICS = ("impurity", "n_node_samples", "weighted_n_node_samples")


class _PredictionOnlyPickler(pickle.Pickler):
    """A pickler that writes every sklearn Tree without its training statistics."""

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, Tree):
            return NotImplemented
        cls, args, state = obj.__reduce__()
        nodes = state["nodes"].copy()
        for field in TRAINING_STATISTICS:
            nodes[field] = 0
        return cls, args, {**state, "nodes": nodes}


def dumps_for_prediction(obj: Any, protocol: int = pickle.DEFAULT_PROTOCOL) -> bytes:
    """`pickle.dumps(obj)`, except that the trees inside it keep only what `predict` needs."""
    buf = io.BytesIO()
    _PredictionOnlyPickler(buf, protocol=protocol).dump(obj)
    return buf.getvalue()
