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

import numpy as np
from sklearn.tree._tree import Tree

# Fields of sklearn's node array that prediction does not read.
TRAINING_STATISTICS = ("impurity", "n_node_samples", "weighted_n_node_samples")


class _PredictionOnlyPickler(pickle.Pickler):
    """A pickler that writes every sklearn Tree without its training statistics."""

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, Tree):
            return NotImplemented
        cls, args, state = obj.__reduce__()
        return cls, args, {**state, "nodes": _prediction_fields(state["nodes"])}


def _prediction_fields(nodes: np.ndarray) -> np.ndarray:
    """The node array with its training statistics zeroed, built on zeroed memory: the array's padding bytes (after
    its one-byte field) are whatever memory held, so a copy would pickle different bytes each time, compress badly
    and make a checkpoint's bytes differ from one save to the next."""
    out = np.zeros(nodes.shape, dtype=nodes.dtype)
    for field in nodes.dtype.names:
        if field not in TRAINING_STATISTICS:
            out[field] = nodes[field]
    return out


def dumps_for_prediction(obj: Any, protocol: int = pickle.DEFAULT_PROTOCOL) -> bytes:
    """`pickle.dumps(obj)`, except that the trees inside it keep only what `predict` needs."""
    buf = io.BytesIO()
    _PredictionOnlyPickler(buf, protocol=protocol).dump(obj)
    return buf.getvalue()
