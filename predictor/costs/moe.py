"""Mixtures of experts: parameter counts and expert-parallel communication (no torch: the analytical model
imports this; the balanced routing the layer graph is traced with is `predictor.graph.moe_tracing`).

The published MoE runs ScaleDL is measured against force the token distribution to be balanced among
the experts (Megatron-Bridge performance recipes: "token distribution force-balanced among experts,
dropless"), and so is the traced layer graph: FLOPs are those of the active experts only, and the saved
tensors are the grouped GEMMs' inputs. Routing that is not balanced is priced with `AnalyticalConfig.moe_imbalance`: the most
loaded expert rank receives that factor times the balanced share, which the others wait for.

Expert parallelism (`ep`, Megatron-Core's convention): the ranks of one pipeline stage (`STAGE_RANK_AXES`) are
regrouped for the expert layers into ep groups, each rank holding E/ep experts (expert tensor parallelism
1, as the Megatron-Bridge MoE recipes run). Each MoE layer dispatches every token-expert pair to the
rank holding its expert and combines the results back: two all-to-alls in forward and two in backward,
each rank sending (ep-1)/ep of its tokens·top_k·hidden elements (Megatron-Core's alltoall token
dispatcher). The expert weights' gradients are synchronised over the expert-data-parallel group: the
stage's ranks / ep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from predictor.costs import collective_curve as curve, comm

if TYPE_CHECKING:  # pragma: no cover
    from predictor.spec.workload import ModelSpec, WorkloadSpec


def expert_params(model: "ModelSpec") -> int:
    """Parameters of the routed experts of the whole model (what ep shards): per MoE layer E experts of
    gate, up and down projections (with biases where the family's experts have them: GPT-OSS)."""
    if not model.is_moe:
        return 0
    h, f, e = model.hidden or 0, model.expert_ffn_size, model.experts or 0
    fam = model.family_entry
    per_expert = 3 * h * f + (2 * f + h if fam is not None and fam.expert_biases else 0)
    return e * per_expert * moe_layers(model)


def moe_layers(model: "ModelSpec") -> int:
    """Layers whose MLP is a mixture of experts (the leading dense layers excluded, the MTP layers included)."""
    return (model.layers or 0) - model.dense_layers + model.mtp_layers if model.is_moe else 0


def active_params(total: int, model: "ModelSpec", experts: float | None = None) -> int:
    """Parameters one token passes through: all but the experts it is not routed to (the embedding counted,
    as the models' own 'active parameters' figures count it); `experts`: the routed experts' parameters where
    the layer graph counts them (a hybrid's MoE layers), else `expert_params`."""
    if not model.is_moe:
        return total
    unused = 1 - (model.top_k or 0) / (model.experts or 1)
    return int(round(total - unused * (expert_params(model) if experts is None else experts)))


def alltoall(size: float, group: comm.Group) -> float:
    """Seconds of one all-to-all in which each of the group's n ranks sends `size` bytes spread evenly over
    the n ranks (1/n of it stays local): inside an NVLink domain (n_intra ranks) over NVLink, to the other
    domains over each GPU's NIC, the two running concurrently, each at its link's all-to-all curve
    (`predictor.costs.collective_curve`), whose per-protocol latency prices an all-to-all's many small messages."""
    n = group.size
    if n <= 1 or size <= 0:
        return 0.0
    intra = group.intra_for("alltoall")
    intra_bytes = size * (group.n_intra - 1) / n
    inter_bytes = size * (n - group.n_intra) / n
    t_intra = float(curve.seconds(intra_bytes, group.n_intra - 1, intra, "alltoall")) if group.n_intra > 1 else 0.0
    t_inter = float(curve.seconds(inter_bytes, 1, group.inter, "alltoall")) if group.n_inter > 1 else 0.0
    return max(t_intra, t_inter)
