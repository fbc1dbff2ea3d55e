"""`scaledl train`: fit the ScaleDL predictor on measurements and write a checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.cli import UsageError

HELP = "train the ScaleDL predictor on a profile dataset (or vTrain single-node CSV) and save a checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, metavar="DIR|CSV",
                        help="profile dataset directory (e.g. predictor/data/cpu) or a vTrain single-node CSV (A100)")
    parser.add_argument("--out", required=True, metavar="FILE", help="checkpoint to write, e.g. predictor/checkpoints/scaledl-cpu.pt")
    parser.add_argument("--designs", default="doptimal", help="dataset designs to train on, comma separated, or 'all'")
    parser.add_argument("--epochs", type=int, default=200, help="training epochs of the correction network")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)  # small networks: extra threads only add contention
    from predictor.evaluate import load_cpu_dataset, load_vtrain  # lazy: torch-geometric
    from predictor.models.features import TrainingData
    from predictor.models.scaledl import ScaleDLPredictor

    src = Path(args.data)
    if not src.exists():
        raise FileNotFoundError(f"--data {src} does not exist")
    if src.is_file():
        if src.suffix != ".csv":
            raise UsageError(f"--data {src}: a file must be a vTrain CSV (.csv); a profile dataset is a directory")
        samples = load_vtrain(src)
        data = TrainingData(samples, provenance={"source": str(src), "device": samples[0].spec.cluster.device if samples else ""})
    else:
        designs = None if args.designs == "all" else tuple(d.strip() for d in args.designs.split(","))
        data = load_cpu_dataset(src, designs=designs)
    if not data.samples:
        raise UsageError(f"--data {src}: no usable measured iterations (designs={args.designs})")
    print(f"training ScaleDL on {len(data.samples)} iterations and {len(data.layers)} layer timings from {src}")
    model = ScaleDLPredictor(epochs=args.epochs, seed=args.seed).fit(data)
    model.save(args.out)
    print(f"wrote {args.out} ({Path(args.out).stat().st_size / 1024:.0f} KiB)")
    return 0
