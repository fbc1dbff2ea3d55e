"""Analytical roofline predictor: the baseline, and the fallback of the learned ScaleDL model.

Per layer a roofline (`predictor.models.roofline`); communication from `predictor.costs.comm`, call by call;
pipeline fill and drain from the other stages' time per micro-batch ((p-1)/(v·m) of the ideal when
stages are balanced); optimizer step memory-bound over the local optimizer state
(`predictor.models.stage_costs`, combined over plans by `predictor.models.plan_batch`). Nothing here is
fit to measurements of training iterations; every constant is in `AnalyticalConfig` with its reason.
"""

from __future__ import annotations

from typing import Any, Sequence

from predictor.costs.moe import active_params
from predictor.costs.prediction import Prediction
from predictor.costs.prediction_table import PredictionTable
from predictor.frameworks import Framework
from predictor.graph.layer_graph import LayerGraph
from predictor.kernels.gemm import measured_gemm
from predictor.models.base import Dominated, Predictor
from predictor.models.plan_batch import PlanPieces
from predictor.models.roofline import AnalyticalConfig, framework_config, fused_attention_curves
from predictor.plan import Plan
from predictor.spec.hardware import DEVICES, GENERATIONS, Device, gemm_facts
from predictor.spec.resolver import Resolved, resolve
from predictor.spec.workload import WorkloadSpec

# Workloads whose pieces a predictor keeps (a replica serving several cluster sizes asks for each in turn).
_KEPT_WORKLOADS = 8


def constants_note(framework: Framework, gen: str, device: str = "") -> str:
    """Which constants price a prediction: the framework's calibration for the device generation (and the device's own
    constants where some were measured on it), or first principles where none was fitted on it (a constant fitted on
    one generation never prices another)."""
    if gen in framework.constants:
        own = f" and on {device}" if device in framework.constants else ""
        return f"{framework.name} constants calibrated on {gen}{own}"
    generations = set(GENERATIONS.values())
    fitted = ", ".join(sorted(key for key in framework.constants if key in generations)) or "no generation"
    devices = sorted(key for key in framework.constants if key not in generations)
    fitted += f"; on {', '.join(devices)} alone" if devices else ""
    grid = DEVICES.get(device) and measured_gemm(DEVICES[device], "bf16")
    facts = (f"; GEMM rates from the measured grid of the {gen} device profiles (XLA's matmul tables)" if grid
             else f"; GEMM efficiency from the {gen} device facts" if gemm_facts(gen, "bf16") else "")
    return f"first principles: {framework.name} has no constants fitted on {gen} (fitted on {fitted}){facts}"


def attention_note(resolved: Resolved) -> str:
    """What prices the attention of a prediction: the device facts' figures of the framework's fused kernel on the
    device's generation, or where they do not (unfused attention, no figures of the kernel, constants fitted on the
    generation) the batched-GEMM model, and why."""
    curves = fused_attention_curves(resolved)
    if curves is not None:
        return f"device facts: {curves.how}"
    framework, gen, kernel = resolved.framework, resolved.generation, resolved.attention_backend
    if kernel is None:
        return "first principles: unfused attention as batched GEMMs plus the scores' passes through memory"
    if framework.fitted_on(gen, resolved.device.name):
        return (f"batched GEMMs at {framework.title}'s gemm_eff_max fitted on {gen} (with attention priced so); "
                f"device facts of {kernel} not used")
    return (f"first principles (GEMM efficiency): the device facts have no figures of {kernel or 'its fused kernel'} "
            f"on {gen} at {resolved.spec.training.precision}")


def kernel_model_config(resolved: Resolved) -> AnalyticalConfig:
    """The constants the analytical (kernel) model prices a resolved spec with when given none: its framework's on
    its device (`framework_config`: device facts, the cluster's measured launch and host costs, recorded
    constants). The learned predictor starts from these."""
    device = resolved.device
    return framework_config(resolved.framework, resolved.generation, device.name, device.extra)


class AnalyticalPredictor(Predictor):
    """Roofline + α-β + schedule model; no learned state.

    Communication a framework overlaps (`predictor.frameworks`) is charged only where it is exposed, as the
    framework schedules it (`predictor.models.overlap`): gradient buckets beside the rest of the last micro-batch's
    backward, parameter all-gathers beside the first forward (every pass's, prefetched unit by unit, under ZeRO-3),
    tensor-parallel collectives beside their GEMMs, the expert all-to-all and pipeline send/recv beside another
    micro-batch, the context-parallel ring beside attention; the collectives at a pass's edge are exposed, and all
    of them together hide at most the computation. Each hidden second slows the computation beside it by the share
    of the SMs the communication kernel holds. `Prediction.hidden_comm` keeps what was hidden.
    """

    name = "analytical"
    # Read from `PlanPieces.table`: overlapping turns each second hidden into `overlap.slowdown` (COMM_SMS of the
    # device's SMs, under 1) of a second of computation, and no memory reads it; the pipeline's bubble is the same
    # under GPipe and 1F1B, and GPipe holds all m micro-batches in flight where 1F1B holds at most pp - rank
    # (`predictor.memory.in_flight`).
    dominated = (
        Dominated("overlap", "none", "auto", "no overlap exposes the communication overlapping hides, in the same "
                  "memory"),
        Dominated("schedule", "gpipe", "1f1b", "GPipe has 1F1B's bubble and holds every micro-batch in flight"),
    )

    def __init__(self, config: AnalyticalConfig | None = None, device: Device | None = None) -> None:
        self.given = config  # None: each framework's calibrated constants (framework_config)
        self.device = device  # None: the spec's own (`predictor.spec.resolver.resolve`)
        self._pieces: dict[int, PlanPieces] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pieces": {}}  # pieces are rebuilt where the predictor is sent

    @property
    def config(self) -> AnalyticalConfig:
        """The constants given, else the first-principles ones (frameworks may refine them: `framework_config`)."""
        return self.given or AnalyticalConfig()

    def predict(self, spec: WorkloadSpec, graph: LayerGraph, plans: Sequence[Plan]) -> list[Prediction]:
        return self.predict_table(spec, graph, plans).rows()

    def predict_table(self, spec: WorkloadSpec, graph: LayerGraph, plans: Sequence[Plan]) -> PredictionTable:
        pieces = self.pieces(spec, graph)
        table = pieces.table(graph, plans)
        resolved = pieces.resolved
        if self.given is None:
            table.shared_extra["constants"] = constants_note(pieces.framework, resolved.generation, pieces.device.name)
        table.shared_extra["attention_kernel"] = pieces.framework.attention_kernel
        table.shared_extra["attention_rate"] = attention_note(resolved)
        if spec.model.is_moe:  # all of a mixture of experts' parameters, and those one token passes (top_k experts)
            table.shared_extra.update(params=graph.params, active_params=active_params(
                graph.params, spec.model, sum(n.params * n.count for n in graph.nodes if n.kind == "experts")))
        return table

    def pieces(self, spec: WorkloadSpec, graph: LayerGraph) -> PlanPieces:
        """The pieces of (spec, graph) under this predictor's device and constants, kept across calls."""
        resolved = resolve(spec, self.device)
        config = self.given or kernel_model_config(resolved)
        pieces = self._pieces.get(id(spec))
        if pieces is None or not pieces.serves(resolved, graph, config):
            if len(self._pieces) >= _KEPT_WORKLOADS:
                self._pieces.pop(next(iter(self._pieces)))
            pieces = self._pieces[id(spec)] = PlanPieces(resolved, graph, config)
        return pieces
