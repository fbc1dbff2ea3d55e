"""ScaleDL checkpoint files: their layout, and the upgrade of every older format to the current one.

A checkpoint is one torch-saved dict: a predictor's state (`ScaleDLPredictor._state`), its `format` and the
feature layout it was trained with (`features`, which must match this code's: features whose meaning changed
would be misread silently, so such a file is refused). The fitted scikit-learn parts of the predictor and of
its companion are pickled together under `sklearn`, prediction-only and lzma-compressed, so the forests the
two share are stored once; in memory each state holds its own (`learned`).

`read` upgrades an older file one format at a time (`STEPS`, each a function named for what it changed) and
refuses a format newer than this code's. Format 2 was written unchanged while the fields of formats 3-10 were
added to it, so a format-2 file may hold any of them already: each of those steps fills only what it lacks.
"""

from __future__ import annotations

import io
import lzma
import pickle
from pathlib import Path
from typing import Any, Callable

import torch

from predictor.models.compact_pickle import dumps_for_prediction
from predictor.models.features import feature_signature
from predictor.models.memory_residual import MemoryResidual

State = dict[str, Any]
FIRST = 2  # the oldest format this code reads (every checkpoint written before format 11 says 2)


def _training_domain(state: State) -> None:
    """3: the checkpoint records its training domain (`domain`); without one, predictions never say they lie
    outside it."""
    state.setdefault("domain", None)


def _ensemble(state: State) -> None:
    """4: the correction network is an ensemble (config `ensemble`, weights under `members.<i>.`); before,
    a checkpoint held one network."""
    state["config"].setdefault("ensemble", 1)
    net = state["net"]
    if net is not None and not any(k.startswith("members.") for k in net):
        state["net"] = {f"members.0.{k}": v for k, v in net.items()}


def _affine_memory_base(state: State) -> None:
    """5: the memory residual is a `MemoryResidual` (an affine base, then a forest); before, it was the forest
    alone, on log(measured / analytical), which a residual with a unit base reproduces."""
    learned = state["learned"]
    if learned["memory_model"] is not None and not isinstance(learned["memory_model"], MemoryResidual):
        learned["memory_model"] = MemoryResidual.of_ratio_forest(learned["memory_model"])


def _analytical_config(state: State) -> None:
    """6: the analytical base's config is saved (`analytical`: the fitted fixed costs, the composition's
    switches); before, the composition used the defaults."""
    state.setdefault("analytical", {})


def _host_once(state: State) -> None:
    """7: config `host_once`, a CPU's host time counted once in the composition; before, the composition the
    networks were fitted to counted it twice."""
    state["config"].setdefault("host_once", False)


def _step_p2p(state: State) -> None:
    """8: config `step_p2p` and the analytical field of that name; before, the composition charged a measured
    CPU's in-step cost per pipeline send/recv."""
    state["config"].setdefault("step_p2p", True)
    state["analytical"].setdefault("step_p2p", True)


def _op_costs(state: State) -> None:
    """9: operator costs as the layer-wise base of non-GEMM layers (config `op_costs`, the costs fitted per
    device in `learned`); before, every layer's base was its roofline."""
    state["config"].setdefault("op_costs", False)
    state["learned"].setdefault("op_costs", {})


def _companion(state: State) -> None:
    """10: a companion predicts the model families the training data lacks (config `unseen`, its state under
    `companion`); before, one model predicted every family."""
    state["config"].setdefault("unseen", None)
    state.setdefault("companion", None)


def _retired_overlap_fractions(state: State) -> None:
    """11: the analytical config has no overlap_dp / overlap_tp (the fractions of collectives hidden, always
    saved as 0: nothing hidden; another value is refused), and a companion's state no longer repeats the
    file's format and features."""
    for retired in ("overlap_dp", "overlap_tp"):
        if state["analytical"].pop(retired, 0.0) != 0.0:
            raise ValueError(f"the checkpoint's analytical config sets the retired {retired}; retrain it")
    companion = state["companion"]
    if companion is not None:
        companion.pop("format", None)
        companion.pop("features", None)
        _retired_overlap_fractions(companion)


# STEPS[i] upgrades format FIRST + i to FIRST + i + 1.
STEPS: tuple[Callable[[State], None], ...] = (
    _training_domain, _ensemble, _affine_memory_base, _analytical_config, _host_once, _step_p2p, _op_costs,
    _companion, _retired_overlap_fractions,
)
FORMAT = FIRST + len(STEPS)  # what `write` writes


def upgrade(state: State) -> State:
    """`state` (learned parts unpickled) brought to FORMAT in place, one step per format it is behind."""
    for version in range(state["format"], FORMAT):
        STEPS[version - FIRST](state)
        state["format"] = version + 1
    return state


def read(path: Path) -> tuple[State, int]:
    """(the state of the checkpoint at `path` in format FORMAT, the format it was saved in)."""
    if not path.is_file():
        raise FileNotFoundError(f"ScaleDL checkpoint {path} does not exist; train one with `scaledl train`")
    state = torch.load(path, map_location="cpu", weights_only=False)  # our own file: it pickles forests
    saved = state.get("format")
    if not isinstance(saved, int) or saved < FIRST:
        raise ValueError(f"{path} is not a ScaleDL checkpoint this version reads (format {saved!r}; it reads "
                         f"formats {FIRST} to {FORMAT})")
    if saved > FORMAT:
        raise ValueError(f"ScaleDL checkpoint {path} is format {saved}, newer than this version of ScaleDL reads "
                         f"(formats {FIRST} to {FORMAT}); update ScaleDL, or retrain it with `scaledl train`")
    mine, theirs = feature_signature(), state.get("features") or {}
    differ = sorted(k for k in mine if theirs.get(k) != mine[k])
    if differ:
        raise ValueError(f"ScaleDL checkpoint {path} was trained with other features than this version computes "
                         f"({', '.join(f'{k}: {theirs.get(k)} vs {mine[k]}' for k in differ[:3])}); "
                         "retrain it with `scaledl train`")
    return upgrade(_joined(state, pickle.loads(lzma.decompress(state["sklearn"])))), saved


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
