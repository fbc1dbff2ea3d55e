"""Choice of ScaleDL's memory residual on training data only: nested leave-one-architecture-out.

    nice -n 5 .venv/bin/python -m bench.memory_cv > bench/results/memory_cv.txt

For each out-of-domain split of `bench/paper_table.py` (its held-out architecture is never read),
leave each of the four training architectures out in turn, learn the residual on the other three
and score the peak-memory MRE on the one left out. Compared: the analytical peak alone, a forest on
log(measured / analytical) (ScaleDL's residual until 30 Nov 2026) and `MemoryResidual` (an affine
base c + b·analytical, then the same forest on what it leaves).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from bench import common
from predictor.data import evaluate as ev
from predictor.models.features import by_workload
from predictor.models.memory_residual import MemoryResidual, memory_features, residual_forest
from predictor.models.scaledl import ScaleDLPredictor


def _ratio_forest(x: np.ndarray, measured: np.ndarray, analytical: np.ndarray, x_new: np.ndarray,
                  analytical_new: np.ndarray) -> np.ndarray:
    forest = residual_forest(0).fit(x, np.log(measured / analytical))
    return analytical_new * MemoryResidual.of_ratio_forest(forest).ratio(x_new, analytical_new)


def _affine_residual(x, measured, analytical, x_new, analytical_new) -> np.ndarray:
    return analytical_new * MemoryResidual(seed=0).fit(x, measured, analytical).ratio(x_new, analytical_new)


METHODS = {"analytical": lambda x, m, a, xn, an: an, "ratio-forest": _ratio_forest, "affine+forest": _affine_residual}


def main() -> int:
    ap = common.parser(__doc__)
    ap.add_argument("--data", type=Path, default=ev.CPU_DATASET)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# .venv/bin/python -m bench.memory_cv   ({time.strftime('%d %b %Y %H:%M UTC', time.gmtime())})")
    data = ev.load_profile_dataset(args.data)
    means: dict[str, list[float]] = {name: [] for name in METHODS}
    for split in ev.out_of_domain_splits(data):
        # the residual's features (Z, log analytical peak) come from the composition of a model fitted
        # on the split's training set; the correction networks (and the companion) play no part in memory
        model = ScaleDLPredictor(use_gnn=False, use_global=False, unseen=None, seed=0).fit(split.train)
        x, arch, measured, analytical = [], [], [], []
        for spec, graph, idx in by_workload(split.train.samples):
            samples = [split.train.samples[i] for i in idx]
            comp = model._compose(spec, graph, [s.plan for s in samples])
            features = memory_features(comp.z, comp.table.peak_memory_gib)
            for j, s in enumerate(samples):
                if s.peak_memory_gib:
                    x.append(features[j]), arch.append(s.model)
                    measured.append(s.peak_memory_gib), analytical.append(comp.table.peak_memory_gib[j])
        x, arch, measured, analytical = map(np.asarray, (x, arch, measured, analytical))
        scores = {}
        for name, method in METHODS.items():
            errs = []
            for inner in sorted(set(arch)):
                fit, held = arch != inner, arch == inner
                pred = method(x[fit], measured[fit], analytical[fit], x[held], analytical[held])
                errs.append(ev.mre(pred, measured[held]))
            scores[name] = float(np.mean(errs))
            means[name].append(scores[name])
        print(f"outer held-out {split.model:5s} (not read): inner leave-one-out peak-memory MRE  "
              + "  ".join(f"{k} {v:6.2f}%" for k, v in scores.items()), flush=True)
    print("mean over the outer splits:  " + "  ".join(f"{k} {np.mean(v):6.2f}%" for k, v in means.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
