"""Choices of ScaleDL's settings made on training data only: how many correction networks to average,
or any other ScaleDLPredictor setting; and the other methods on the same folds.

    nice -n 10 .venv/bin/python -m bench.ensemble_cv [--models t5,bert] [--sizes 1,5]
    nice -n 10 .venv/bin/python -m bench.ensemble_cv --configs "use_comm=true use_comm=false"
    nice -n 10 .venv/bin/python -m bench.ensemble_cv --methods birnn
    nice -n 10 .venv/bin/python -m bench.ensemble_cv --protocol ood --configs "use_global=true use_global=false"
    nice -n 10 .venv/bin/python -m bench.ensemble_cv --configs "step_p2p=true step_p2p=false" --seeds 0,1,2

For each architecture's in-domain training split (the 160 configurations `bench/paper_table.py`
trains on; its 40 test configurations are never read), 4-fold cross-validation: fit ScaleDL with
each setting on three folds, score MRE on the fourth. With `--protocol ood`, nested: for each
held-out architecture (`--models`; never read), leave one of the four training architectures out
in turn, fit on the other three. Prints one line per fold and the mean; with `--seeds`, each setting is
fitted with each model seed and compared on the mean over seeds.

Out of domain the held-out architecture is one the fit never saw, so ScaleDL's default answers it with
its companion (`ScaleDLPredictor(unseen=...)`): a setting of the main model alone changes nothing there
unless `unseen=none` is given with it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from bench import common
from predictor.data import evaluate as ev
from predictor.models.base import Predictor
from predictor.models.features import Sample, TrainingData
from predictor.models.scaledl import ScaleDLPredictor


def main() -> int:
    ap = common.parser(__doc__)
    ap.add_argument("--data", type=Path, default=ev.CPU_DATASET)
    ap.add_argument("--models", default=",".join(ev.FAMILIES))
    ap.add_argument("--sizes", default="1,5", help="ensemble sizes to compare")
    ap.add_argument("--configs", help="settings to compare instead, space separated, each KEY=VALUE[,KEY=VALUE] of "
                                      "ScaleDLPredictor's keywords (true/false/int/float), e.g. 'use_comm=true use_comm=false'")
    ap.add_argument("--methods", help="compare these methods of `scaledl evaluate` (comma separated, their defaults) "
                                      "instead, e.g. 'birnn,scaledl': is a gap on one test split more than its noise?")
    ap.add_argument("--folds", type=int, default=4, help="in-domain folds (out of domain: one per training architecture)")
    ap.add_argument("--protocol", choices=("id", "ood"), default="id")
    ap.add_argument("--seeds", default="0", help="model seeds each setting is fitted with (comma separated); the CV "
                                                 "error moves by about a point per model between seeds, more than "
                                                 "most settings differ, so compare means over several")
    args = ap.parse_args()
    torch.set_num_threads(1)
    candidates = _candidates(args, ap)
    seeds = [int(s) for s in args.seeds.split(",")]
    data = ev.load_profile_dataset(args.data)
    splits = ev.in_domain_splits(data, seed=0) if args.protocol == "id" else ev.out_of_domain_splits(data)
    means: dict[str, list[float]] = {n: [] for n in candidates}  # per split, the mean over seeds
    for split in splits:
        if split.model not in args.models.split(","):
            continue
        scores: dict[str, dict[int, list[float]]] = {n: {s: [] for s in seeds} for n in candidates}
        for fold, (fit_on, test) in enumerate(_inner_folds(split, args.protocol, args.folds), 1):
            true = np.asarray([s.iter_time_s for s in test])
            for name, make in candidates.items():
                for seed in seeds:
                    t0 = time.time()
                    pred, _ = ev.predict_samples(make(seed).fit(fit_on), test)
                    scores[name][seed].append(ev.mre(pred, true))
                    tag = f" seed {seed}" if len(seeds) > 1 else ""
                    print(f"{split.model:5s} fold {fold} {name}{tag}: MRE {scores[name][seed][-1]:6.2f}%  "
                          f"({time.time() - t0:.0f} s)", flush=True)
        for name, by_seed in scores.items():
            means[name].append(float(np.mean([np.mean(v) for v in by_seed.values()])))
        print(f"{split.model:5s} CV MRE " + "  ".join(f"{n}: {_over_seeds(v)}" for n, v in scores.items()), flush=True)
    if len(next(iter(means.values()))) > 1:
        print("mean over models " + "  ".join(f"{n}: {np.mean(v):.2f}%" for n, v in means.items()), flush=True)
    return 0


def _over_seeds(by_seed: dict[int, list[float]]) -> str:
    """'8.80%' for one seed; '9.10% (seeds 8.80, 9.52, 8.98)' for several."""
    per_seed = [float(np.mean(v)) for v in by_seed.values()]
    if len(per_seed) == 1:
        return f"{per_seed[0]:.2f}%"
    return f"{np.mean(per_seed):.2f}% (seeds {', '.join(f'{m:.2f}' for m in per_seed)})"


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


def _candidates(args: argparse.Namespace, ap: argparse.ArgumentParser) -> dict[str, Callable[[int], Predictor]]:
    """Name -> maker of an unfitted predictor (given a model seed) of what the command line asks to compare."""
    if args.methods:
        unknown = [m for m in args.methods.split(",") if m not in ev.METHODS]
        if unknown:
            ap.error(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(ev.METHODS)}")
        return {m: (lambda seed, m=m: ev.METHODS[m](seed)) for m in args.methods.split(",")}
    configs = ([_setting(c) for c in args.configs.split()] if args.configs
               else [{"ensemble": int(k)} for k in args.sizes.split(",")])
    return {",".join(f"{k}={v}" for k, v in c.items()): (lambda seed, c=c: ScaleDLPredictor(**{"seed": seed, **c}))
            for c in configs}


def _setting(text: str) -> dict[str, object]:
    """'use_comm=false,ensemble=5,unseen=none' -> {'use_comm': False, 'ensemble': 5, 'unseen': None}."""
    out: dict[str, object] = {}
    for item in text.split(","):
        key, _, raw = item.partition("=")
        low = raw.strip().lower()
        out[key.strip()] = (None if low == "none" else low == "true" if low in ("true", "false") else
                            int(raw) if raw.strip().lstrip("-").isdigit() else float(raw))
    return out


if __name__ == "__main__":
    sys.exit(main())
