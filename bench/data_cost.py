"""Data cost of ScaleDL (paper Fig. 6): test MRE against the number of measured training configurations.

    nice -n 10 .venv/bin/python -m bench.data_cost [--family bert] [--png bench/results/data_cost.png]

Pool: every measured configuration of one architecture (the full BERT grid, plus its D-optimal
rows). A seeded 20 % of the pool is the fixed test set; from the rest, training sets of k
configurations are chosen D-optimally (`predictor.measure.design.choose`, Fedorov exchange per plan
kind) or uniformly at random, and 'full' trains on the whole remaining pool. Every training set is
fitted with each model seed (`--model-seeds`, default 0) and scored on their mean. The default
ScaleDL already averages three correction networks, which removes most of the half point to a
point that one network's error moved between seeds (as much as the designs differ); one seed
takes about 25 minutes on a 2-core machine, each further seed as long. Both designs split
k over plan kinds in the pool's own proportions (the test set's, up to sampling): the profile
collection's default shares (half single-process, a tenth per 2-process kind) would train on
another mix than the one scored. ScaleDL models per (design, k) scored on the same test set.
Prints a table and writes a PNG.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from bench import common
from predictor.data import evaluate as ev
from predictor.measure.design import ProfileConfig, choose, strata_proportions
from predictor.models.scaledl import ScaleDLPredictor
from predictor.spec.workload import ModelSpec


def main() -> int:
    ap = common.parser(__doc__)
    ap.add_argument("--data", type=Path, default=ev.CPU_DATASET)
    ap.add_argument("--family", default="bert")
    ap.add_argument("--sizes", default="10,20,40,80,160", help="training-set sizes to try (comma separated)")
    ap.add_argument("--seeds", type=int, default=2, help="random designs are averaged over this many seeds")
    ap.add_argument("--model-seeds", default="0",
                    help="ScaleDL seeds each training set is fitted with, comma separated (its score is their mean)")
    ap.add_argument("--png", type=Path, default=Path(__file__).resolve().parent / "results" / "data_cost.png")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model_seeds = [int(x) for x in args.model_seeds.split(",")]

    # The measured grid and the D-optimal picks (not doptimal-large or validation rows): the pool the
    # data-cost comparison draws from.
    data = ev.load_profile_dataset(args.data, designs=("doptimal", "full"), families=(args.family,))
    order = np.random.default_rng(0).permutation(len(data.samples))
    n_test = max(1, len(data.samples) // 5)
    test_ids = {data.samples[i].config_id for i in order[:n_test]}
    pool = [s for s in data.samples if s.config_id not in test_ids]
    test = [s for s in data.samples if s.config_id in test_ids]
    configs = [ProfileConfig(ModelSpec.model_validate(s.spec.model.model_dump()), s.spec.training.global_batch, s.plan)
               for s in pool]
    ids = [s.config_id for s in pool]
    true = np.asarray([s.iter_time_s for s in test])
    shares = strata_proportions(configs)
    print(f"{args.family}: pool {len(pool)} configurations, test {len(test)} (seeded 20 %), "
          f"{len(data.layers)} layer timings, model seeds {args.model_seeds}; plan kinds in the pool: "
          + ", ".join(f"{s} {share:.0%}" for s, share in sorted(shares.items(), key=lambda x: -x[1])), flush=True)

    def score(chosen_ids: list[str]) -> float:
        keep = set(chosen_ids)
        train = ev.subset(data, lambda s: s.config_id in keep)
        # one family, trained and tested: the companion for unseen families would never answer
        return float(np.mean([ev.mre(ev.predict_samples(ScaleDLPredictor(seed=seed, unseen=None).fit(train), test)[0], true)
                              for seed in model_seeds]))

    full = score(ids)
    sizes = [k for k in (int(x) for x in args.sizes.split(",")) if k < len(pool)]
    rows = []
    for k in sizes:
        dopt = score([ids[configs.index(c)] for c in choose(configs, k, "doptimal", seed=0, shares=shares)])
        rand = float(np.mean([score([ids[configs.index(c)] for c in choose(configs, k, "random", seed=s, shares=shares)])
                              for s in range(args.seeds)]))
        rows.append((k, dopt, rand))
        print(f"  k={k:4d}  D-optimal {dopt:6.2f}%  random {rand:6.2f}%  (full {full:.2f}%)", flush=True)

    print(f"\nData cost, {args.family}: test MRE % vs training configurations (full pool = {len(pool)})")
    print(f"{'k':>6s}{'D-optimal':>12s}{'random':>10s}{'full':>8s}")
    for k, d, r in rows:
        print(f"{k:6d}{d:12.2f}{r:10.2f}{full:8.2f}")
    within = [k for k, d, _ in rows if d <= full + 1.0]
    print(f"smallest D-optimal k within 1 point of full: {within[0] if within else 'none'} "
          f"({within[0] / len(pool):.2f} of the pool)" if within else "no D-optimal size reached full-data accuracy ±1 point")
    _plot(rows, full, len(pool), args.family, args.png)
    return 0


def _plot(rows, full: float, pool: int, family: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(ks, [r[1] for r in rows], "o-", label="D-optimal")
    ax.plot(ks, [r[2] for r in rows], "s--", label="random")
    ax.axhline(full, color="k", lw=1, label=f"full ({pool})")
    ax.set_xscale("log")
    ax.set_xlabel("training configurations")
    ax.set_ylabel("test MRE (%)")
    ax.set_title(f"ScaleDL data cost ({family}, CPU)")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
