"""Every predictor by name: what `scaledl predict`/`plan --predictor`, `scaledl evaluate` and the bench scripts choose
from, and the loader of a checkpoint file (which names the predictor it holds).

A command takes `analytical`, `auto` (the ScaleDL checkpoint of the device, else analytical with a warning) or the
path of a checkpoint. `auto` prefers the checkpoint `scaledl adapt` fine-tuned to this machine's hardware (kept in the
user's cache, `$SCALEDL_CACHE`) over the shipped one: a measured device such as `cpu` is whatever machine runs the
prediction, and a checkpoint trained on another CPU model is off by 20-30 % there (bench/results/transfer.txt).
`scaledl evaluate` trains the trainable entries (`PREDICTORS[name].make(seed)`) on a profile dataset."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from predictor.measure.machine import hardware_slug
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.base import Dominated, Predictor
from predictor.models.intervals import lent

CHECKPOINT_DIR = Path(__file__).resolve().parent.parent / "checkpoints"
# The analytical model's accuracy per device where it was measured against real runs (bench/vtrain_eval.py --record).
ANALYTICAL_ACCURACY = CHECKPOINT_DIR / "analytical-accuracy.json"


@dataclass(frozen=True)
class Entry:
    """One predictor: `make(seed)` builds it unfitted; `restore(state)` rebuilds a fitted one from a checkpoint's
    state (None: it has nothing to save); `ready`: it predicts without training (a command may use it by name)."""

    make: Callable[[int], Predictor]
    group: Literal["method", "ablation", "variant"] = "method"  # evaluate's default set, `ablations`, by name only
    restore: Callable[[dict[str, Any]], Predictor] | None = None
    ready: bool = False


def _scaledl(**options: Any) -> Callable[[int], Predictor]:
    def make(seed: int) -> Predictor:
        from predictor.models.scaledl import ScaleDLPredictor  # lazy: pulls in torch-geometric

        return ScaleDLPredictor(**options, seed=seed)

    return make


def _baseline(name: str) -> Callable[[int], Predictor]:
    def make(seed: int) -> Predictor:
        from predictor.models import baselines  # lazy: torch

        return getattr(baselines, name)(seed=seed)

    return make


def _calibrated_analytical(seed: int) -> Predictor:
    from predictor.models.calibration import CalibratedAnalytical  # lazy: scipy

    return CalibratedAnalytical()


def _layer_host_analytical(seed: int) -> Predictor:
    from predictor.models.host_cost import LayerHostAnalytical  # lazy: the layer graph's pricing

    return LayerHostAnalytical()


def _restore_scaledl(state: dict[str, Any]) -> Predictor:
    from predictor.models.scaledl import ScaleDLPredictor

    return ScaleDLPredictor.restore(state)


PREDICTORS: dict[str, Entry] = {
    "scaledl": Entry(_scaledl(), restore=_restore_scaledl),
    "rf": Entry(_baseline("RFHyperParams")),
    "mlp-acc": Entry(_baseline("MLPAcc")),
    "birnn": Entry(_baseline("BiRNN")),
    "analytical": Entry(lambda seed: AnalyticalPredictor(), ready=True),
    "scaledl-plainsum": Entry(_scaledl(use_gnn=False, use_global=False), "ablation"),
    "scaledl-nognn": Entry(_scaledl(use_gnn=False), "ablation"),
    "scaledl-nomlp": Entry(_scaledl(use_global=False), "ablation"),
    "scaledl-nocomm": Entry(_scaledl(use_comm=False), "ablation"),
    # GPU data: the framework's fixed costs fitted first (predictor.models.calibration); refused on a measured CPU
    "scaledl-calibrated": Entry(_scaledl(calibrate=True), "variant"),
    "analytical-calibrated": Entry(_calibrated_analytical, "variant"),
    "analytical-layerhost": Entry(_layer_host_analytical, "variant"),
    "scaledl-layerhost": Entry(_scaledl(layer_host=True), "variant"),
    # the default's two parts alone, each for every family: one network (the composition routing replaced),
    # and operator costs, which the default uses for unseen families (bench/results/ensemble_cv.txt, top)
    "scaledl-one": Entry(_scaledl(ensemble=1, unseen=None), "variant"),
    "scaledl-opcosts": Entry(_scaledl(op_costs=True, ensemble=1, unseen=None), "variant"),
}


def group(name: str) -> dict[str, Callable[[int], Predictor]]:
    """{predictor name: its factory} of one group ("method", "ablation" or "variant")."""
    return {n: e.make for n, e in PREDICTORS.items() if e.group == name}


def checkpoint_path(device_name: str) -> Path:
    """Where the shipped ScaleDL checkpoint of `device_name` lives (it may not exist)."""
    return CHECKPOINT_DIR / f"scaledl-{device_name}.pt"


def adapted_checkpoint_path(device_name: str, hardware: str) -> Path:
    """Where `scaledl adapt` keeps the checkpoint of `device_name` fine-tuned to `hardware` (a CPU model)."""
    from predictor.measure.device import cache_dir  # lazy: imports torch

    return cache_dir() / "checkpoints" / f"scaledl-{device_name}-{hardware_slug(hardware)}.pt"


def load_checkpoint(path: Path) -> Predictor:
    """The fitted predictor a checkpoint file holds, of the class its `predictor` entry names."""
    from predictor.models import checkpoint  # lazy: imports torch

    state = checkpoint.read(path)
    kind = state.get("predictor")
    entry = PREDICTORS.get(kind)
    if entry is None or entry.restore is None:
        raise ValueError(f"{path} holds a {kind!r} predictor, which this version of ScaleDL cannot load")
    return entry.restore(state)


def load_predictor(name_or_path: str, device_name: str, hardware: str = "") -> tuple[Predictor, str]:
    """(predictor, label for reports). `hardware`: the measured device's CPU model, whose adapted
    checkpoint `auto` takes first. Raises FileNotFoundError for a path that does not exist."""
    entry = PREDICTORS.get(name_or_path)
    if entry is not None and entry.ready:
        return entry.make(0), name_or_path
    if name_or_path == "auto":
        adapted = adapted_checkpoint_path(device_name, hardware) if hardware else None
        if adapted is not None and adapted.is_file():
            return load_checkpoint(adapted), f"scaledl ({adapted.name}, adapted to this hardware)"
        path = checkpoint_path(device_name)
        if path.is_file():
            return load_checkpoint(path), f"scaledl ({path.name})"
        warnings.warn(f"no ScaleDL checkpoint for device {device_name!r} (looked for {path}); "
                      "using the analytical predictor", stacklevel=2)
        return AnalyticalPredictor(), "analytical"
    check_predictor_name(name_or_path)
    predictor = load_checkpoint(Path(name_or_path))
    return predictor, f"{predictor.name} ({name_or_path})"


def dominated_values(name_or_path: str, device_name: str, hardware: str = "") -> tuple[Dominated, ...]:
    """The `Predictor.dominated` rules of the predictor `load_predictor` would load, known without loading it: a
    checkpoint's (a learned model's) are none."""
    entry = PREDICTORS.get(name_or_path)
    if entry is not None and entry.ready:
        return entry.make(0).dominated
    if name_or_path == "auto" and not checkpoint_path(device_name).is_file() and not (
            hardware and adapted_checkpoint_path(device_name, hardware).is_file()):
        return AnalyticalPredictor.dominated
    return ()


def check_predictor_name(name_or_path: str) -> None:
    """Fail fast (before replicas start) on a predictor that is neither a known name nor a checkpoint file."""
    ready = [n for n, e in PREDICTORS.items() if e.ready]
    if name_or_path in ready or name_or_path == "auto" or Path(name_or_path).is_file():
        return
    trained = " (it must be trained first: `scaledl train`, then pass the checkpoint)" if name_or_path in PREDICTORS else ""
    raise FileNotFoundError(f"predictor {name_or_path!r} is neither {', '.join(repr(n) for n in ready)}, 'auto' nor "
                            f"an existing checkpoint file{trained}")


def measured_accuracy(predictor: Predictor, device_name: str, framework: str) -> dict[str, Any] | None:
    """How accurate `predictor` was measured to be on this device under this framework (reports show it), or None if
    never measured: a checkpoint carries its held-out accuracy; the analytical model's is recorded per (device,
    framework). A device measured under another framework only lends the widest recorded interval, widened
    (`intervals.lent`) and said so: one framework's residuals are not another's."""
    if not isinstance(predictor, AnalyticalPredictor):
        return predictor.accuracy
    if not ANALYTICAL_ACCURACY.is_file():
        return None
    table = json.loads(ANALYTICAL_ACCURACY.read_text())
    record = table.get(device_name)
    if record is None or record.get("framework") == framework:
        return record
    widest = max((r for r in table.values() if "residual_quantiles" in r),
                 key=lambda r: r["residual_quantiles"]["high"] - r["residual_quantiles"]["low"])
    return lent(widest, f"no {framework} runs measured on {device_name}", framework)
