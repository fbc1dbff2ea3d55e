"""`scaledl predict SPEC --plan PLAN ...`: predicted iteration time and memory of given plans."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from orchestrator.cli import UsageError
from orchestrator.commands.plan import add_trust_argument
from predictor.costs.prediction import MEMORY_PARTS, TIME_PARTS, Prediction
from predictor.frameworks.launch import run_errors
from predictor.memory.facts import HEADROOM
from predictor.models.domain import advice as domain_advice
from predictor.models.registry import load_predictor
from predictor.plan import Plan, PlanError, placement_warnings
from predictor.spec.resolver import Resolved, resolve
from predictor.spec.workload import WorkloadSpec, load_spec, read_text
from search_spaces import resolve_space

HELP = "predict iteration time and per-GPU memory of parallel plans"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="workload spec (YAML)")
    parser.add_argument("--plan", action="append", default=[], metavar="PLAN",
                        help="plan string, e.g. dp=16,tp=8,pp=8,mbs=1,recompute=full,sp=true (repeatable)")
    parser.add_argument("--plans-file", metavar="FILE", help="file with one plan string per line ('#' comments allowed)")
    parser.add_argument("--predictor", default="auto", metavar="analytical|auto|PATH",
                        help="analytical, auto (the device's ScaleDL checkpoint: the one `scaledl adapt` fitted to this "
                             "hardware, else the shipped one, else analytical) or a checkpoint path")
    parser.add_argument("--json", action="store_true", help="print JSON: one object, or an array for several plans")
    add_trust_argument(parser)


def _plan_texts(args: argparse.Namespace) -> list[str]:
    texts = list(args.plan)
    if args.plans_file:
        path = Path(args.plans_file)
        if not path.exists():
            raise FileNotFoundError(f"plans file {path} does not exist")
        for line in read_text(path, "plans file").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                texts.append(line)
    if not texts:
        raise UsageError("give at least one --plan PLAN or --plans-file FILE (e.g. --plan dp=8,tp=1,pp=1,mbs=1)")
    return texts


def _checked(text: str, resolved: Resolved) -> Plan | str:
    """The plan, or the reason it cannot run: any plan that runs is predicted, a slow placement too
    (`placement_warnings` says what it costs); a plan outside the spec's framework is refused with why."""
    try:
        plan = Plan.parse(text)
    except PlanError as err:
        return str(err)
    errors = run_errors(plan, resolved, allow_cross_node_tp=True)
    return plan if not errors else f"invalid plan {text!r}: " + "; ".join(errors)


def predict_texts(resolved: Resolved, texts: list[str], predictor_name: str) -> tuple[list[dict[str, Any]], str]:
    """One result object per plan text, in order (an `error` object for invalid plans), and the predictor label."""
    spec = resolved.spec
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        predictor, label = load_predictor(predictor_name, spec.cluster.device, resolved.device.model)
    for w in caught:
        if issubclass(w.category, UserWarning):  # ours (e.g. the analytical fallback); not libraries' deprecations
            print(f"scaledl predict: warning: {w.message}", file=sys.stderr)
    checked = [_checked(t, resolved) for t in texts]
    plans = [c for c in checked if isinstance(c, Plan)]
    predictions: list[Prediction] = []
    if plans:
        from predictor.graph.cache import graph_for  # lazy: building a graph imports transformers

        predictions = predictor.predict(spec, graph_for(spec.model), plans)
    it = iter(predictions)
    capacity = resolved.device.mem_capacity / 1024**3
    limit = capacity * (1 - HEADROOM)
    out = []
    for text, c in zip(texts, checked):
        if isinstance(c, Plan):
            pred = next(it)
            fits = pred.peak_memory_gib <= limit
            out.append({**pred.to_dict(), "predictor": label, "plan": str(c), "device": spec.cluster.device,
                        "capacity_gib": capacity, "limit_gib": limit, "fits": fits,
                        **({} if fits else {"overflow": overflow(pred, limit), "fix": cheapest_fix(c, pred, spec,
                                                                                                 predictor, limit)}),
                        "warnings": placement_warnings(c, spec)})
        else:
            out.append({"plan": text, "error": c, "predictor": label, "device": spec.cluster.device})
    return out, label


def overflow(pred: Prediction, limit: float) -> dict[str, Any]:
    """What a plan that does not fit overflows with: by how much, on which pipeline stage, its largest part."""
    stage = max(range(len(pred.memory_per_stage_gib)), key=lambda s: pred.memory_per_stage_gib[s])
    part = max(pred.memory_breakdown, key=lambda k: pred.memory_breakdown[k])
    return {"over_gib": pred.peak_memory_gib - limit, "stage": stage, "part": part,
            "part_gib": pred.memory_breakdown[part]}


def cheapest_fix(plan: Plan, pred: Prediction, spec: WorkloadSpec, predictor: Any, limit: float
                 ) -> dict[str, Any] | None:
    """The single change (`search.levers.fixes`) that makes `plan` fit for the least predicted time, or None."""
    from orchestrator.search.levers import fixes  # lazy: only a plan that does not fit asks
    from predictor.graph.cache import graph_for

    changes = fixes(plan, spec)
    if not changes:
        return None
    tried = predictor.predict(spec, graph_for(spec.model), [p for _, p in changes])
    fitting = [(p.iter_time_s, name, changed, p) for (name, changed), p in zip(changes, tried)
               if p.peak_memory_gib <= limit]
    if not fitting:
        return None
    seconds, name, changed, fixed = min(fitting, key=lambda f: f[0])
    return {"lever": name, "plan": str(changed), "iter_time_s": seconds, "peak_memory_gib": fixed.peak_memory_gib,
            "saves_gib": pred.peak_memory_gib - fixed.peak_memory_gib,
            "time_change_pct": 100 * (seconds / pred.iter_time_s - 1)}


def _fit_text(r: dict[str, Any]) -> str:
    """One line on a plan that does not fit: what overflows and the cheapest change that fits."""
    o, fix = r["overflow"], r.get("fix")
    text = (f"{_short(r['plan'])}: {o['over_gib']:.1f} GiB over the {r['limit_gib']:.1f} GiB limit on stage "
            f"{o['stage']} (largest part: {o['part']} {o['part_gib']:.1f} GiB)")
    if fix is None:
        return text + "; no single memory lever, ZeRO stage or recomputation makes it fit (try more GPUs or pp)"
    return (text + f"; {fix['lever']} saves {fix['saves_gib']:.1f} GiB for {fix['time_change_pct']:+.1f} % time "
            f"({fix['iter_time_s']:.3f} s at {fix['peak_memory_gib']:.1f} GiB)")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec, args.trust_module)
    resolved = resolve(spec)
    resolve_space(spec)  # a bad `search:` section is refused here too, as `scaledl plan` refuses it
    texts = _plan_texts(args)
    results, label = predict_texts(resolved, texts, args.predictor)
    errors = [r for r in results if "error" in r]
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=1))
    else:
        _print_tables(resolved, results, label)
    _warn_outside(results)
    for r in results:
        for w in r.get("warnings", []):
            print(f"scaledl predict: warning: {_short(r['plan'])}: {w}", file=sys.stderr)
    for r in results:
        if "overflow" in r and not args.json:
            print(f"scaledl predict: does not fit: {_fit_text(r)}", file=sys.stderr)
    for r in errors:
        print(f"scaledl predict: error: {r['error']}", file=sys.stderr)
    return 2 if len(errors) == len(results) else 0


def _warn_outside(results: list[dict[str, Any]]) -> None:
    """Warn of predictions outside the learned predictor's training data: what all plans share (the
    workload's sizes, usually) once, then each plan's own reasons, so a long plan list stays readable."""
    outside = [(r["plan"], r.get("extra", {}).get("outside_training") or []) for r in results if "error" not in r]
    shared = [w for w in outside[0][1] if all(w in o for _, o in outside)] if len(outside) > 1 else []
    if shared:
        print(f"scaledl predict: warning: all {len(outside)} plans lie outside the predictor's training data "
              f"({'; '.join(shared)}): {domain_advice(shared)}", file=sys.stderr)
    for plan, reasons in outside:
        own = [w for w in reasons if w not in shared]
        if own:
            also = "also " if shared else ""
            print(f"scaledl predict: warning: {_short(plan)} {also}lies outside the predictor's training data "
                  f"({'; '.join(own)}): {domain_advice(own)}", file=sys.stderr)


def _short(text: str) -> str:
    """The canonical plan string without fields at their defaults (the table is narrow; JSON keeps it whole)."""
    defaults = set(str(Plan()).split(","))
    return ",".join(p for p in text.split(",") if p.split("=")[0] in ("dp", "tp", "pp", "mbs") or p not in defaults)


def _print_tables(resolved: Resolved, results: list[dict[str, Any]], label: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    spec, device = resolved.spec, resolved.device
    capacity = device.mem_capacity / 1024**3
    ok = [r for r in results if "error" not in r]
    if not ok:  # every plan was refused: the errors alone, no empty table
        return
    unit = "ranks" if spec.cluster.device == "cpu" else "GPUs"
    priced = f" ({device.source})" if device.measured else ""  # which measurement: this machine or a profile file
    summary = Table(title=f"{spec.cluster.device}{priced} x {spec.cluster.gpus} {unit}, predictor: {label}")
    summary.add_column("plan", overflow="fold")
    for col in ("iter (s)", f"TFLOP/s/{unit[:-1]}", "MFU", f"peak GiB (/{capacity:.0f})"):
        summary.add_column(col, justify="right")
    for r in ok:
        mem = f"{r['peak_memory_gib']:.1f}" + ("" if r["fits"] else " OOM")
        tflops = r["tflops_per_gpu"]  # a CPU rank does hundredths of a TFLOP/s: one decimal would print 0.0
        summary.add_row(_short(r["plan"]), f"{r['iter_time_s']:.3f}", f"{tflops:.1f}" if tflops >= 1 else f"{tflops:.3f}",
                        f"{100 * r['mfu']:.1f}%", mem)
    console.print(summary)
    for r in ok if len(ok) == 1 else []:
        parts = Table(title="where the time goes (critical path) and the memory (rank with the peak)")
        for col in ("time part", "s", "%", "memory part", "GiB"):
            parts.add_column(col, justify="left" if "part" in col else "right")
        for i in range(max(len(TIME_PARTS), len(MEMORY_PARTS))):
            tp = TIME_PARTS[i] if i < len(TIME_PARTS) else ""
            mp = MEMORY_PARTS[i] if i < len(MEMORY_PARTS) else ""
            sec = r["breakdown"].get(tp, 0.0)
            parts.add_row(tp, f"{sec:.4f}" if tp else "", f"{100 * sec / r['iter_time_s']:.1f}" if tp else "",
                          mp, f"{r['memory_breakdown'][mp]:.2f}" if mp else "")
        console.print(parts)
        hidden = r.get("hidden_comm") or {}
        if hidden:
            console.print(f"communication hidden behind computation ({resolved.framework.title}): "
                          + ", ".join(f"{k} {v:.4f} s" for k, v in hidden.items()))
        console.print("memory per pipeline stage (GiB): " + ", ".join(f"{x:.1f}" for x in r["memory_per_stage_gib"]))
