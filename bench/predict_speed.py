"""Prediction throughput on a GPT-3 175B workload: plans predicted per second, analytical vs ScaleDL.

    nice -n 10 .venv/bin/python -m bench.predict_speed [--checkpoint predictor/checkpoints/experimental/scaledl-a100-80gb-single-node.pt]
    .venv/bin/python -m bench.predict_speed --sizes 10000,100000,1000000

With --sizes: how cost grows with the space. For each size, a fresh process enumerates that many valid plans of the
`full` space (the spec's cluster, then halved and doubled node counts until there are enough), predicts them cold
with the analytical model in calls of a replica's chunk (8,192), and reports plans/s (enumeration apart) and its
peak RSS. Otherwise:

The plans are the valid plans of the `full` search space for examples/gpt3-175b-a100x1024.yaml (ZeRO,
recomputation, sequence parallelism, schedules included), predicted in calls of --n plans as the search's
replica actors make them, each predictor fresh:
- cold: every plan once, in order: the rate of a first search through the space (each predictor piece is
  computed when the first plan that needs it arrives);
- warm: the same plans again: the rate once the pieces are known (another cluster size's replica, a
  resumed or repeated search);
- objects: warm, but as `Prediction` objects (`predict`) instead of the columns a search ranks
  (`predict_table`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence


from bench import common
from bench.common import ROOT
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.base import Predictor
from predictor.models.registry import checkpoint_path
from predictor.plan import Plan
from predictor.spec.workload import load_spec
from search_spaces.enumerate import enumerate_plans
from search_spaces.space import load_space


def rate(call: Callable[[Sequence[Plan]], object], plans: list[Plan], n: int) -> tuple[float, float]:
    """(plans per wall second, per CPU second of this process) predicting `plans` in calls of `n`.

    The CPU-second rate is what an unshared core delivers; the wall rate depends on the load."""
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(plans), n):
        call(plans[i:i + n])
    return len(plans) / (time.perf_counter() - t0), len(plans) / (time.process_time() - c0)


CHUNK = 8192  # plans per call, as a search's replica receives them (orchestrator.search.replica.MAX_CHUNK)


def _node_counts(nodes: int) -> list[int]:
    """The spec's node count, then halved and doubled in turn (64 and 256 after 128, ...)."""
    out = [nodes]
    for k in range(1, 12):
        out += [nodes >> k] if (nodes >> k) << k == nodes and nodes >> k else []
        out.append(nodes << k)
    return out


def one_size(spec_path: Path, count: int) -> dict[str, float]:
    """Enumerate and predict `count` valid plans here (see the module doc); the figures, peak RSS included."""
    import resource

    from orchestrator.planning import sized_spec
    from predictor.graph.cache import graph_for as graph_of

    spec = load_spec(spec_path)
    graph, model = graph_of(spec.model), AnalyticalPredictor()
    start = time.perf_counter()
    parts, total = [], 0
    for nodes in _node_counts(spec.cluster.nodes):
        if total >= count:
            break
        sized = sized_spec(spec, nodes)
        plans = enumerate_plans(sized, load_space("full")).plans[: count - total]
        parts.append((sized, plans))
        total += len(plans)
    enumerated = time.perf_counter() - start
    t0, c0 = time.perf_counter(), time.process_time()
    for sized, plans in parts:
        for i in range(0, len(plans), CHUNK):
            model.predict_table(sized, graph, plans[i:i + CHUNK])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"plans": total, "sizes": len(parts), "enumerate_s": enumerated, "predict_s": wall,
            "plans_per_s": total / wall, "plans_per_cpu_s": total / cpu,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def growth(spec_path: Path, sizes: list[int]) -> None:
    """`one_size` of each size in a fresh process (so each peak RSS is its own), as a table."""
    print(f"{'plans':>9} {'cluster sizes':>13} {'enumerate s':>11} {'predict s':>9} {'plans/s':>8} {'plans/CPU-s':>11} "
          f"{'peak RSS MB':>11}")
    for count in sizes:
        out = subprocess.run([sys.executable, "-m", "bench.predict_speed", "--spec", str(spec_path), "--one", str(count)],
                             cwd=ROOT, capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['plans']:>9} {r['sizes']:>13} {r['enumerate_s']:>11.2f} {r['predict_s']:>9.2f} {r['plans_per_s']:>8.0f} "
              f"{r['plans_per_cpu_s']:>11.0f} {r['peak_rss_mb']:>11.0f}", flush=True)


def main() -> int:
    ap = common.parser(__doc__)
    ap.add_argument("--sizes", help="comma-separated plan counts: the growth table (see the module doc)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, default=ROOT / "examples" / "gpt3-175b-a100x1024.yaml")
    ap.add_argument("--checkpoint", type=Path, default=checkpoint_path("a100-80gb").parent / "experimental" / "scaledl-a100-80gb-single-node.pt")
    ap.add_argument("--n", type=int, default=5000, help="plans per predict call")
    ap.add_argument("--limit", type=int, default=0, help="predict only the first LIMIT valid plans (0: all)")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_size(args.spec, args.one)))
        return 0
    if args.sizes:
        growth(args.spec, [int(s) for s in args.sizes.split(",")])
        return 0
    import torch  # the learned predictor's (the growth table's processes stay without it: their RSS is the search's)

    from predictor.models.scaledl import ScaleDLPredictor

    torch.set_num_threads(1)
    spec = load_spec(args.spec)
    t0 = time.perf_counter()
    graph = graph_for(spec.model)
    print(f"graph: {len(graph.nodes)} nodes ({graph.params / 1e9:.1f}B parameters) built in {time.perf_counter() - t0:.1f} s")
    plans = enumerate_plans(spec, load_space("full")).plans
    plans = plans[: args.limit or None]
    print(f"{len(plans)} valid plans of the 'full' space, predicted in calls of {args.n}")
    rows: list[tuple[str, Callable[[], Predictor]]] = [("analytical", AnalyticalPredictor)]
    if args.checkpoint.is_file():
        rows.append((f"scaledl ({args.checkpoint.name})", lambda: ScaleDLPredictor.load(args.checkpoint)))
    else:
        print(f"no checkpoint at {args.checkpoint}: ScaleDL not measured")
    print(f"{'predictor':40s}{'pass':>9s}{'plans/s wall':>14s}{'plans/CPU-s':>13s}")
    for name, make in rows:
        predictor = make()
        table = lambda batch: predictor.predict_table(spec, graph, batch)  # noqa: E731
        for label, call in (("cold", table), ("warm", table),
                            ("objects", lambda batch: predictor.predict(spec, graph, batch))):
            wall, cpu = rate(call, plans, args.n)
            print(f"{name:40s}{label:>9s}{wall:14.0f}{cpu:13.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
