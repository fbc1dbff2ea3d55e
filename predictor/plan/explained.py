"""What each axis's report sentence (its registry entry's `explain`) names beyond its degree and time share: a
function of the plan and spec per axis, registered onto it as its "facts" (`predictor.plan.axes.axis_function`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from predictor.plan.axes import axis_function
from predictor.plan.placement import nvlink_domain

if TYPE_CHECKING:  # pragma: no cover
    from predictor.plan.plan import Plan
    from predictor.spec.workload import WorkloadSpec


@axis_function("tp", "facts")
def tp_explained(plan: "Plan", spec: "WorkloadSpec") -> dict[str, object]:
    return {"where": "inside an NVLink domain" if plan.group_span("tp") <= nvlink_domain(spec) else "across nodes"}


@axis_function("cp", "facts")
def cp_explained(plan: "Plan", spec: "WorkloadSpec") -> dict[str, object]:
    return {"cp_comm": plan.cp_comm}


@axis_function("dp", "facts")
def dp_explained(plan: "Plan", spec: "WorkloadSpec") -> dict[str, object]:
    return {"over": f" over dp*cp = {plan.dp * plan.cp} ranks" if plan.cp > 1 else ""}


@axis_function("pp", "facts")
def pp_explained(plan: "Plan", spec: "WorkloadSpec") -> dict[str, object]:
    m = plan.microbatches(spec.training.global_batch)
    return {"microbatches": m, "virtual": f" and v={plan.v} virtual stages" if plan.v > 1 else "",
            "bubble": 100 * (plan.pp - 1) / (plan.v * m)}


@axis_function("ep", "facts")
def ep_explained(plan: "Plan", spec: "WorkloadSpec") -> dict[str, object]:
    return {"experts": spec.model.experts, "experts_per_rank": (spec.model.experts or 0) // plan.ep}


@axis_function("etp", "facts")
def etp_explained(plan: "Plan", spec: "WorkloadSpec") -> dict[str, object]:
    return {"expert_dp": plan.gpus // plan.pp // (plan.ep * plan.etp)}
