"""`scaledl plan --history`: the report's best predictions stored for the revalidation rounds to re-measure."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.revalidation.history import History

if TYPE_CHECKING:
    from orchestrator.report import Report


def record_top(history_url: str, report: "Report", k: int) -> None:
    """Store the report's K best predictions in the history database, for `scaledl revalidate` to re-measure."""
    name = str(report.predictor["name"])
    spec = report.spec.model_dump(mode="json", exclude_none=True)
    with History.open(history_url) as history:
        history.record_predictions(spec, report.spec.cluster.device, name.split(" ")[0], name,
                                   [(str(r.plan), r.iter_time_s, r.peak_memory_gib) for r in report.ranked[:k]])
