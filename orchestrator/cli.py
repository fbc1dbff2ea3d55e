"""`scaledl` command line: one subcommand per module in `orchestrator/commands/`.

Each command module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`.
Commands are discovered, so adding one never edits this file. User errors (bad spec, bad
plan, missing file) print one clear message and exit with status 2, never a traceback; a Ray cluster
that `--address` names but cannot be reached exits with status 3 (`ray_cluster.address.EXIT_UNREACHABLE`).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from orchestrator import commands
from orchestrator.ray_cluster.address import EXIT_UNREACHABLE, ClusterUnreachable
from orchestrator.ray_cluster.lifecycle import Terminated, terminating
from predictor.models.base import TrainingDataError
from predictor.plan import PlanError
from predictor.spec.workload import SpecError

USER_ERRORS: tuple[type[BaseException], ...] = (SpecError, PlanError, TrainingDataError, FileNotFoundError)


class UsageError(Exception):
    """A command-line mistake the user can fix; printed without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scaledl", description="Predict and search parallel plans of training jobs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"orchestrator.commands.{info.name}")
        cmd = sub.add_parser(info.name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run, _parser=cmd)
    return parser


def _refuse_extra(args: argparse.Namespace, extra: list[str]) -> None:
    """Unknown arguments, reported by the subcommand (its usage, not the top level's); a plan string typed
    where a spec's plans go is told how to pass it."""
    hint = ""
    if args.command == "predict" and "=" in extra[0]:
        hint = f"; pass a plan with --plan, e.g. --plan {extra[0]}"
    args._parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def main(argv: list[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    if extra:
        _refuse_extra(args, extra)
    try:
        with terminating():
            return int(args._run(args) or 0)
    except (UsageError, *USER_ERRORS) as err:
        print(f"scaledl {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ClusterUnreachable as err:
        print(f"scaledl {args.command}: error: {err}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        print(f"scaledl {args.command}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"scaledl {args.command}: terminated", file=sys.stderr)
        return 143


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: commands raise orchestrator.cli's
    # UsageError, which a class defined again in __main__ would not catch.
    from orchestrator.cli import main as _main

    sys.exit(_main())
