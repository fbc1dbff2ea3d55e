"""Entry point for a Ray cluster: `ray job submit --working-dir . -- python -m orchestrator.job --spec S --out D`.

The job's driver joins the cluster it was submitted to (address "auto"), so the predictor
replicas and trials spread over its nodes; the report is written on the node running the driver
(the head, for `ray job submit`), under --out.
"""

from __future__ import annotations

import argparse
import sys

from orchestrator.commands import plan as plan_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.job", description=plan_command.HELP)
    plan_command.add_arguments(parser, spec_option=True)
    parser.set_defaults(address="auto")  # the cluster the job was submitted to
    args = parser.parse_args(argv)
    from orchestrator.cli import USER_ERRORS, UsageError
    from orchestrator.ray_cluster.address import EXIT_UNREACHABLE, ClusterUnreachable

    try:
        return plan_command.run(args)
    except (UsageError, *USER_ERRORS) as err:
        print(f"orchestrator.job: error: {err}", file=sys.stderr)
        return 2
    except ClusterUnreachable as err:
        print(f"orchestrator.job: error: {err}", file=sys.stderr)
        return EXIT_UNREACHABLE


if __name__ == "__main__":
    sys.exit(main())
