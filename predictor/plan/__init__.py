"""The parallel plan and its axes: `axes` (the registry), `plan` (the `Plan` value and its parsing), `rules` (whether
a plan runs a workload, and which of its groups leave an NVLink domain; each axis's rules), `explained` (each axis's
report facts) and `placement` (rank orders and NVLink domains). Importing the package registers the axes' rules
and facts (`axes.axis_function`)."""

from predictor.plan.axes import (AXES, AXIS, AXIS_NAMES, COMM_PARTS, DEFAULT_ORDER, DISPATCHERS, HIDDEN_KINDS, HIDDEN_WORDS,
                                 OVERLAP_KINDS, PART_WORDS, PRICING_ORDER, STAGE_AXES, TERM_OF_PART, TIME_PARTS, Axis, HiddenKind,
                                 TimePart)
from predictor.plan.placement import complete_order, nvlink_domain, placement_error, placements
from predictor.plan.plan import (GPU_AXES, GRADS, MOMENTS, OFFLOAD_MODULES, PLACEMENTS, RECOMPUTE_MODES,
                                 RECOMPUTE_MODULES, SCHEDULES, Plan, PlanError, canonical_recompute, offloaded,
                                 overlap_kinds, recompute_modules)
from predictor.plan import explained  # noqa: F401  (registers each axis's report facts)
from predictor.plan.rules import (cross_domain_axes, embedding_and_loss_in_split, placement_warnings, plan_errors,
                                  recompute_errors, recompute_for_model)

__all__ = [
    "AXES", "AXIS", "AXIS_NAMES", "Axis", "COMM_PARTS",
    "DEFAULT_ORDER", "DISPATCHERS", "GPU_AXES", "GRADS", "HIDDEN_KINDS", "HiddenKind", "HIDDEN_WORDS", "MOMENTS", "OFFLOAD_MODULES", "OVERLAP_KINDS",
    "PART_WORDS", "PLACEMENTS", "PRICING_ORDER", "Plan", "PlanError", "RECOMPUTE_MODES", "RECOMPUTE_MODULES",
    "SCHEDULES", "STAGE_AXES", "TERM_OF_PART", "TIME_PARTS", "TimePart", "canonical_recompute", "complete_order",
    "cross_domain_axes", "embedding_and_loss_in_split", "nvlink_domain", "offloaded", "overlap_kinds",
    "placement_error", "placement_warnings", "placements", "plan_errors", "recompute_errors", "recompute_for_model",
    "recompute_modules",
]
