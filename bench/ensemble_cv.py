"""Choices of ScaleDL's settings made on training data only: how many correction networks to average,
or any other ScaleDLPredictor setting; and the other methods on the same folds.

    nice -n 10 .venv/bin/python bench/ensemble_cv.py [--models t5,bert] [--sizes 1,5]
    nice -n 10 .venv/bin/python bench/ensemble_cv.py --configs "use_comm=true use_comm=false"
    nice -n 10 .venv/bin/python bench/ensemble_cv.py --methods birnn
    nice -n 10 .venv/bin/python bench/ensemble_cv.py --protocol ood --configs "use_global=true use_global=false"

For each architecture's in-domain training split (the 160 configurations `bench/paper_table.py`
trains on; its 40 test configurations are never read), 4-fold cross-validation: fit ScaleDL with
each setting on three folds, score MRE on the fourth. With `--protocol ood`, nested: for each
held-out architecture (`--models`; never read), leave one of the four training architectures out
in turn, fit on the other three. Prints one line per fold and the mean.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predictor import evaluate as ev  # noqa: E402
from predictor.models.base import Predictor  # noqa: E402
from predictor.models.features import Sample, TrainingData  # noqa: E402
from predictor.models.scaledl import ScaleDLPredictor  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ev.CPU_DATASET)
    ap.add_argument("--models", default=",".join(ev.FAMILIES))
    ap.add_argument("--sizes", default="1,5", help="ensemble sizes to compare")
    ap.add_argument("--configs", help="settings to compare instead, space separated, each KEY=VALUE[,KEY=VALUE] of "
                                      "ScaleDLPredictor's keywords (true/false/int/float), e.g. 'use_comm=true use_comm=false'")
    ap.add_argument("--methods", help="compare these methods of `scaledl evaluate` (comma separated, their defaults) "
                                      "instead, e.g. 'birnn,scaledl': is a gap on one test split more than its noise?")
    ap.add_argument("--folds", type=int, default=4, help="in-domain folds (out of domain: one per training architecture)")
    ap.add_argument("--protocol", choices=("id", "ood"), default="id")
    args = ap.parse_args()
    torch.set_num_threads(1)
    candidates = _candidates(args, ap)
    data = ev.load_profile_dataset(args.data)
    splits = ev.in_domain_splits(data, seed=0) if args.protocol == "id" else ev.out_of_domain_splits(data)
    for split in splits:
        if split.model not in args.models.split(","):
            continue
        scores: dict[str, list[float]] = {n: [] for n in candidates}
        for fit_on, test in _inner_folds(split, args.protocol, args.folds):
            true = np.asarray([s.iter_time_s for s in test])
            for name, make in candidates.items():
                t0 = time.time()
                pred, _ = ev.predict_samples(make().fit(fit_on), test)
                scores[name].append(ev.mre(pred, true))
                print(f"{split.model:5s} fold {len(scores[name])} {name}: MRE {scores[name][-1]:6.2f}%  "
                      f"({time.time() - t0:.0f} s)", flush=True)
        print(f"{split.model:5s} CV MRE " + "  ".join(f"{n}: {np.mean(v):.2f}%" for n, v in scores.items()), flush=True)
    return 0


def _inner_folds(split: ev.Split, protocol: str, k: int) -> Iterator[tuple[TrainingData, list[Sample]]]:
    """(fit on, held out) pairs inside a split's training data: k seeded random folds in-domain; out of
    domain one per training architecture."""
    train = split.train.samples
    if protocol == "ood":
        for fam in sorted({s.model for s in train}):
            yield ev.subset(split.train, lambda s, f=fam: s.model != f), [s for s in train if s.model == fam]
        return
    for fold in np.array_split(np.random.default_rng(1).permutation(len(train)), k):
        held = {train[i].config_id for i in fold}
        yield ev.subset(split.train, lambda s, h=held: s.config_id not in h), [train[i] for i in fold]


def _candidates(args: argparse.Namespace, ap: argparse.ArgumentParser) -> dict[str, Callable[[], Predictor]]:
    """Name -> unfitted predictor (seed 0) of what the command line asks to compare."""
    if args.methods:
        unknown = [m for m in args.methods.split(",") if m not in ev.METHODS]
        if unknown:
            ap.error(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(ev.METHODS)}")
        return {m: (lambda m=m: ev.METHODS[m](0)) for m in args.methods.split(",")}
    configs = ([_setting(c) for c in args.configs.split()] if args.configs
               else [{"ensemble": int(k)} for k in args.sizes.split(",")])
    return {",".join(f"{k}={v}" for k, v in c.items()): (lambda c=c: ScaleDLPredictor(**{"seed": 0, **c}))
            for c in configs}


def _setting(text: str) -> dict[str, object]:
    """'use_comm=false,ensemble=5' -> {'use_comm': False, 'ensemble': 5}."""
    out: dict[str, object] = {}
    for item in text.split(","):
        key, _, raw = item.partition("=")
        low = raw.strip().lower()
        out[key.strip()] = (low == "true" if low in ("true", "false") else
                            int(raw) if raw.strip().lstrip("-").isdigit() else float(raw))
    return out


if __name__ == "__main__":
    sys.exit(main())
