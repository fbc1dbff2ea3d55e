"""The records the learned predictors' parts pass each other: what a layer's time depends on under a plan
(`LayerKey`) and one measured layer (`LayerObs`). Their own module, so that the features and the layer-wise
model both read them and the imports run one way (layerwise -> features -> records)."""

from __future__ import annotations

from dataclasses import dataclass

from predictor.graph.layer_graph import LayerGraph
from predictor.plan import Plan
from predictor.plan.share import RankShare
from predictor.spec.workload import WorkloadSpec


@dataclass(frozen=True)
class LayerKey:
    """What a layer's time depends on under a plan: micro-batch, tensor sharding, precision, device."""

    mbs: int
    tp: int
    sp: bool
    precision: str
    device: str
    heads: int | None = None  # the model's heads (how the attention core shards)

    @property
    def share(self) -> RankShare:
        """What one rank holds of the layers: the width split by tp, the sequence of whole nodes with sp."""
        return RankShare.split({"tp": self.tp}, self.sp)


def layer_key(spec: WorkloadSpec, plan: Plan) -> LayerKey:
    return LayerKey(plan.mbs, plan.tp, plan.sp and plan.tp > 1, spec.training.precision, spec.cluster.device,
                    spec.model.heads)


@dataclass(frozen=True)
class LayerObs:
    """One measured layer: node `index` of `spec`'s `graph` under `key`, seconds per micro-batch per occurrence."""

    spec: WorkloadSpec
    graph: LayerGraph
    index: int
    key: LayerKey
    fwd_s: float
    bwd_s: float
