"""report.json: the report as data (schema `scaledl.report/1`, described in `orchestrator.report`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from orchestrator.report.model import SCHEMA, Lever, Report


def _lever(lv: Lever) -> dict[str, Any]:
    return {"lever": lv.name, "plan": str(lv.plan), "gpus": lv.gpus, "iter_time_s": lv.iter_time_s,
            "peak_memory_gib": lv.peak_memory_gib, "gpu_hours_per_iteration": lv.gpu_hours_per_iteration, "fits": lv.fits}


def to_json(report: Report) -> dict[str, Any]:
    interval = report.interval
    return {
        "schema": SCHEMA,
        "created": report.created,
        "spec_path": report.spec_path,
        "spec": report.spec.model_dump(mode="json", exclude_none=True),
        "device": asdict(report.device),
        "predictor": report.predictor,
        "ranking": {"by": report.ranking.by, "price_per_gpu_hour": report.ranking.price_per_gpu_hour,
                    **asdict(report.ranking.goal)},
        "sizes": [asdict(z) for z in report.sizes],
        "space": {**asdict(report.space), "top_rejections": [list(r) for r in report.space.top_rejections]},
        "search": report.search,
        "fits": report.fits,
        "ranked": [{"rank": r.rank, "plan": str(r.plan), "fields": asdict(r.plan), **asdict(r.costs),
                    "iter_time_interval_s": list(r.interval_s) if r.interval_s else None,
                    "indistinguishable_from_best": r.indistinguishable, **r.prediction.to_dict()}
                   for r in report.ranked],
        "intervals": None if interval is None else {**interval.to_dict(),
                                                    "indistinguishable_total": report.indistinguishable_total},
        "ranked_total": report.ranked_total,
        "over_goal_total": report.over_goal_total,
        "pareto": [{"plan": str(f.plan), "nodes": f.costs.nodes, "gpus": f.costs.gpus, "iter_time_s": f.iter_time_s,
                    "gpu_hours_per_iteration": f.gpu_hours_per_iteration, "days_to_train": f.costs.days_to_train,
                    "cost_usd_to_train": f.costs.cost_usd_to_train} for f in report.pareto],
        "infeasible": [{"plan": str(r.plan), "reason": r.reason, "iter_time_s": r.iter_time_s,
                        "peak_memory_gib": r.peak_memory_gib} for r in report.infeasible],
        "infeasible_total": report.infeasible_total,
        "closest": [{"plan": str(c.plan), "iter_time_s": c.iter_time_s, "peak_memory_gib": c.peak_memory_gib,
                     "overflow_gib": c.overflow_gib, "levers": [_lever(lv) for lv in c.levers]} for c in report.closest],
        "failed": [{"plan": str(plan), "error": error} for plan, error in report.failed],
        "failed_total": report.failed_total,
        "top_k": report.top_k,
        "explanation": report.explanation,
        "caution": report.caution,
        "launch": None if report.launch is None else {**asdict(report.launch), "plan": str(report.launch.plan)},
        **({"validation": report.validation} if report.validation else {}),
        **({"wider": {**asdict(report.wider), "plan": str(report.wider.plan)}} if report.wider else {}),
    }
