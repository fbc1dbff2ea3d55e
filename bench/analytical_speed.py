"""Plans per second of the analytical predictor on GPT-3 175B over 1,024 A100s (target >= 5,000).

A search predicts thousands of plans of one graph, so per-plan cost must stay in microseconds.

    .venv/bin/python bench/analytical_speed.py
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.graph import graph_for  # noqa: E402
from predictor.models.analytical import AnalyticalPredictor  # noqa: E402
from predictor.plan import Plan, plan_errors  # noqa: E402
from predictor.workload import load_spec  # noqa: E402


def main() -> None:
    spec = load_spec(ROOT / "examples" / "gpt3-175b-a100x1024.yaml")
    t0 = time.perf_counter()
    graph = graph_for(spec.model)
    print(f"graph: {len(graph.nodes)} nodes, {graph.params / 1e9:.1f} B parameters, built in {time.perf_counter() - t0:.1f} s")
    plans = []
    for tp, pp, mbs, zero, rc, sp, sched in itertools.product(
            (1, 2, 4, 8), (1, 2, 4, 8, 16, 32), (1, 2, 4), (0, 1, 2, 3), ("none", "selective", "full"), (False, True),
            ("1f1b", "gpipe", "interleaved")):
        v = 2 if sched == "interleaved" else 1
        plan = Plan(dp=1024 // tp // pp, tp=tp, pp=pp, mbs=mbs, zero=zero, recompute=rc, sp=sp, schedule=sched, v=v) \
            if not (sched == "interleaved" and pp == 1) else None
        if plan is not None and not plan_errors(plan, spec):
            plans.append(plan)
    predictor = AnalyticalPredictor()
    predictor.predict(spec, graph, plans[:50])  # warm the per-(tp, sp, mbs) caches as a search would
    t0, c0 = time.perf_counter(), time.process_time()
    preds = predictor.predict(spec, graph, plans)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    # CPU time as well as wall time: on a shared machine the wall clock also counts other jobs.
    print(f"{len(plans)} valid plans in {dt:.2f} s wall, {cpu:.2f} s CPU: "
          f"{len(plans) / dt:,.0f} plans/s wall, {len(plans) / cpu:,.0f} plans per CPU-second")
    capacity = spec.cluster.device
    fits = [(p, pl) for p, pl in zip(preds, plans) if p.peak_memory_gib <= 80]
    best = min(fits, key=lambda x: x[0].iter_time_s)
    print(f"fastest plan within 80 GiB ({capacity}): {best[1]}  {best[0].iter_time_s:.2f} s/iter, "
          f"{best[0].tflops_per_gpu:.0f} TFLOP/s/GPU, {best[0].peak_memory_gib:.0f} GiB peak")


if __name__ == "__main__":
    main()
