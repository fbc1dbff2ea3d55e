"""Every plan the search proposes is measurable: the top 10 of each example spec and of a small LLaMA on an
8-rank CPU cluster, checked against the composed runner, and the LLaMA's top 10 run for real.

    .venv/bin/python -m bench.validate_composed [--runs 10] [--steps 3]

For each spec, `scaledl plan --predictor analytical` searches its plans; each of the 10 best is either
measurable or refused with the reason (`orchestrator.validation.measurable`). The LLaMA's best `--runs`
plans are then validated on a local 2-node Ray cluster of 4 declared CPUs per node, one run at a time.
This machine's cores are fewer than the 8 ranks, so the ranks time-share them and each run is compared
with its prediction times the ranks per core (`ValidationResult.compared_time_s`).
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import time
from pathlib import Path

import yaml

from bench import common
from bench.common import ROOT
from orchestrator.cli import main as scaledl
from orchestrator.validation.jobs import ValidationJob
from orchestrator.validation.measurable import plan_problem
from orchestrator.validation.report_section import short_plan

LLAMA_CPU8 = {"model": {"family": "llama", "hidden": 128, "layers": 8, "heads": 8, "kv_heads": 4, "ffn_hidden": 256,
                        "seq_len": 128, "vocab": 1024},
              "training": {"global_batch": 16, "precision": "fp32"},
              "cluster": {"device": "cpu", "nodes": 2, "gpus_per_node": 4}}


def top_plans(spec_path: Path, out: Path, k: int = 10) -> dict:
    """The report of `scaledl plan` (analytical) on `spec_path` (its terminal output dropped)."""
    with contextlib.redirect_stdout(io.StringIO()):
        code = scaledl(["plan", str(spec_path), "--predictor", "analytical", "--out", str(out), "--top-k", str(k)])
    assert code == 0, spec_path
    return json.loads((out / "report.json").read_text())


def measurability(name: str, report: dict, k: int = 10) -> None:
    top = report["ranked"][:k]
    problems = [plan_problem(ValidationJob(report["spec"], r["plan"])) for r in top]
    print(f"{name}: {sum(not p for p in problems)}/{len(top)} of the top {k} measurable")
    for r, p in zip(top, problems):
        print(f"  {short_plan(r['plan']):80} {p or 'measurable'}")


def run_llama(report: dict, runs: int, steps: int) -> None:
    from orchestrator.ray_cluster.local import local_cluster
    from orchestrator.validation.trials import validate

    jobs = [ValidationJob(report["spec"], r["plan"], r["iter_time_s"], r["peak_memory_gib"], warmup=2, steps=steps)
            for r in report["ranked"][:runs]]
    with local_cluster({"num_cpus": 4}, {"num_cpus": 4}):
        t0 = time.perf_counter()
        results = validate(jobs, concurrency=1)  # one at a time: the raylets share this machine's cores
        wall = time.perf_counter() - t0
    print(f"\nllama-cpu8: the best {runs} plans run for real, 2 warm-up + {steps} measured steps, {wall:.0f} s in all")
    print(f"{'plan':62} {'pred s':>7} {'x share':>7} {'compared':>8} {'meas s':>7} {'error':>7} {'pred GiB':>8} "
          f"{'meas GiB (max rank)':>19} status")
    for r in results:
        if r.status != "ok":
            print(f"{short_plan(r.plan):62} {r.status}: {r.detail.splitlines()[0][:100] if r.detail else ''}")
            continue
        print(f"{short_plan(r.plan):62} {r.predicted_time_s:7.4f} {r.core_sharing:7.3g} {r.compared_time_s:8.4f} "
              f"{r.measured_time_s:7.4f} {r.time_error:+7.1%} {r.predicted_memory_gib:8.3f} "
              f"{r.measured_memory_gib:19.3f} ok")
    print(f"ranks per core: {results[0].detail.splitlines()[0] if results and results[0].detail else '-'}")


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scaledl-measurable-") as tmp:
        for spec_path in sorted((ROOT / "examples").glob("*.yaml")):
            measurability(spec_path.stem, top_plans(spec_path, Path(tmp) / spec_path.stem))
        llama_path = Path(tmp) / "llama-cpu8.yaml"
        llama_path.write_text(yaml.safe_dump(LLAMA_CPU8))
        report = top_plans(llama_path, Path(tmp) / "llama")
        measurability("llama-cpu8", report)
        if args.runs:
            run_llama(report, args.runs, args.steps)


if __name__ == "__main__":
    main()
