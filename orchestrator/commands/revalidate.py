"""`scaledl revalidate`: re-measure stored predictions on this cluster and alert on drift."""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from orchestrator.cli import UsageError

HELP = ("re-measure stored predictions on the live cluster, record them in SQLite and alert on drift; or, with "
        "--kernels, compare a device kernel profile with fresh measurements and say when to re-profile")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--history", default=None, metavar="sqlite:///PATH", help="the history database")
    parser.add_argument("--kernels", default=None, metavar="PATH",
                        help="instead of predictions, re-measure a sample of this kernel profile's points (written by "
                             "`scaledl profile --kernels`) and alert when they moved more than --threshold")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="one round, then exit (cron); the default")
    when.add_argument("--every", metavar="DURATION", help="a round every DURATION (6h, 30m, 90s), forever (ray job)")
    parser.add_argument("--sample", type=int, default=6, metavar="N", help="predictions re-measured per round (default 6)")
    parser.add_argument("--threshold", type=float, default=0.1,
                        help="alert when the rolling mean |relative time error| passes this (default 0.1)")
    parser.add_argument("--window", type=int, default=20, help="rows in the rolling error (default 20)")
    parser.add_argument("--device", default=None,
                        help="device name of the stored predictions this cluster re-measures (default: cpu without GPUs)")
    parser.add_argument("--dataset", default=None, metavar="DIR", help="also append the runs to this profile dataset")
    parser.add_argument("--retrain", action="store_true",
                        help="after a round, fine-tune the checkpoint on --dataset (fit one if none exists); "
                             "swap it only if the error on a held-out slice of the history improves")
    parser.add_argument("--checkpoint", default=None, metavar="PATH",
                        help="checkpoint --retrain replaces (default: the shipped one of --device)")
    parser.add_argument("--address", default=None, help="Ray cluster address (default: a local Ray)")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per run (default 3)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up steps per run (default 2)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="a run still going after this is killed")
    parser.add_argument("--seed", type=int, default=None, help="seed of the random part of the sample")


def run(args: argparse.Namespace) -> int:
    from orchestrator.revalidation.history import History, HistoryError
    from orchestrator.revalidation.retrain import retrain
    from orchestrator.revalidation.rounds import parse_every, print_round, run_round
    from orchestrator.ray_cluster.connect import connect_ray, default_device
    from predictor.models.registry import checkpoint_path

    if args.kernels:
        return run_kernels(args)
    if not args.history:
        raise UsageError("give --history sqlite:///PATH (stored predictions to re-measure) or --kernels PATH (a "
                         "kernel profile to compare with fresh measurements)")
    if args.sample < 1:
        raise UsageError(f"--sample must be at least 1, got {args.sample}")
    if args.retrain and not args.dataset:
        raise UsageError("--retrain needs --dataset DIR: the profile dataset the rounds append to and ScaleDL is fine-tuned on")
    if args.window < 1:
        raise UsageError(f"--window must be at least 1, got {args.window}")
    if args.threshold <= 0:
        raise UsageError(f"--threshold must be positive, got {args.threshold}")
    try:
        interval = parse_every(args.every) if args.every else None
        history = History.open(args.history)
    except (ValueError, HistoryError) as err:
        raise UsageError(str(err)) from None
    connect_ray(args.address)
    device = args.device or default_device()
    if device is None:
        raise UsageError("this Ray cluster has GPUs: say which device they are with --device (e.g. --device h200)")
    # Ctrl-C ends the command, not only the round in progress: Ray Tune would take it as "stop this
    # run", the round would be recorded with its runs stopped, and --every would go on to the next.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    rng = random.Random(args.seed)
    options = {"steps": args.steps, "warmup": args.warmup, "timeout_s": args.timeout_s}
    with history:
        while True:
            started = time.monotonic()
            report = run_round(history, args.sample, device, args.threshold, args.window, rng, options, args.dataset)
            print_round(report, args.threshold)
            if args.retrain and report.round_id is not None:
                print(retrain(history, args.checkpoint or checkpoint_path(device), args.dataset).message)
            if interval is None:
                return 1 if report.drifted else 0
            # A long-lived job keeps watching after an alert; the alert is in its log.
            sys.stdout.flush()
            time.sleep(max(0.0, interval - (time.monotonic() - started)))


def run_kernels(args: argparse.Namespace) -> int:
    """Compare the kernel profile with fresh measurements of a sample of its points; 1 when it should be re-measured."""
    from rich.console import Console
    from rich.table import Table

    from orchestrator.kernel_profile import recheck_cluster
    from predictor.kernels.profile import ProfileError
    from predictor.measure.kernel_profile import KernelProfileError

    if args.threshold <= 0:
        raise UsageError(f"--threshold must be positive, got {args.threshold}")
    try:
        rechecks, changed, kind = recheck_cluster(args.kernels, args.address, seed=args.seed or 0)
    except (KernelProfileError, ProfileError) as err:
        raise UsageError(str(err)) from None
    table = Table(title=f"{args.kernels}: fresh / stored figures")
    for col in ("section", "points", "median |change|", "range of fresh / stored"):
        table.add_column(col)
    for r in rechecks:
        table.add_row(r.section, str(len(r.ratios)), f"{100 * r.deviation:.1f}%", f"{min(r.ratios):.2f}-{max(r.ratios):.2f}")
    Console().print(table)
    moved = [r for r in rechecks if r.deviation > args.threshold]
    for line in changed:
        print(f"changed since the profile was measured: {line}")
    if moved or changed:
        what = ", ".join(f"{r.section} ({100 * r.deviation:.0f}%)" for r in moved) or "the machine"
        print(f"RE-PROFILE: {what} moved past the {100 * args.threshold:.0f}% threshold; measure the profile again: "
              f"scaledl profile --device {kind} --kernels NEW_PATH",
              file=sys.stderr)
        return 1
    print(f"the profile still describes this cluster: every section within {100 * args.threshold:.0f}%")
    return 0
