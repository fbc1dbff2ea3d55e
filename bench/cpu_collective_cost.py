"""What a collective costs inside a CPU training step, against the idle α-β link: the device profile's step costs.

    .venv/bin/python -m bench.cpu_collective_cost [--runs 3]   # on an otherwise idle machine; ~15 s a run

Measures the idle link (`predictor.measure.collectives`, best of five calls after a barrier) and the
in-step costs (`predictor.measure.contention`, means over 400 calls between matmuls) `runs` times and
prints, per run, what the analytical model charges per call on this machine (`Device.extra`): a 16 KiB
all-reduce and send/recv at rest and inside a step, and DTensor's cost per sharded linear. Their spread
over runs is the measurement's noise on this host.
"""

from __future__ import annotations

import time

from bench import common
from predictor.measure.collectives import benchmark_collectives, fit_link, fit_op_links
from predictor.measure.contention import idle_seconds, measure_step_costs


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"# .venv/bin/python -m bench.cpu_collective_cost --runs {args.runs}   ({time.strftime('%d %b %Y %H:%M UTC', time.gmtime())})")
    print(f"{'run':>3} {'all-reduce idle':>16} {'in step':>8} {'send/recv idle':>15} {'in step':>8} {'DTensor linear':>15}   (ms)")
    for run in range(args.runs):
        points = benchmark_collectives()
        costs = measure_step_costs(runs=1)
        idle_ar, idle_p2p = idle_seconds(fit_link(points), fit_op_links(points), costs["bytes"])
        print(f"{run:>3} {idle_ar * 1e3:>16.3f} {costs['collective_s'] * 1e3:>8.3f} {idle_p2p * 1e3:>15.3f} "
              f"{costs['p2p_s'] * 1e3:>8.3f} {costs['tp_linear_s'] * 1e3:>15.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
