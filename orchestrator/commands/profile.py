"""`scaledl profile`: measure real training iterations and layer timings into a profile dataset."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from orchestrator.cli import UsageError
from predictor.measure.design import GRIDS, STRATA_SHARE, DesignError
from predictor.spec.families import PROFILED

if TYPE_CHECKING:
    from predictor.data.collect import ProfileSettings

HELP = ("measure real iterations and per-layer timings of D-optimal/random/full configurations (or of a spec's own "
        "model) into a dataset, or this cluster's device kernel profile")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--families", default=",".join(PROFILED),
                        help="comma-separated model families, measured in this order")
    parser.add_argument("--design", choices=("doptimal", "random", "full"), default="doptimal",
                        help="how configurations are chosen from each family's candidate grid")
    parser.add_argument("--label", default=None,
                        help="value of the dataset's design column (default: the --design name; the paper's "
                             "protocols read 'doptimal' rows only, so extra collections get their own label)")
    parser.add_argument("--budget", type=int, default=200, help="configurations per family (ignored by --design full)")
    parser.add_argument("--out", default=None, help="dataset directory (created; parquet part files)")
    parser.add_argument("--kernels", default=None, metavar="PATH",
                        help="measure the device kernel profile of this Ray cluster (GEMM, grouped GEMM, attention, "
                             "memory-bound, launch, collectives; one actor per node) into PATH (JSON); with --resume "
                             "an interrupted profile is completed")
    parser.add_argument("--spec", default=None, metavar="SPEC",
                        help="measure the spec's own model (any family, MoE, hf_config: models) at reduced "
                             "depth: whole iterations and every layer, micro-batches 1-8, into --out")
    parser.add_argument("--address", default=None, help="Ray cluster address for --kernels (default: a local Ray)")
    parser.add_argument("--gemm-shapes", type=int, default=24, help="GEMM shapes per precision (--kernels)")
    parser.add_argument("--grouped-shapes", type=int, default=12, help="grouped-GEMM shapes (--kernels)")
    parser.add_argument("--resume", action="store_true", help="continue a killed run: skip configurations already in --out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plans", default="", help=f"only these plan kinds ({', '.join(STRATA_SHARE)}); default all")
    parser.add_argument("--procs", type=int, default=2, help="processes available to a plan (1 or 2 on this CPU)")
    parser.add_argument("--steps", type=int, default=3, help="measured training steps per configuration")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    parser.add_argument("--layer-repeats", type=int, default=3, help="minimum repeats per layer timing")
    parser.add_argument("--no-layers", action="store_true", help="skip per-layer timings")
    parser.add_argument("--grid", choices=tuple(GRIDS), default=None,
                        help="candidate model sizes: cpu (small), cpu-large (the next decade of sizes) or gpu "
                             "(realistic); default follows --device")
    parser.add_argument("--flop-cap", type=float, default=None,
                        help="largest iteration (FLOPs) to measure; default the grid's (cpu 3e9, cpu-large 3e10, gpu 1e13)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a configuration counts as hung")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))


def run(args: argparse.Namespace) -> int:
    if args.device not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu or cuda, got {args.device!r}")
    if args.device == "cuda" and not args.address:
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA GPU on this machine (torch.cuda.is_available() is False); "
                             "run on a GPU machine, give a GPU cluster's --address, or use --device cpu")
    if not (args.kernels or args.out):
        raise UsageError("give --out DIR (a profile dataset), --kernels PATH (a device kernel profile), or both")
    status = 0
    if args.kernels:
        status = run_kernels(args)
    if args.out and args.spec:
        status = max(status, run_spec(args))
    elif args.out:
        status = max(status, run_families(args))
    return status


def run_families(args: argparse.Namespace) -> int:
    from predictor.data.collect import ProfileError, select  # pandas: not on every command's start

    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in PROFILED]
    if not families or unknown:
        raise UsageError(f"--families: unknown or unsupported {', '.join(unknown) or '(none)'}; "
                         f"use any of {', '.join(PROFILED)}, or --spec SPEC for any other model")
    for name in ("budget", "steps", "procs", "layer_repeats"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    strata = [s.strip() for s in args.plans.split(",") if s.strip()]
    bad = [s for s in strata if s not in STRATA_SHARE]
    if bad:
        raise UsageError(f"--plans: unknown plan kinds {', '.join(bad)}; use {', '.join(STRATA_SHARE)}")
    try:
        grid = args.grid or ("cpu" if args.device == "cpu" else "gpu")
        configs = select(families, args.design, args.budget, args.seed, args.procs, strata or None, args.flop_cap, grid, args.label)
        return run_with_progress(configs, args.out, args.resume, settings_of(args))
    except (ProfileError, DesignError) as err:
        raise UsageError(str(err)) from None


def settings_of(args: argparse.Namespace) -> "ProfileSettings":
    from predictor.data.collect import ProfileSettings

    return ProfileSettings(steps=args.steps, warmup=args.warmup, layer_repeats=args.layer_repeats,
                           layers=not args.no_layers, timeout_s=args.timeout, device=args.device, dtype=args.dtype,
                           procs=args.procs)


def run_spec(args: argparse.Namespace) -> int:
    """The spec's own model, cut to a few blocks, at single-process micro-batches: iterations and layers."""
    from predictor.data.collect import ProfileError, spec_configs
    from predictor.spec.workload import SpecError, load_spec

    try:
        spec = load_spec(args.spec)
        configs = spec_configs(spec, args.label or "spec")
        return run_with_progress(configs, args.out, args.resume, settings_of(args))
    except (ProfileError, SpecError, OSError) as err:
        raise UsageError(str(err)) from None


def run_kernels(args: argparse.Namespace) -> int:
    """The device kernel profile of the cluster, with a progress bar per section."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from orchestrator.kernel_profile import profile_cluster
    from predictor.kernels.profile import ProfileError as FormatError
    from predictor.measure.kernel_profile import KernelProfileError, machine

    for name in ("gemm_shapes", "grouped_shapes"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    console = Console(stderr=True)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, disable=not console.is_terminal)
    task = progress.add_task("kernel profile", total=None)

    def on_section(key: str, done: int, total: int) -> None:
        progress.update(task, total=total, completed=done, description=f"kernel profile: {key}")
        if not console.is_terminal:
            print(f"[{done}/{total}] {key}", flush=True)

    try:
        with progress:
            profile = profile_cluster(args.device, args.kernels, args.resume, args.address, args.gemm_shapes,
                                      args.grouped_shapes, args.procs, args.seed, on_section)
    except (KernelProfileError, FormatError, DesignError) as err:
        raise UsageError(str(err)) from None
    measured = sorted(set(profile["sources"]) - {"provenance", "machine"})
    print(f"kernel profile of {profile['device']} ({len(machine(profile)['nodes'])} node(s)): "
          f"{len(measured)} sections measured, {len(profile['missing'])} missing "
          f"({'; '.join(f'{k}: {v}' for k, v in profile['missing'].items()) or 'none'}); wrote {args.kernels}")
    return 0


def run_with_progress(configs: list, out: str, resume: bool, settings: "ProfileSettings") -> int:
    """Measure `configs` into `out` with a progress bar (a log file gets a line per configuration);
    0 unless most configurations failed."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from predictor.data.collect import run_profile

    console = Console(stderr=True)
    interactive = console.is_terminal
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("ETA"), TimeRemainingColumn(), console=console, disable=not interactive)
    task = progress.add_task("profiling", total=None)

    def on_config(cfg, row, done: int, total: int) -> None:
        progress.update(task, total=total, completed=done, description=f"{cfg.family} {row['status']}")
        if not interactive:  # a log file gets one line per configuration
            print(f"[{done}/{total}] {cfg.family} {cfg.config_id} batch={cfg.batch} {cfg.plan} "
                  f"{row['status']} iter={row['iter_time_s']:.4f}s peak={row['peak_mem_bytes'] / 2**20:.0f}MiB "
                  f"{row['error'][:200]}", flush=True)

    with progress:
        summary = run_profile(configs, out, resume, settings, on_config)
    print(f"profile: {summary.measured} measured ({summary.by_status}), {summary.skipped} already in {out}, "
          f"{summary.seconds:.0f} s", file=sys.stderr if interactive else sys.stdout)
    return 0 if summary.failed < max(1, summary.measured) else 1
