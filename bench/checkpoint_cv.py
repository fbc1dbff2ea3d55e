"""Which ScaleDL settings the shipped checkpoint should be trained with, chosen on its training split only.

    nice -n 10 .venv/bin/python -m bench.checkpoint_cv [--data predictor/data/cpu] [--sizes 1,5]

`scaledl train --designs all --holdout 0.2` holds out a seeded 20 % of each architecture's
configurations to measure the checkpoint. This splits the other 80 % in two halves (per
architecture, seeded) and fits ScaleDL with each ensemble size on one half, scored on the
other, both ways round; the held-out 20 % is never read. Every architecture is in both halves, so
the companion for unseen ones would never answer: it is not trained.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench import common
from predictor.data import evaluate as ev
from predictor.models.scaledl import ScaleDLPredictor


def main() -> int:
    ap = common.parser(__doc__)
    ap.add_argument("--data", type=Path, default=ev.CPU_DATASET)
    ap.add_argument("--sizes", default="1,5", help="ensemble sizes to compare")
    ap.add_argument("--seed", type=int, default=0, help="the seed `scaledl train` holds out with")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = ev.load_profile_dataset(args.data, designs=None)
    train, _ = ev.holdout_split(data, 0.2, args.seed)  # exactly the checkpoint's training split
    half, other = ev.holdout_split(train, 0.5, args.seed + 1)
    other_ids = {s.config_id for s in other}
    folds = [(ev.subset(train, lambda s: s.config_id not in other_ids), other),
             (ev.subset(train, lambda s: s.config_id in other_ids), half.samples)]
    print(f"checkpoint training split: {len(train.samples)} configurations; halves of {len(folds[0][1])} "
          f"and {len(folds[1][1])}", flush=True)
    for k in (int(x) for x in args.sizes.split(",")):
        errs = []
        for fit_on, test in folds:
            t0 = time.time()
            pred, _ = ev.predict_samples(ScaleDLPredictor(seed=args.seed, ensemble=k, unseen=None).fit(fit_on), test)
            true = np.asarray([s.iter_time_s for s in test])
            errs.append(np.abs(pred - true) / true)
            print(f"ensemble {k}: fit on {len(fit_on.samples)}, MRE {100 * errs[-1].mean():.2f}% on {len(test)} "
                  f"({time.time() - t0:.0f} s)", flush=True)
        print(f"ensemble {k}: two-fold MRE {100 * np.concatenate(errs).mean():.2f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
