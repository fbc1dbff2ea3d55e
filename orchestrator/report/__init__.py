"""The search report: ranked plans, why the winner wins, plots and launch settings.

`build.build_report` makes one typed `model.Report` from a search; `render_md`, `render_html`, `render_json` and
`render_console` read it (report.md and report.html share their sections: `document`). Ranking and costs are in
`ranking`, the explanation in `explain`, the plotted points in `points` and the figures in `plots`, and when nothing
fits the plans closest to fitting with the changes that would make them fit in `close_plans`.

`OUT/report.json` (schema `scaledl.report/1`):
    schema, created (UTC ISO time), spec_path, spec (the validated workload spec),
    device: {name, capacity_gib, memory_limit_gib, headroom, peak_tflops, intra_node_gbps, inter_node_gbps},
    predictor: {name, accuracy: null when never measured, else {mape_pct (mean absolute % error of the iteration
        time), rows (how many measured runs), source (which runs, never trained on), measured_by, ...}},
    ranking: {by: time|throughput|cost, price_per_gpu_hour, train_tokens, deadline_days, budget_usd},
    fits: whether any plan fits in memory (within the deadline and budget; `scaledl plan` exits 1 when none does),
    sizes: [{nodes, gpus, valid (plans of that size)}] (the cluster sizes searched, `--nodes`),
    space: {name, config, candidates, valid, rejected, top_rejections: [[reason, count]]},
    search: the search statistics (searcher, trials, failed trials, evaluated plans, plans/s, ...),
    ranked: the best feasible plans within the deadline and budget (at most max(top_k, 100)), each {rank, plan,
        fields, nodes, gpus, tokens_per_s, tokens_per_s_per_gpu, cost_usd_per_iteration, days_per_1t_tokens,
        days_to_train and cost_usd_to_train (null without --train-tokens, resp. a price), iter_time_interval_s: [low,
        high] (null when the predictor's accuracy was never measured), indistinguishable_from_best (its interval,
        scaled to the ranking's measure, overlaps the winner's), and every Prediction field},
    intervals: null, or {coverage (0.8), low, high (relative to a prediction), rows, basis (which held-out
        residuals), indistinguishable_total (plans after the winner that it cannot be told apart from)},
    ranked_total, over_goal_total: feasible plans left out by --deadline-days / --budget-usd,
    pareto: the plans no other (feasible, within the goal) plan beats on both days and cost, fastest first,
        {plan, nodes, gpus, iter_time_s, gpu_hours_per_iteration, days_to_train, cost_usd_to_train}
        (days and cost are proportional to iteration time and GPU-hours per iteration, so the front exists
        without --train-tokens or a price), infeasible: the fastest plans that do not fit (at most 100) {plan, reason, iter_time_s,
        peak_memory_gib}, infeasible_total,
    closest: when nothing fits, the plans that overflow the memory limit least {plan, iter_time_s, peak_memory_gib,
        overflow_gib, levers: [{lever, plan, gpus, iter_time_s, peak_memory_gib, gpu_hours_per_iteration, fits}]}
        (each lever re-predicted by the search's predictor), failed: plans whose prediction failed {plan, error},
    explanation: one paragraph derived from the winner's breakdown against the runners-up,
    caution: '' or a warning that the winner lies outside the learned predictor's training data
        (the ranked plans' `extra.outside_training` lists what, per plan),
    launch: {plan, framework, files: {name: text}, notes} for the winner (null if none fits; no files and a
        note when its framework refuses it, see predictor.frameworks.launch.launch_files),
    validation (only with --validate K): {k, steps, warmup, plans: [ValidationResult.to_dict()], note}
        (see orchestrator.validation.trials),
    wider (only when a sample of the full space holds a plan that fits and beats the winner by more than 3 %, or
        fits where nothing does): {space, plan, iter_time_s, peak_memory_gib, sampled}
        (orchestrator.search.wider_space).
`report.md` says the same for people; `report.html` loads nothing from the network (plotly inlined once: a sortable,
filterable plan table, time-memory and time-cost plots with hover labels; the breakdowns as base64 PNGs);
`launch/` holds the winner's launch file for the spec's framework: `megatron_args.txt` (and `torchrun.sh`),
`torchtitan.toml` or `deepspeed_config.json`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from orchestrator.report.build import build_report
from orchestrator.report.model import Report, TrainingGoal
from orchestrator.report.render_console import print_report
from orchestrator.report.render_html import render_html
from orchestrator.report.render_json import to_json
from orchestrator.report.render_md import render_md

__all__ = ["Report", "TrainingGoal", "build_report", "print_report", "write_report"]


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_report(report: Report, out_dir: Path) -> list[Path]:
    """Write report.json/md/html and the winner's launch files into `out_dir` (each file atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {out_dir / "report.json": json.dumps(to_json(report), indent=1), out_dir / "report.md": render_md(report),
               out_dir / "report.html": render_html(report)}
    if report.launch:
        launch_dir = out_dir / "launch"
        launch_dir.mkdir(exist_ok=True)
        for name, text in report.launch.files.items():
            written[launch_dir / name] = text
    for path, text in written.items():
        _atomic(path, text)
    return list(written)
