"""`scaledl adapt`: fit the CPU checkpoint to this machine, in one command.

`cpu` is whatever machine runs the prediction, and a checkpoint learned on one CPU model is off on
another: the shipped one, trained on an Intel Xeon, was 26 % off on an AMD EPYC; fine-tuned on 40 of
that machine's runs, 9 % (bench/results/transfer.txt). `adapt` does that: it measures random
configurations of the five model families on this machine (whole iterations only, about a minute
for the default 40), fine-tunes the checkpoint on them as `scaledl train --update` does, with a
seeded fifth held out to judge the update, and keeps the result in the user's cache
(`$SCALEDL_CACHE`), where `--predictor auto` takes it on this hardware. The measurements are kept
there too: an interrupted run resumes, and a larger `--budget` measures only what is new.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.cli import UsageError
from orchestrator.commands.profile import run_with_progress
from predictor.measure.design import DesignError
from predictor.measure.machine import hardware_slug
from predictor.models.registry import adapted_checkpoint_path, checkpoint_path

HELP = "fit the CPU checkpoint to this machine: measure short runs here, fine-tune, and let `auto` use the result"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", metavar="FILE", help=f"checkpoint to fine-tune (default the shipped "
                                                             f"{checkpoint_path('cpu').name})")
    parser.add_argument("--budget", type=int, default=8,
                        help="random configurations measured per model family (default 8: 40 runs, about a minute)")
    parser.add_argument("--holdout", type=float, default=0.2,
                        help="share of each family's runs held out to judge the update (default 0.2)")
    parser.add_argument("--epochs", type=int, default=60, help="fine-tuning epochs of the correction network")
    parser.add_argument("--procs", type=int, default=2, help="processes available to a plan (1 or 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the configurations drawn and of the holdout")
    parser.add_argument("--data", metavar="DIR", help="where the runs are measured and kept (default: "
                                                      "$SCALEDL_CACHE/adapt/<this CPU model>)")
    parser.add_argument("--out", metavar="FILE", help="checkpoint to write (default: where `auto` looks for this "
                                                      "hardware, $SCALEDL_CACHE/checkpoints/)")
    parser.add_argument("--force", action="store_true",
                        help="fine-tune even when the checkpoint was trained on this hardware already")


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)  # small networks: extra threads only add contention
    from predictor.data.collect import ProfileError, ProfileSettings, select
    from predictor.data.evaluate import FAMILIES, load_profile_dataset
    from predictor.data.finetune import fine_tune
    from predictor.measure.device import cache_dir, measured_cpu, save_cpu_profile
    from predictor.models.scaledl import ScaleDLPredictor

    for name in ("budget", "epochs", "procs"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.holdout < 1:
        raise UsageError(f"--holdout {args.holdout}: give a share in [0, 1), e.g. 0.2")
    checkpoint = Path(args.checkpoint or checkpoint_path("cpu"))
    if not checkpoint.is_file():
        raise FileNotFoundError(f"--checkpoint {checkpoint} does not exist")
    device = measured_cpu()  # measures this machine on first use (about 45 s)
    hardware = device.model
    model = ScaleDLPredictor.load(checkpoint)
    if model.domain is not None and not model.domain.outside_hardware(device) and not args.force:
        print(f"{checkpoint} was trained on this hardware ({hardware}) already: nothing to adapt "
              "(--force fine-tunes it anyway)")
        return 0
    data_dir = Path(args.data or cache_dir() / "adapt" / hardware_slug(hardware))
    out = Path(args.out or adapted_checkpoint_path("cpu", hardware))
    try:
        configs = select(list(FAMILIES), "random", args.budget, args.seed, args.procs, None, None, "cpu-large", "adapt")
    except (ProfileError, DesignError) as err:
        raise UsageError(str(err)) from None
    print(f"measuring {len(configs)} configurations on this machine ({hardware}) into {data_dir}", flush=True)
    run_with_progress(configs, str(data_dir), True, ProfileSettings(layers=False, procs=args.procs))
    save_cpu_profile(data_dir / "device.json")
    data = load_profile_dataset(data_dir, designs=None, with_layers=False)
    if not data.samples:
        raise UsageError(f"no configuration measured successfully in {data_dir}: see the lines above")
    tuned = fine_tune(model, data, data_dir, args.holdout, args.seed, args.epochs)
    print(f"fine-tuned {checkpoint} on {tuned.trained_on} runs of this machine; {tuned.summary()}")
    if not tuned.improved:
        print(f"wrote nothing: the update made the held-out error worse, and `--predictor auto` goes on using "
              f"{checkpoint}; measure more runs (e.g. --budget {2 * args.budget}) and run `scaledl adapt` again")
        return 1
    tuned.model.save(out)
    use = f"`--predictor {out}`" if args.out else f"`--predictor auto` (the default) uses it on this hardware ({hardware})"
    print(f"wrote {out}: {use}")
    return 0
