"""`scaledl plan SPEC --out DIR`: search the parallel plans of a workload and write a ranked, explained report."""

from __future__ import annotations

import argparse
import gc

from orchestrator.cli import UsageError
from predictor.frameworks import FRAMEWORKS
from predictor.memory.facts import HEADROOM
from predictor.spec.workload import TRUST_FLAG

HELP = "search the parallel plans of a workload (Ray Tune over predictor replicas) and report the best"


def add_arguments(parser: argparse.ArgumentParser, spec_option: bool = False) -> None:
    """`spec_option`: take the spec as `--spec SPEC` (the `ray job submit` entry point) instead of positionally."""
    spec_help = "workload spec (YAML); its optional search: section narrows the space"
    if spec_option:
        parser.add_argument("--spec", required=True, help=spec_help)
    else:
        parser.add_argument("spec", help=spec_help)
    parser.add_argument("--out", required=True, metavar="DIR", help="report directory (report.json/md/html, launch/)")
    parser.add_argument("--top-k", type=int, default=10, metavar="N", help="plans shown and plotted (default 10)")
    parser.add_argument("--searcher", default="auto", choices=("auto", "exhaustive", "optuna", "random"),
                        help="auto: exhaustive up to 2,000,000 valid plans, else Optuna TPE")
    parser.add_argument("--budget-s", type=float, metavar="S", help="stop the search after S seconds (best so far is kept)")
    parser.add_argument("--max-trials", type=int, metavar="N", help="optuna/random: plan groups to try")
    parser.add_argument("--space", metavar="NAME",
                        help=f"named space or a YAML path; default: the framework's own ({', '.join(FRAMEWORKS)}); "
                             "also megatron-3d, zero-dp, full")
    parser.add_argument("--nodes", type=parse_nodes, metavar="LIST",
                        help="cluster sizes searched together: a list (32,64,128) or a range (16-128: its powers "
                             "of two); default: the spec's nodes")
    parser.add_argument("--rank-by", default="time", choices=("time", "throughput", "cost"),
                        help="days (iteration time), tokens/s per GPU, or total cost (GPU-hours times the price)")
    parser.add_argument("--price-per-gpu-hour", type=float, metavar="USD", help="adds the cost of an iteration and of the run")
    parser.add_argument("--train-tokens", type=float, metavar="N", help="tokens of the whole run: adds days and cost to train")
    parser.add_argument("--deadline-days", type=float, metavar="D", help="keep plans that train in at most D days")
    parser.add_argument("--budget-usd", type=float, metavar="B", help="keep plans that train for at most B dollars")
    parser.add_argument("--headroom", type=float, default=HEADROOM,
                        help=f"fraction of device memory kept free beyond the predicted reserved + runtime memory "
                             f"(default {HEADROOM})")
    parser.add_argument("--predictor", default="auto", metavar="analytical|auto|PATH",
                        help="analytical, auto (the device's ScaleDL checkpoint: the one `scaledl adapt` fitted to this "
                             "hardware, else the shipped one, else analytical) or a checkpoint")
    parser.add_argument("--address", metavar="ADDR", help="Ray cluster to use (default: an embedded local Ray)")
    parser.add_argument("--replicas", type=int, metavar="N", help="predictor replicas (default: one per CPU, at most 8)")
    parser.add_argument("--resume", action="store_true", help="continue the interrupted search stored in --out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--validate", type=int, default=0, metavar="K",
                        help="run the K best plans for real on the Ray cluster and report measured vs predicted")
    parser.add_argument("--dataset", metavar="DIR", help="with --validate: append the runs to this profile dataset")
    parser.add_argument("--history", metavar="sqlite:///PATH",
                        help="store the top plans' predictions for `scaledl revalidate` to re-measure later")
    add_trust_argument(parser)


def add_trust_argument(parser: argparse.ArgumentParser) -> None:
    """`--trust-module`: the one way a spec's `module:` model runs (a spec never allows it by itself)."""
    parser.add_argument(TRUST_FLAG, action="store_true",
                        help="let the spec's model.module import and call its factory (Python code the spec names: "
                             "only for a module you wrote or checked)")


def parse_nodes(text: str) -> list[int]:
    """`32,64,128` -> [32, 64, 128]; `16-128` -> the powers of two in [16, 128]."""
    try:
        if "-" in text:
            low, high = (int(x) for x in text.split("-", 1))
            sizes = [1 << k for k in range(high.bit_length()) if low <= 1 << k <= high]
        else:
            sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a list like 32,64,128 or a range like 16-128, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} names no cluster size of at least one node")
    return sorted(set(sizes))


def run(args: argparse.Namespace) -> int:
    from orchestrator.planning import PlanRequest, run_plan  # lazy: keeps `scaledl --help` and predict free of Ray

    if args.validate < 0:
        raise UsageError(f"--validate must be 0 (off) or a positive number of plans, got {args.validate}")
    for name in ("top_k", "max_trials", "replicas"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.rank_by == "cost" and args.price_per_gpu_hour is None:
        raise UsageError("--rank-by cost needs --price-per-gpu-hour")
    for name in ("train_tokens", "deadline_days", "budget_usd", "price_per_gpu_hour"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if (args.deadline_days or args.budget_usd) and args.train_tokens is None:
        raise UsageError("--deadline-days and --budget-usd need --train-tokens (the tokens of the whole run)")
    if args.budget_usd and args.price_per_gpu_hour is None:
        raise UsageError("--budget-usd needs --price-per-gpu-hour")
    if not 0 <= args.headroom < 1:
        raise UsageError(f"--headroom must be in [0, 1), got {args.headroom}")
    if args.budget_s is not None and args.budget_s <= 0:
        raise UsageError(f"--budget-s must be positive, got {args.budget_s}")
    from orchestrator.search.store import SearchError

    try:
        report = run_plan(PlanRequest(
            spec=args.spec, out=args.out, space=args.space, searcher=args.searcher, budget_s=args.budget_s,
            max_trials=args.max_trials, top_k=args.top_k, rank_by=args.rank_by, price_per_gpu_hour=args.price_per_gpu_hour,
            headroom=args.headroom, predictor=args.predictor, address=args.address, replicas=args.replicas,
            resume=args.resume, seed=args.seed, validate=args.validate, dataset=args.dataset, history=args.history,
            nodes=args.nodes, train_tokens=args.train_tokens, deadline_days=args.deadline_days, budget_usd=args.budget_usd,
            trust_module=args.trust_module))
    except SearchError as err:  # e.g. nothing to resume, a predictor that does not load: a message, no traceback
        raise UsageError(str(err)) from None
    # The process ends next: freezing the heap spares the interpreter's final garbage collection of
    # torch's and Ray's objects, seconds on two cores (the report is already on disk).
    gc.freeze()
    return 0 if report.fits else 1
