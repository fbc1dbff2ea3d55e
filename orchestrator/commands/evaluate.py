"""`scaledl evaluate`: the ScaleDL paper's in-domain / out-of-domain accuracy tables on a profile dataset."""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.cli import UsageError

HELP = "accuracy of ScaleDL and the baselines on a profile dataset (paper Table I, Fig. 5, ablations)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None, metavar="DIR", help="profile dataset directory (default: the shipped CPU dataset)")
    parser.add_argument("--methods", default="scaledl,rf,mlp-acc,birnn,analytical",
                        help="comma-separated methods; add 'ablations' for scaledl-plainsum/-nognn/-nomlp/-nocomm")
    parser.add_argument("--protocols", default="id,ood", help="id, ood or both (comma separated)")
    parser.add_argument("--families", default=None, help="restrict to these architectures (comma separated)")
    parser.add_argument("--designs", default="doptimal", help="dataset designs to use, comma separated, or 'all'")
    parser.add_argument("--train-size", type=int, default=160, help="in-domain training configurations per model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, metavar="JSON", help="also write per-split results (predictions included)")


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)  # small networks: extra threads only add contention
    from predictor.data import evaluate as ev  # lazy: torch-geometric
    from predictor.data.noise import noise_floor

    known = ev.ALL_METHODS
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    if "ablations" in names:
        names = [n for n in names if n != "ablations"] + list(ev.ABLATIONS)
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"--methods: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}, ablations")
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    if not protocols or set(protocols) - {"id", "ood"}:
        raise UsageError(f"--protocols must be id, ood or id,ood; got {args.protocols!r}")
    root = Path(args.data) if args.data else ev.CPU_DATASET
    if not root.is_dir():
        raise FileNotFoundError(f"profile dataset {root} does not exist (collect one with `scaledl profile`)")
    families = tuple(f.strip() for f in args.families.split(",")) if args.families else ev.FAMILIES
    designs = None if args.designs == "all" else tuple(d.strip() for d in args.designs.split(","))
    data = ev.load_profile_dataset(root, designs=designs, families=families)
    if not data.samples:
        raise UsageError(f"{root}: no measured iterations for families {', '.join(families)} and designs {args.designs}")
    counts = {f: sum(s.model == f for s in data.samples) for f in families}
    print(f"dataset {root}: {len(data.samples)} iterations ({', '.join(f'{k} {v}' for k, v in counts.items())}), "
          f"{len(data.layers)} layer timings")
    floor = noise_floor(root)
    print(f"measurement noise: a predictor that knew each configuration's true mean time would score {floor} "
          "(bench/noise.py): no method can be expected below that" if floor else
          "measurement noise: unknown (no re-measurements in the dataset's noise table; bench/noise.py adds them)")
    text, frame = ev.paper_tables(data, {n: known[n] for n in names}, protocols, args.seed, args.train_size, print)
    print()
    print(text)
    if args.out:
        ev.save_results(frame, args.out)
        print(f"wrote {args.out}")
    return 0
