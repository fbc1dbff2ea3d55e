"""Carrying the CPU checkpoint to another CPU model: its error there before and after fine-tuning on k runs.

    .venv/bin/python -m bench.transfer [--data predictor/data/cpu-amd-epyc] [--sizes 10,20,40,80]

The shipped CPU checkpoint learned its layer ratios and corrections on an Intel Xeon's data; `cpu`
is whatever machine runs a prediction, priced with that machine's profile. `--data` is a profile
dataset of another machine: random configurations of the five models, iterations only, with the
machine's device.json (`scaledl profile --design random --no-layers --grid cpu-large`). A seeded
quarter of its configurations is the fixed test set. From the rest, k are drawn at random (three
draws per k) and the checkpoint is fine-tuned on them as `scaledl train --update` does
(`ScaleDLPredictor.update`). Prints the test MAPE against k, beside the analytical model on the
machine's profile and the checkpoint before any fine-tuning.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench import common
from bench.common import ROOT
from predictor.data import evaluate as ev
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.base import Predictor
from predictor.models.domain import HARDWARE
from predictor.models.features import Sample
from predictor.models.registry import checkpoint_path
from predictor.models.scaledl import ScaleDLPredictor

DRAWS = 3


def held_out_mape(model: Predictor, test: list[Sample]) -> float:
    pred, _ = ev.predict_samples(model, test)
    return ev.mre(pred, np.asarray([s.iter_time_s for s in test]))


def main() -> int:
    ap = common.parser(__doc__)
    ap.add_argument("--data", type=Path, default=ROOT / "predictor" / "data" / "cpu-amd-epyc")
    ap.add_argument("--checkpoint", type=Path, default=checkpoint_path("cpu"))
    ap.add_argument("--sizes", default="10,20,40,80", help="fine-tuning set sizes (at most the non-test rows)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = ev.load_profile_dataset(args.data, designs=None, with_layers=False)
    pool, test = ev.holdout_split(data, 0.25, seed=0)
    shipped = ScaleDLPredictor.load(args.checkpoint)
    trained_on = ", ".join(shipped.domain.seen.get(HARDWARE, ["?"])) if shipped.domain else "?"
    print(f"{args.data}: {len(data.samples)} configurations, {len(test)} held out; checkpoint {args.checkpoint.name} "
          f"trained on {trained_on}")
    print(f"analytical (this machine's profile)   MAPE {held_out_mape(AnalyticalPredictor(), test):6.2f}%")
    print(f"checkpoint, not fine-tuned            MAPE {held_out_mape(shipped, test):6.2f}%")
    for k in (int(x) for x in args.sizes.split(",")):
        k = min(k, len(pool.samples))
        draws = 1 if k == len(pool.samples) else DRAWS  # the whole pool: every draw is the same set
        errs, t0 = [], time.time()
        for draw in range(draws):
            rng = np.random.default_rng(draw)
            chosen = {pool.samples[i].config_id for i in rng.choice(len(pool.samples), k, replace=False)}
            tuned = ScaleDLPredictor.load(args.checkpoint).update(ev.subset(pool, lambda s: s.config_id in chosen))
            errs.append(held_out_mape(tuned, test))
        print(f"fine-tuned on k={k:3d} runs               MAPE {np.mean(errs):6.2f}%  "
              f"({', '.join(f'{e:.1f}' for e in errs)}; {(time.time() - t0) / draws:.0f} s each)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
