"""Validated plans, predicted vs measured: dp=2, tp=2 and pp=2 runs of small real models on a local
2-node Ray cluster (one CPU per node), each measured twice, against the CPU predictor.

    .venv/bin/python -m bench.validate_plans [--predictor auto|analytical|PATH] [--steps 3]

Prints one row per plan: predicted and measured seconds per iteration (two runs), their spread
and the predictor's error. Runs go one at a time; times on a shared machine include the other
processes' load.
"""

from __future__ import annotations

import time

from bench import common
from orchestrator.ray_cluster.local import local_cluster
from orchestrator.validation.jobs import jobs_for
from orchestrator.validation.report_section import short_plan
from orchestrator.validation.trials import validate
from predictor.graph.cache import graph_for
from predictor.models.registry import load_predictor
from predictor.plan import Plan
from predictor.spec.resolver import get_device
from predictor.spec.workload import parse_spec

DIMS = {"hidden": 256, "layers": 4, "heads": 4}
CASES = [  # family, plan, model dims beyond DIMS
    ("gpt2", "dp=2,mbs=4", {"seq_len": 128, "vocab": 1024}),
    ("bert", "tp=2,mbs=8", {"seq_len": 128, "vocab": 1024}),
    ("vit", "pp=2,mbs=4,schedule=gpipe", {"image_size": 128, "patch_size": 8}),
    ("gpt2", "dp=1,mbs=8", {"seq_len": 128, "vocab": 1024}),
    # Added after the checkpoint was retrained, so never seen while deciding what to collect or train.
    ("t5", "dp=2,mbs=4", {"seq_len": 128, "vocab": 1024}),
    ("deit", "tp=2,mbs=8", {"image_size": 128, "patch_size": 8}),
    ("gpt2", "pp=2,mbs=2,schedule=1f1b", {"seq_len": 256, "vocab": 1024}),
    ("bert", "dp=2,mbs=4,zero=3", {"seq_len": 128, "vocab": 1024}),
]


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--predictor", default="auto")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    predictor, label = load_predictor(args.predictor, "cpu", get_device("cpu").model)  # auto: adapted to this CPU first
    jobs = []
    for family, text, extra in CASES:
        plan = Plan.parse(text)
        spec = parse_spec({"model": {"family": family, **DIMS, **extra}, "training": {"global_batch": 8, "precision": "fp32"},
                           "cluster": {"device": "cpu", "nodes": 1, "gpus_per_node": plan.gpus}})
        preds = predictor.predict(spec, graph_for(spec.model), [plan])
        jobs += jobs_for(spec, [plan], preds, warmup=args.warmup, steps=args.steps,
                         cpus_per_rank=0.5 if plan.tp > 1 else 1.0)
    with local_cluster({"num_cpus": 1}, {"num_cpus": 1}):
        t0 = time.perf_counter()
        # One run at a time: the two 1-CPU "nodes" share this machine's 2 cores, so runs side by side
        # would measure each other's load (the profile dataset was measured one configuration at a time).
        first, second = validate(jobs, concurrency=1), validate(jobs, concurrency=1)
        wall = time.perf_counter() - t0
    print(f"predictor: {label}; {args.warmup} warm-up + {args.steps} measured steps; both rounds in {wall:.0f} s")
    print(f"{'family':6} {'plan':36} {'placement':12} {'pred s':>8} {'run1 s':>8} {'run2 s':>8} {'spread':>7} {'error':>7}")
    errors = []
    for (family, _, _), a, b in zip(CASES, first, second):
        if a.status != "ok" or b.status != "ok":
            print(f"{family:6} {short_plan(a.plan):36} {a.status}/{b.status}: {(a.detail or b.detail)[:80]}")
            continue
        spread = abs(a.measured_time_s - b.measured_time_s) / min(a.measured_time_s, b.measured_time_s)
        mean = (a.measured_time_s + b.measured_time_s) / 2
        error = (a.predicted_time_s - mean) / mean
        errors.append(abs(error))
        print(f"{family:6} {short_plan(a.plan):36} {a.strategy:12} {a.predicted_time_s:8.4f} {a.measured_time_s:8.4f} "
              f"{b.measured_time_s:8.4f} {100 * spread:6.1f}% {100 * error:+6.1f}%")
    if errors:
        print(f"mean |error| {100 * sum(errors) / len(errors):.1f}% over {len(errors)} plans")


if __name__ == "__main__":
    main()
