"""`scaledl train`: fit the ScaleDL predictor on measurements and write a checkpoint, or fine-tune one
(`--update`) on a dataset that has grown, e.g. by `scaledl plan --validate K --dataset DIR` runs.

A seeded share of each architecture's configurations (`--holdout`) is never trained on: the
checkpoint records its error on them, and reports show that figure as the predictor's accuracy.
`--update` keeps the current checkpoint when fine-tuning makes the held-out error worse.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.cli import UsageError

HELP = "train the ScaleDL predictor on a profile dataset (or vTrain single-node CSV) and save a checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, metavar="DIR|CSV",
                        help="profile dataset directory (e.g. predictor/data/cpu) or a vTrain single-node CSV (A100)")
    parser.add_argument("--out", metavar="FILE", help="checkpoint to write, e.g. predictor/checkpoints/scaledl-cpu.pt "
                                                     "(with --update: default the updated checkpoint itself)")
    parser.add_argument("--update", metavar="CHECKPOINT",
                        help="fine-tune this checkpoint on --data instead of training from scratch (active learning)")
    parser.add_argument("--designs", help="dataset designs to train on, comma separated, or 'all' "
                                          "(default: doptimal; with --update: all, which includes validation runs)")
    parser.add_argument("--holdout", type=float, default=0.2,
                        help="share of each architecture's configurations held out to measure the accuracy (default 0.2)")
    parser.add_argument("--epochs", type=int, help="training epochs of the correction network (default 800; the best "
                                                   "epoch on a 15%% validation split is kept, or below 100 iterations "
                                                   "the count 3-fold cross-validation picks; --update: 60)")
    parser.add_argument("--ensemble", type=int, default=None, metavar="K",
                        help="correction networks trained apart and averaged for the model families in --data (default "
                             "3; K times slower to train). Families not in --data go to a companion with operator "
                             "costs and one network, trained alongside when --data has layer timings ("
                             "docs/learned-predictor.md)")
    parser.add_argument("--calibrate", action="store_true",
                        help="GPU data: fit the framework's fixed costs (host time per operator, per collective call) "
                             "before the corrections; small models on a GPU are host-bound (docs/learned-predictor.md)")
    parser.add_argument("--op-costs", action="store_true",
                        help="price the layers that are not matrix products by their eager operators (a cost per call "
                             "and per element fitted on the layer timings) instead of their roofline for every family, "
                             "not only for those outside --data, with no companion: in cross-validation worse on the "
                             "families trained on (docs/learned-predictor.md)")
    parser.add_argument("--seed", type=int, default=0)


# Options that shape a checkpoint as it is first trained -> what `--update` keeps of the checkpoint instead.
_NEW_CHECKPOINT_ONLY = {"ensemble": "networks", "calibrate": "fixed costs", "op_costs": "layer bases"}


def _load(src: Path, designs_arg: str):  # noqa: ANN202 - TrainingData, imported lazily (torch-geometric)
    from predictor.data.evaluate import load_profile_dataset, load_vtrain
    from predictor.models.features import TrainingData

    if not src.exists():
        raise FileNotFoundError(f"--data {src} does not exist")
    if src.is_file():
        if src.suffix != ".csv":
            raise UsageError(f"--data {src}: a file must be a vTrain CSV (.csv); a profile dataset is a directory")
        samples = load_vtrain(src)
        return TrainingData(samples, provenance={"source": str(src), "device": samples[0].spec.cluster.device if samples else ""})
    designs = None if designs_arg == "all" else tuple(d.strip() for d in designs_arg.split(","))
    return load_profile_dataset(src, designs=designs, families=None)


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)  # small networks: extra threads only add contention
    from predictor.data.evaluate import accuracy_of, holdout_source, holdout_split
    from predictor.models.scaledl import ENSEMBLE, UNSEEN, ScaleDLPredictor

    if args.ensemble is not None and args.ensemble < 1:
        raise UsageError(f"--ensemble {args.ensemble}: give at least 1 network")
    for option, kept in _NEW_CHECKPOINT_ONLY.items():
        if args.update and getattr(args, option) not in (None, False):
            raise UsageError(f"--{option.replace('_', '-')} applies to a new checkpoint; --update keeps the "
                             f"checkpoint's own {kept}")
    if not 0 <= args.holdout < 1:
        raise UsageError(f"--holdout {args.holdout}: give a share in [0, 1), e.g. 0.2")
    if args.update is None and args.out is None:
        raise UsageError("--out FILE is required (the checkpoint to write), unless --update CHECKPOINT is given")
    out = Path(args.out or args.update)
    src = Path(args.data)
    designs = args.designs or ("all" if args.update else "doptimal")
    data = _load(src, designs)
    if not data.samples:
        raise UsageError(f"--data {src}: no usable measured iterations (designs={designs})")
    if args.op_costs and not data.layers:
        raise UsageError(f"--op-costs fits operator costs on layer timings, and --data {src} has none (a profile "
                         "dataset directory has them; a vTrain CSV does not): train without --op-costs")
    if args.update:
        return _update(args, data, src, out)
    train, held = holdout_split(data, args.holdout, args.seed) if args.holdout else (data, [])
    print(f"training ScaleDL on {len(train.samples)} iterations and {len(train.layers)} layer timings from {src}"
          + (f"; {len(held)} held out" if held else ""))
    model = ScaleDLPredictor(epochs=args.epochs or 800, seed=args.seed, ensemble=args.ensemble or ENSEMBLE,
                             calibrate=args.calibrate, op_costs=args.op_costs,
                             unseen=None if args.op_costs else UNSEEN).fit(train)
    if args.calibrate:
        print("fitted fixed costs: " + ", ".join(f"{k} {v * 1e6:.1f} µs" for k, v in model.fixed_costs_s.items()))
    if model.companion is not None:
        print(f"families {', '.join(model.domain.seen['family'])}: {model.config['ensemble']} correction network(s); "
              "any other family: the companion with operator costs")
    if held:
        model.provenance["accuracy"] = accuracy_of(model, held, holdout_source(src, args.holdout, args.seed))
        print(f"held-out error: {model.accuracy['mape_pct']:.1f}% MAPE, RMSE {model.accuracy['rmse_ms']:.1f} ms "
              f"over {len(held)} configurations")
    model.save(out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0


def _update(args: argparse.Namespace, data, src: Path, out: Path) -> int:  # noqa: ANN001 - TrainingData (lazy import)
    from predictor.data.finetune import fine_tune
    from predictor.models.scaledl import ScaleDLPredictor

    tuned = fine_tune(ScaleDLPredictor.load(args.update), data, src, args.holdout, args.seed, args.epochs or 60)
    print(f"fine-tuned {args.update} on {tuned.trained_on} iterations from {src}"
          + (f"; {tuned.held_out} held out" if tuned.held_out else ""))
    print(tuned.summary())
    if not tuned.improved:
        print(f"kept {args.update}: the update made the held-out error worse")
        return 0
    tuned.model.save(out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0
