"""A GPU framework's fixed costs, learned from measured iterations.

On a GPU the analytical model's per-layer time is physics (FLOPs, bytes); what it cannot know
from first principles is what the training framework spends per call: the host's cost of one
eager operator (`AnalyticalConfig.host_op_s`: Python, dispatcher, autograd, launch; a stage whose
kernels are shorter than that is host-bound) and a collective's or send/recv's own cost beyond
its α-β time (`call_s`). Both are properties of the framework and host, not of the model, and
both fade as the model grows (a large GEMM hides the host behind it), so values learned on a
small cluster carry to large ones where multiplicative corrections of small models do not.

vTrain's single-node A100 rows (Megatron-DeepSpeed) are 1.8x the first-principles prediction on
average and up to 5.4x at micro-batch 1 and tp 8; the fit puts the host at ~40 µs an operator.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np
from scipy.optimize import minimize

from predictor.models.analytical import AnalyticalPredictor, kernel_model_config
from predictor.models.base import TrainingDataError
from predictor.models.features import Sample, by_workload
from predictor.models.roofline import AnalyticalConfig
from predictor.spec.resolver import resolve

FITTED = ("host_op_s", "call_s")
_FIRST_PRINCIPLES_S = AnalyticalConfig.host_op_s  # where a cost starts that its base leaves at zero
_BOUNDS_S = (1e-7, 1e-2)  # a cost per call between 0.1 µs and 10 ms


def log_error(config: AnalyticalConfig, samples: Sequence[Sample]) -> float:
    """Mean squared log error of the analytical model with `config` on measured iterations."""
    model, err = AnalyticalPredictor(config), []
    for spec, graph, idx in by_workload(samples):
        preds = model.predict(spec, graph, [samples[i].plan for i in idx])
        err += [np.log(p.iter_time_s / samples[i].iter_time_s) ** 2 for p, i in zip(preds, idx)]
    return float(np.mean(err))


def fit_fixed_costs(samples: Sequence[Sample], base: AnalyticalConfig | None = None,
                    max_evaluations: int = 80) -> AnalyticalConfig:
    """`base` with host_op_s and call_s fitted to the samples' measured iteration times (Nelder-Mead
    on their logarithms, squared log error). call_s only where some plan communicates: single-GPU data
    says nothing about it, so it keeps `base`'s value. GPU samples only: a measured CPU's costs are measured."""
    if not samples:
        raise TrainingDataError("fit_fixed_costs needs measured iterations; got none")
    measured = sorted({s.spec.cluster.device for s in samples if resolve(s.spec).measured})
    if measured:
        raise TrainingDataError(f"fixed-cost calibration is for GPU devices; {', '.join(measured)} is a measured "
                               "device whose step costs come from its profile (`scaledl profile`), not from a fit: "
                               "train without calibration")
    base = base or AnalyticalConfig()
    lo, hi = np.log(_BOUNDS_S)
    fitted = FITTED if any(s.plan.gpus > 1 for s in samples) else FITTED[:1]

    def config(x: np.ndarray) -> AnalyticalConfig:
        return replace(base, **dict(zip(fitted, np.exp(np.clip(x, lo, hi)).tolist())))

    # From the base's own costs (a framework's recorded ones, else first principles' host cost per operator): the
    # search over these few evaluations ends near where it starts, and a recorded cost is the better start.
    start = np.log([getattr(base, name) or _FIRST_PRINCIPLES_S for name in fitted])
    result = minimize(lambda x: log_error(config(x), samples), start, method="Nelder-Mead",
                      options={"xatol": 0.02, "fatol": 1e-5, "maxfev": max_evaluations})
    return config(result.x)


class CalibratedAnalytical(AnalyticalPredictor):
    """The analytical (kernel) model with the framework's fixed costs (`FITTED`) fitted to the training iterations,
    over the constants it prices their workloads with (`kernel_model_config` of the first): what a measured host
    cost would give it, chosen on training data only under `scaledl evaluate`'s protocols."""

    name = "analytical-calibrated"

    def fit(self, data: Any) -> "CalibratedAnalytical":
        base = kernel_model_config(resolve(data.samples[0].spec)) if data.samples else None
        self.given = fit_fixed_costs(data.samples, base)
        self._pieces = {}
        return self
