"""How many correction networks ScaleDL should average, chosen on training data only.

    nice -n 10 .venv/bin/python bench/ensemble_cv.py [--models t5,bert] [--sizes 1,5]

For each architecture's in-domain training split (the 160 configurations `bench/paper_table.py`
trains on; its 40 test configurations are never read), 4-fold cross-validation: fit ScaleDL with
each ensemble size on three folds, score MRE on the fourth. Prints one line per fold and the mean.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predictor import evaluate as ev  # noqa: E402
from predictor.models.scaledl import ScaleDLPredictor  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ev.CPU_DATASET)
    ap.add_argument("--models", default=",".join(ev.FAMILIES))
    ap.add_argument("--sizes", default="1,5", help="ensemble sizes to compare")
    ap.add_argument("--folds", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = ev.load_profile_dataset(args.data)
    sizes = [int(k) for k in args.sizes.split(",")]
    for split in ev.in_domain_splits(data, seed=0):
        if split.model not in args.models.split(","):
            continue
        train = split.train.samples
        folds = np.array_split(np.random.default_rng(1).permutation(len(train)), args.folds)
        scores: dict[int, list[float]] = {k: [] for k in sizes}
        for f in folds:
            held = {train[i].config_id for i in f}
            fit_on = ev.subset(split.train, lambda s: s.config_id not in held)
            test = [train[i] for i in f]
            true = np.asarray([s.iter_time_s for s in test])
            for k in sizes:
                t0 = time.time()
                pred, _ = ev.predict_samples(ScaleDLPredictor(seed=0, ensemble=k).fit(fit_on), test)
                scores[k].append(ev.mre(pred, true))
                print(f"{split.model:5s} fold {len(scores[k])} ensemble {k}: MRE {scores[k][-1]:6.2f}%  "
                      f"({time.time() - t0:.0f} s)", flush=True)
        print(f"{split.model:5s} CV MRE " + "  ".join(f"ensemble {k}: {np.mean(v):.2f}%" for k, v in scores.items()),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
