"""The ScaleDL paper's accuracy tables on the shipped CPU dataset: every method, ID + OOD, ablations.

    nice -n 10 .venv/bin/python -m bench.paper_table [--data predictor/data/cpu] [--out results.json]

Prints Table I (in-domain, per model 160 train / 40 test, seeded), the out-of-domain table
(leave one architecture out) and Fig. 5 (OOD averages), with ScaleDL, the paper's baselines
(RF on hyper-parameters, MLP-ACC, BiRNN), the analytical model and the ablations (plain sum
instead of the GNN, no graph branch, no global MLP, no communication model). With
`--seeds 0,1,2` it runs once per seed and ends with each method's mean and spread over the seeds:
one seeded split moves the figures by a point or more.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import torch

from bench import common
from predictor.data import evaluate as ev


def main() -> int:
    ap = common.parser(__doc__)
    ap.add_argument("--data", type=Path, default=ev.CPU_DATASET)
    ap.add_argument("--protocols", default="id,ood")
    ap.add_argument("--no-ablations", action="store_true")
    ap.add_argument("--methods", help="only these methods (comma separated names, ablations included)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", help="comma-separated seeds instead: run once per seed (other in-domain splits and "
                                    "initialisations) and end with each method's mean and spread over them")
    ap.add_argument("--out", type=Path, default=None, help="per-split results as JSON")
    args = ap.parse_args()
    torch.set_num_threads(1)  # small networks: threads only add contention on a shared machine
    data = ev.load_profile_dataset(args.data)
    print(f"{args.data}: {len(data.samples)} iterations, {len(data.layers)} layer timings; "
          + ", ".join(f"{f} {sum(s.model == f for s in data.samples)}" for f in ev.FAMILIES), flush=True)
    known = ev.ALL_METHODS
    methods = dict(ev.METHODS) if args.no_ablations else known
    if args.methods:
        wanted = args.methods.split(",")
        unknown = [m for m in wanted if m not in known]
        if unknown:
            ap.error(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(known)}")
        methods = {m: known[m] for m in wanted}
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    frames = {}
    for seed in seeds:
        t0 = time.time()
        text, frames[seed] = ev.paper_tables(data, methods, args.protocols.split(","), seed,
                                             log=lambda m: print(m, flush=True))
        print(f"\n(seed {seed}, evaluated in {time.time() - t0:.0f} s)\n")
        print(text, flush=True)
    if len(seeds) > 1:
        print("\n" + ev.format_seed_spread(frames))
    if args.out:
        ev.save_results(pd.concat([f.assign(seed=s) for s, f in frames.items()], ignore_index=True), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
