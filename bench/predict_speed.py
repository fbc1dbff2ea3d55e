"""Prediction throughput on a GPT-3 175B workload: plans predicted per second, analytical vs ScaleDL.

    nice -n 10 .venv/bin/python -m bench.predict_speed [--checkpoint predictor/checkpoints/experimental/scaledl-a100-80gb-single-node.pt]

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

import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from bench import common
from bench.common import ROOT
from predictor.graph_cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.base import Predictor
from predictor.models.registry import checkpoint_path
from predictor.models.scaledl import ScaleDLPredictor
from predictor.plan import Plan
from predictor.workload import load_spec
from search_spaces.enumerate import enumerate_plans
from search_spaces.space import load_space


def rate(call: Callable[[Sequence[Plan]], object], plans: list[Plan], n: int) -> tuple[float, float]:
    """(plans per wall second, per CPU second of this process) predicting `plans` in calls of `n`.

    The CPU-second rate is what an unshared core delivers; the wall rate depends on the load."""
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(plans), n):
        call(plans[i:i + n])
    return len(plans) / (time.perf_counter() - t0), len(plans) / (time.process_time() - c0)


def main() -> int:
    ap = common.parser(__doc__)
    ap.add_argument("--spec", type=Path, default=ROOT / "examples" / "gpt3-175b-a100x1024.yaml")
    ap.add_argument("--checkpoint", type=Path, default=checkpoint_path("a100-80gb").parent / "experimental" / "scaledl-a100-80gb-single-node.pt")
    ap.add_argument("--n", type=int, default=5000, help="plans per predict call")
    ap.add_argument("--limit", type=int, default=0, help="predict only the first LIMIT valid plans (0: all)")
    args = ap.parse_args()
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
