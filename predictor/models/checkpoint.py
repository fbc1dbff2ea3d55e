"""ScaleDL checkpoint files: their layout, one format.

A checkpoint is one torch-saved dict: a predictor's state (`ScaleDLPredictor._state`, which names its class under
`predictor`), its `format` and the feature layout it was trained with (`features`, which must match this code's:
features whose meaning changed would be misread silently, so such a file is refused). The fitted scikit-learn parts of
the predictor and of its companion are pickled together under `sklearn`, prediction-only and lzma-compressed, so the
forests the two share are stored once; in memory each state holds its own (`learned`).

`read` takes the format `write` writes and refuses any other, older or newer, with what to do: the shipped checkpoints
are saved in it, and a change of the state's layout bumps FORMAT and re-saves them (their predictions compared
before and after), so the loading code knows one layout.
"""

from __future__ import annotations

import io
import lzma
import pickle
from pathlib import Path
from typing import Any

import torch

from predictor.models.compact_pickle import dumps_for_prediction
from predictor.models.features import feature_signature

State = dict[str, Any]
FORMAT = 11  # what `write` writes and `read` reads


def read(path: Path) -> State:
    """The state of the checkpoint at `path` (format FORMAT, this code's features), its learned parts unpickled."""
    if not path.is_file():
        raise FileNotFoundError(f"ScaleDL checkpoint {path} does not exist; train one with `scaledl train`")
    state = torch.load(path, map_location="cpu", weights_only=False)  # our own file: it pickles forests
    saved = state.get("format") if isinstance(state, dict) else None
    if not isinstance(saved, int):
        raise ValueError(f"{path} is not a ScaleDL checkpoint (no format)")
    if saved != FORMAT:
        remedy = "update ScaleDL" if saved > FORMAT else "retrain it with `scaledl train` (or `scaledl adapt`)"
        raise ValueError(f"ScaleDL checkpoint {path} is format {saved}; this version of ScaleDL reads format {FORMAT} "
                         f"only: {remedy}")
    mine, theirs = feature_signature(), state.get("features") or {}
    differ = sorted(k for k in mine if theirs.get(k) != mine[k])
    if differ:
        raise ValueError(f"ScaleDL checkpoint {path} was trained with other features than this version computes "
                         f"({', '.join(f'{k}: {theirs.get(k)} vs {mine[k]}' for k in differ[:3])}); "
                         "retrain it with `scaledl train`")
    return _joined(state, pickle.loads(lzma.decompress(state["sklearn"])))


def write(path: Path, state: State) -> None:
    """`state` (format FORMAT) to `path`, atomically: written under a temporary name, then renamed."""
    disk, learned = _split(state)
    disk.update(format=FORMAT, features=feature_signature(),
                sklearn=lzma.compress(dumps_for_prediction(learned), preset=6))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    buf = io.BytesIO()
    # Protocol 4 stores the compressed forests as raw bytes; torch's default protocol 2 writes
    # bytes as latin-1 text, which grows this blob by half.
    torch.save(disk, buf, pickle_protocol=4)
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)


def _split(state: State) -> tuple[State, dict[str, Any]]:
    """(the state without its learned parts, those parts with the companion's nested in them)."""
    disk = {k: v for k, v in state.items() if k != "learned"}
    learned = dict(state["learned"], companion=None)
    if state["companion"] is not None:
        disk["companion"], learned["companion"] = _split(state["companion"])
    return disk, learned


def _joined(state: State, learned: dict[str, Any]) -> State:
    """`_split` undone: each state with its own learned parts, not the file's pickle of them (`sklearn`)."""
    learned = dict(learned)
    companion_learned = learned.pop("companion", None)
    state = {k: v for k, v in state.items() if k != "sklearn"}
    state["learned"] = learned
    if state.get("companion"):
        state["companion"] = _joined(state["companion"], companion_learned)
    return state
