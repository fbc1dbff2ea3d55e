"""Prediction throughput on a GPT-3 175B workload: plans predicted per second, analytical vs ScaleDL.

    nice -n 10 .venv/bin/python bench/predict_speed.py [--checkpoint predictor/checkpoints/experimental/scaledl-a100-80gb-single-node.pt]

The plans are the valid plans of the `full` search space for examples/gpt3-175b-a100x1024.yaml
(ZeRO, recomputation, sequence parallel, schedules included), repeated to --n. One batched
`predict` call per repeat, as the search's replica actors make it; the first call (graph
embedding and layer-wise caches filled) is reported separately from the steady state.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.graph_cache import graph_for  # noqa: E402
from predictor.models.analytical import AnalyticalPredictor  # noqa: E402
from predictor.models.registry import checkpoint_path  # noqa: E402
from predictor.models.scaledl import ScaleDLPredictor  # noqa: E402
from predictor.workload import load_spec  # noqa: E402
from search_spaces.enumerate import enumerate_plans  # noqa: E402
from search_spaces.space import load_space  # noqa: E402


def rate(predictor, spec, graph, plans, repeats: int) -> tuple[float, float, float]:
    """(first call seconds, steady predictions per wall second, per CPU second of this process).

    The CPU-second rate is what an unshared core delivers; the wall rate depends on the load."""
    t0 = time.perf_counter()
    predictor.predict(spec, graph, plans)
    first = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(repeats):
        predictor.predict(spec, graph, plans)
    n = repeats * len(plans)
    return first, n / (time.perf_counter() - t0), n / (time.process_time() - c0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "examples" / "gpt3-175b-a100x1024.yaml")
    ap.add_argument("--checkpoint", type=Path, default=checkpoint_path("a100-80gb").parent / "experimental" / "scaledl-a100-80gb-single-node.pt")
    ap.add_argument("--n", type=int, default=5000, help="plans per predict call")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = load_spec(args.spec)
    t0 = time.perf_counter()
    graph = graph_for(spec.model)
    print(f"graph: {len(graph.nodes)} nodes ({graph.params / 1e9:.1f}B parameters) built in {time.perf_counter() - t0:.1f} s")
    valid = enumerate_plans(spec, load_space("full")).plans
    plans = (valid * (args.n // len(valid) + 1))[: args.n]
    print(f"{len(valid)} valid plans in the 'full' space; predicting {len(plans)} per call, {args.repeats} calls")
    rows = [("analytical", AnalyticalPredictor())]
    if args.checkpoint.is_file():
        rows.append((f"scaledl ({args.checkpoint.name})", ScaleDLPredictor.load(args.checkpoint)))
    else:
        print(f"no checkpoint at {args.checkpoint}: ScaleDL not measured")
    print(f"{'predictor':40s}{'first call s':>14s}{'plans/s wall':>14s}{'plans/CPU-s':>13s}")
    for name, predictor in rows:
        first, wall, cpu = rate(predictor, spec, graph, plans, args.repeats)
        print(f"{name:40s}{first:14.2f}{wall:14.0f}{cpu:13.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
