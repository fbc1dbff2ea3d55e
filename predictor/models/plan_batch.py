"""The analytical model over many plans at once: each piece computed once per distinct value of the plan
fields it depends on, the per-plan combination vectorised over plans.

A search predicts hundreds of thousands of plans of one workload; they differ in a few fields each
piece ignores (a stage's computation does not depend on ZeRO or dp; the gradient sync not on the
recomputation; the memory of model states not on the schedule). `PlanPieces` keeps each piece in a table
under the fields it reads, across batches; `PlanPieces.table` looks every plan's pieces up (a few dict
lookups) and combines them with numpy: schedule, overlap, exposed communication, optimizer, MFU.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import numpy as np

from predictor import comm
from predictor.frameworks import Framework
from predictor.hardware import Device
from predictor.layer_graph import LayerGraph
from predictor.memory import GIB, memory_per_stage, optimizer_bytes_per_param, peak, stage_params
from predictor.models.roofline import AnalyticalConfig, call_costs, fused_attention
from predictor.models.stage_costs import dp_time, stage_times
from predictor.parallel import Layout, apply_plan, expert_groups, group_of
from predictor.plan import Plan, nvlink_domain
from predictor.prediction import MEMORY_PARTS, TIME_PARTS
from predictor.prediction_table import HIDDEN_KINDS, PredictionTable
from predictor.workload import WorkloadSpec

# Plan fields the frameworks' default overlaps read (`predictor.frameworks`): a batch looks each plan's
# overlapped kinds up under them.
OVERLAP_FIELDS: tuple[str, ...] = ("overlap", "ep", "pp", "schedule", "zero", "tp", "sp")
_OVERLAP_KINDS: tuple[str, ...] = ("tp", "ep", "dp", "param", "pp")
# Columns of a stage row: the slowest stage's forward + backward, forward, backward, tp, cp, ep communication,
# attention, kernels, and the other stages' time per micro-batch over v (the fill and drain).
_STAGE = ("fwd_bwd", "fwd", "bwd", "tp", "cp", "ep", "attention", "kernels", "bubble")


class _Rows:
    """A growing table of fixed-width float rows with a dict from key to row, and its array."""

    def __init__(self, width: int) -> None:
        self.index: dict[Any, int] = {}
        self._rows: list[tuple[float, ...]] = []
        self._array = np.empty((0, width))

    def add(self, key: Any, row: tuple[float, ...]) -> int:
        self.index[key] = len(self._rows)
        self._rows.append(row)
        return self.index[key]

    def array(self) -> np.ndarray:
        if len(self._array) < len(self._rows):
            self._array = np.concatenate([self._array, np.asarray(self._rows[len(self._array):], dtype=float)])
        return self._array


class PlanPieces:
    """The analytical model's pieces for one workload on one device under one framework's constants."""

    def __init__(self, spec: WorkloadSpec, graph: LayerGraph, device: Device, framework: Framework,
                 config: AnalyticalConfig) -> None:
        self.spec, self.device, self.framework, self.config = spec, device, framework, config
        self.graph_ref = weakref.ref(graph)
        self.cfg = config.for_device(device)
        self.domain = nvlink_domain(spec)
        self.collective_s, self.p2p_s = call_costs(self.cfg, device)
        self.fused = fused_attention(spec, device)
        self.groups: dict[tuple, tuple[int, int, int, int, int, bool]] = {}
        self.group_list: list[comm.Group] = []
        self.group_ids: dict[comm.Group, int] = {}
        self.stage = _Rows(len(_STAGE))
        self.dp = _Rows(2)
        self.memory = _Rows(1 + len(MEMORY_PARTS))
        self.stage_memory: list[list[float]] = []
        self.optimizer = _Rows(1)
        self.p2p = _Rows(1)
        self.overlap = _Rows(len(_OVERLAP_KINDS))
        self.psi: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def serves(self, spec: WorkloadSpec, graph: LayerGraph, device: Device, framework: Framework,
               config: AnalyticalConfig) -> bool:
        return (spec is self.spec and self.graph_ref() is graph and device == self.device
                and framework is self.framework and config == self.config)

    def _group_id(self, group: comm.Group) -> int:
        gid = self.group_ids.get(group)
        if gid is None:
            gid = self.group_ids[group] = len(self.group_list)
            self.group_list.append(group)
        return gid

    def _groups(self, plan: Plan, key: tuple) -> tuple[int, int, int, int, int, bool]:
        """(tp, cp, dp·cp, expert-dp, ep group ids, whether pipeline neighbours sit in different NVLink domains)."""
        d, dev = self.domain, self.device
        ep, edp = expert_groups(plan, d, dev)
        ids = (self._group_id(group_of(plan, "tp", d, dev)), self._group_id(group_of(plan, "cp", d, dev)),
               self._group_id(group_of(plan, ("dp", "cp"), d, dev)), self._group_id(edp), self._group_id(ep),
               plan.pp > 1 and plan.group_span("pp") > d)
        self.groups[key] = ids
        return ids

    def _stage_row(self, graph: LayerGraph, lay: Layout) -> tuple[float, ...]:
        st = stage_times(self.spec, graph, lay, self.device, self.config)
        per_mb = st.fwd + st.bwd + st.tp + st.cp + st.ep
        s = int(np.argmax(per_mb))
        # Fill and drain: the other stages' micro-batch time before the slowest stage starts and after it ends,
        # (Σ t − max t)/v; (p-1)/v of the slowest stage's time when the stages are balanced (Narayanan et al. 2021).
        bubble = (per_mb.sum() - per_mb[s]) / lay.plan.v
        return (st.fwd[s] + st.bwd[s], st.fwd[s], st.bwd[s], st.tp[s], st.cp[s], st.ep[s], st.attention[s],
                st.kernels[s], bubble)

    def _psi(self, sharding: tuple, lay: Layout) -> tuple[np.ndarray, np.ndarray]:
        hit = self.psi.get(sharding)
        if hit is None:
            hit = self.psi[sharding] = stage_params(lay)
        return hit

    def _dp_row(self, sharding: tuple, lay: Layout, m: int) -> tuple[float, float]:
        psi, psi_exp = self._psi(sharding, lay)
        return tuple(np.add(dp_time(lay, psi - psi_exp, m, self.collective_s, lay.dp_group),
                            dp_time(lay, psi_exp, m, self.collective_s, lay.edp_group)))

    def _memory_row(self, lay: Layout) -> tuple[float, ...]:
        parts = memory_per_stage(self.spec, lay, self.fused, self.cfg.moe_imbalance)
        total, top = peak(parts)
        self.stage_memory.append([float(x) / GIB for x in total])
        return (float(total[top]) / GIB, *(float(parts[k][top]) / GIB for k in MEMORY_PARTS))

    def _optimizer_row(self, sharding: tuple, lay: Layout) -> tuple[float]:
        """Seconds of the optimizer step: memory-bound over the fullest rank's local optimizer state."""
        plan, spec = lay.plan, self.spec
        psi, psi_exp = self._psi(sharding, lay)
        opt_bytes = (2 * optimizer_bytes_per_param(spec.training.optimizer, spec.training.precision)
                     + lay.grad_bytes + lay.param_bytes)
        shard, expert_shard = (plan.dp * plan.cp, lay.edp_group.size) if plan.zero >= 1 else (1, 1)
        local = (psi - psi_exp) / shard + psi_exp / expert_shard
        return (float(local.max()) * opt_bytes / (self.device.mem_bandwidth * self.cfg.bw_eff),)

    def _p2p_row(self, lay: Layout) -> tuple[float]:
        """Seconds of one pipeline send/recv of a micro-batch boundary's activations."""
        dev = self.device
        link = dev.inter_node if lay.pp_link_inter else dev.op_links.get("send_recv", dev.intra_node)
        return (float(comm.p2p(lay.p2p_elems * lay.act_bytes, link) + self.p2p_s),)

    def _overlap_row(self, plan: Plan) -> tuple[float, ...]:
        kinds = self.framework.overlap(plan)
        return tuple(float(k in kinds) for k in _OVERLAP_KINDS)

    def table(self, graph: LayerGraph, plans: Sequence[Plan]) -> PredictionTable:
        """Every plan's prediction (plans must be valid for the spec: see plan_errors)."""
        spec, device = self.spec, self.device
        batch = spec.training.global_batch
        n = len(plans)
        index = np.empty((7, n), dtype=np.int64)  # stage, dp, memory, optimizer, p2p, overlap rows; micro-batches
        scalars = np.empty((5, n))  # v, pp, gpus, zero >= 3, cp ring
        stage, dp, memory, optimizer, p2p, overlap = (self.stage, self.dp, self.memory, self.optimizer, self.p2p,
                                                      self.overlap)
        for i, plan in enumerate(plans):
            tp, pp, cp, ep, v, sp, mbs, zero, rc = (plan.tp, plan.pp, plan.cp, plan.ep, plan.v, plan.sp, plan.mbs,
                                                   plan.zero, plan.recompute)
            d = plan.dp
            gkey = (d, tp, pp, cp, ep, plan.placement)
            tp_g, cp_g, dp_g, edp_g, ep_g, inter = self.groups.get(gkey) or self._groups(plan, gkey)
            m = batch // (d * mbs)
            sharding = (pp, v, tp, sp, cp, ep)
            cp_comm = plan.cp_comm if cp > 1 else ""
            lay: Layout | None = None

            def layout() -> Layout:
                nonlocal lay
                if lay is None:
                    lay = apply_plan(spec, graph, plan, device)
                return lay

            keys: tuple[tuple[_Rows, Any, Callable[[], tuple[float, ...]]], ...] = (
                (stage, (sharding, mbs, rc, cp_comm, tp_g, cp_g, ep_g), lambda: self._stage_row(graph, layout())),
                (dp, (sharding, d, zero, m if zero >= 3 else 0, dp_g, edp_g),
                 lambda: self._dp_row(sharding, layout(), m)),
                (memory, (sharding, d, zero, mbs, rc, plan.schedule, m), lambda: self._memory_row(layout())),
                (optimizer, (sharding, zero >= 1, d), lambda: self._optimizer_row(sharding, layout())),
                (p2p, (pp > 1, inter, mbs, tp if sp else 1, cp) if pp > 1 else None,
                 lambda: self._p2p_row(layout()) if pp > 1 else (0.0,)),
                (overlap, tuple(getattr(plan, f) for f in OVERLAP_FIELDS), lambda: self._overlap_row(plan)),
            )
            for r, (rows, key, compute) in enumerate(keys):
                j = rows.index.get(key)
                index[r, i] = j if j is not None else rows.add(key, compute())
            index[6, i] = m
            scalars[:, i] = (v, pp, plan.gpus, zero >= 3, cp_comm == "ring")
        return self._combine(graph, index, scalars)

    def _combine(self, graph: LayerGraph, index: np.ndarray, scalars: np.ndarray) -> PredictionTable:
        """The per-plan arithmetic of `AnalyticalPredictor`, over arrays of plans."""
        cfg, spec = self.cfg, self.spec
        fwd_bwd, fwd, bwd, tp_s, cp_s, ep_s, att_s, kern_s, bubble = self.stage.array()[index[0]].T
        grad_sync, param_gather = self.dp.array()[index[1]].T
        mem = self.memory.array()[index[2]]
        optimizer = self.optimizer.array()[index[3], 0]
        one_p2p = self.p2p.array()[index[4], 0]
        on_tp, on_ep, on_dp, on_param, on_pp = self.overlap.array()[index[5]].T.astype(bool)
        m = index[6]
        v, pp, gpus, zero3, ring = scalars
        compute = m * fwd_bwd
        tp_comm, cp_comm, ep_comm = m * tp_s, m * cp_s, m * ep_s
        pp_p2p = np.where(pp > 1, 2 * (m * v + pp - 1) * one_p2p, 0.0)

        def hidden(comm_s: np.ndarray, window: np.ndarray, on: np.ndarray) -> np.ndarray:
            return np.where(on, np.minimum(comm_s, cfg.overlap_eff * window), 0.0)

        hide = np.stack([
            hidden(tp_comm, compute, on_tp), hidden(cp_comm, m * att_s, ring.astype(bool)),
            hidden(ep_comm, compute, on_ep), hidden(grad_sync, bwd, on_dp),
            hidden(param_gather, np.where(zero3.astype(bool), compute, fwd), on_param), hidden(pp_p2p, compute, on_pp)])
        h_tp, h_cp, h_ep, h_grad, h_param, h_pp = hide
        parts = {"compute": compute + cfg.overlap_slowdown * (h_tp + h_cp + h_ep + h_grad + h_param + h_pp),
                 "tp_comm": tp_comm - h_tp, "cp_comm": cp_comm - h_cp, "ep_comm": ep_comm - h_ep,
                 "dp_comm": grad_sync + param_gather - h_grad - h_param, "pp_bubble": bubble, "pp_p2p": pp_p2p - h_pp,
                 "optimizer": optimizer}
        breakdown = np.stack([parts[k] for k in TIME_PARTS], axis=1)
        iter_time = parts[TIME_PARTS[0]].copy()
        for k in TIME_PARTS[1:]:
            iter_time += parts[k]
        model_flops = (graph.fwd_flops + graph.bwd_flops) * spec.training.global_batch
        tflops = model_flops / iter_time / gpus / 1e12
        stages, stage_index = np.unique(index[2], return_inverse=True)  # the batch's own: a table travels alone
        return PredictionTable(
            iter_time_s=iter_time, breakdown=breakdown, peak_memory_gib=mem[:, 0],
            stage_memory=[self.stage_memory[j] for j in stages.tolist()], stage_memory_index=stage_index.reshape(-1),
            memory_breakdown=mem[:, 1:],
            tflops_per_gpu=tflops, mfu=tflops * 1e12 / self.device.flops(spec.training.precision),
            hidden=hide.T.copy(),
            # compute without the host: < compute when host-bound
            extra={"kernel_compute_s": m * kern_s},
        )
