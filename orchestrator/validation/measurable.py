"""Whether a plan can be validated: valid for its workload, and run exactly by the composed runner.

A run of a different plan than the one predicted would compare the wrong things, so a plan the runner
cannot run exactly (`predictor.measure.compose.unsupported`) is refused with the reason instead of being
approximated.
"""

from __future__ import annotations

from orchestrator.validation.jobs import ValidationJob
from predictor.measure.compose import unsupported
from predictor.plan import Plan, plan_errors
from predictor.spec.workload import parse_spec


def plan_problem(job: ValidationJob) -> str:
    """Why this job's plan cannot be validated ('' when it can); tp may cross nodes here."""
    try:
        plan = Plan.parse(job.plan)
        errors = plan_errors(plan, parse_spec(job.spec), allow_cross_node_tp=True)
    except ValueError as err:  # PlanError, SpecError
        return f"invalid plan: {err}"
    if errors:
        return "invalid plan: " + "; ".join(errors)
    missing = unsupported(plan, parse_spec(job.spec).model)
    return f"not measurable: {missing}" if missing else ""
