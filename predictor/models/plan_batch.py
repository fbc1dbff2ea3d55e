"""The analytical model over many plans at once: each piece computed once per distinct value of the plan
fields it depends on, everything per plan vectorised over plans.

A search predicts hundreds of thousands of plans of one workload; they differ in a few fields each
piece ignores (a stage's computation does not depend on ZeRO or dp; the gradient sync not on the
recomputation; model states not on the micro-batch or the schedule). `PlanPieces` keeps each piece in a
table under the fields it reads, across batches; `PlanPieces.table` looks every plan's pieces up (a few
dict lookups per plan) and does the rest with numpy on (plans × pipeline stages) arrays: the slowest
stage, fill and drain, overlap, exposed communication, the peak memory rank, MFU.
"""

from __future__ import annotations

import weakref
from operator import attrgetter
from typing import Any, Callable, Sequence

import numpy as np

from predictor.costs import comm
from predictor.costs.lora import trainable_params
from predictor.costs.parallel import Layout, apply_plan, plan_groups
from predictor.costs.prediction import MEMORY_PARTS, TIME_PARTS
from predictor.costs.prediction_table import PredictionTable, row_sums
from predictor.frameworks import Framework
from predictor.graph.layer_graph import LayerGraph
from predictor.memory import GIB, buffer_bytes, in_flight, kv_share, model_state_bytes, saved_per_sample, stage_params
from predictor.memory.accounting import activity_bytes, offloaded_bytes, stage_memory_parts, state_bytes
from predictor.memory.lever_settings import Levers, levers_of
from predictor.models import fsdp2, overlap
from predictor.models.cuda_graphs import static_bytes
from predictor.models.roofline import AnalyticalConfig, call_costs, routed
from predictor.models.stage_costs import compute_parts, grad_sync_time, offload_waits, optimizer_time, p2p_time
from predictor.plan import AXIS_NAMES, HIDDEN_KINDS, OVERLAP_KINDS, STAGE_AXES, Axis, Plan, nvlink_domain
from predictor.plan.axes import (PIPELINE_AXIS, REPLICA_AXIS, SHARDING_FIELDS, STAGE_FIELDS, SYNC_GROUPS, hidden_named,
                                 part_named)
from predictor.spec.hardware import Device
from predictor.spec.resolver import Resolved
from predictor.spec.workload import WorkloadSpec

_DEGREES = attrgetter(*AXIS_NAMES)
_SHARDING = attrgetter(*SHARDING_FIELDS)
_REPLICAS, _STAGES = attrgetter(REPLICA_AXIS), attrgetter(PIPELINE_AXIS)
# Per stage axis: the plan fields its cost reads (a memo key), and the plan value that always hides it.
_COST_FIELDS = tuple(attrgetter(*SHARDING_FIELDS, *a.cost_fields) for a in STAGE_AXES)
# The stage axes whose collectives a host-bound stage's host runs ahead during (`Axis.host_runs_ahead`).
_HOST_AHEAD = tuple(k for k, a in enumerate(STAGE_AXES) if a.host_runs_ahead)
# Where in a plan's degrees (`_DEGREES`) each stage axis's degree is.
_STAGE_AT = tuple(AXIS_NAMES.index(a.name) for a in STAGE_AXES)
# The parts of an iteration a framework's kernels and costs set (`Prediction.extra['framework_s']`, seconds before
# overlap): its attention kernel's forward, backward and recomputed forward; the host's pace beyond the kernels
# (its per-operator cost); its per-call cost on every collective and send/recv. Two frameworks on one plan and
# device differ in time by these and by what each overlaps.
FRAMEWORK_PARTS: tuple[str, ...] = ("attention", "host", "calls")
_ALWAYS_HIDDEN = tuple(tuple(a.overlapped_when.split("=")) if a.overlapped_when else None for a in STAGE_AXES)
# Each stage axis's one kind of hidden communication and one time part (`Axis.hidden`, `Axis.parts`).
_STAGE_KINDS = tuple(kind for a in STAGE_AXES for (kind,) in [a.hidden])
_STAGE_PARTS = tuple(part.name for a in STAGE_AXES for (part,) in [a.parts])
# What the replicas and the pipeline add, by role (`predictor.plan.axes.PART_ROLES`, `HIDDEN_ROLES`): the gradient
# sync's time part, the pipeline's bubble and send/recv; the gradient reduction, the parameter all-gather and the
# send/recv hidden, each with the overlap kind that hides it.
_SYNC_PART, _BUBBLE_PART, _SEND_PART = (part_named(role) for role in ("sync", "bubble", "send"))
_GRAD, _GATHER, _SEND = (hidden_named(role) for role in ("grad_sync", "param_gather", "send"))


def _mean_calls(sync: Sequence[float]) -> tuple[float, float]:
    """The mean gradient-sync and parameter-gather call of `grad_sync_time`'s figures (seconds over calls): the edge
    nothing hides where no unit structure says which call is last."""
    grad, gather, _, grad_calls, gather_calls = sync
    return grad / max(grad_calls, 1.0), gather / max(gather_calls, 1.0)


def stage_cost(axis: Axis) -> Callable[..., np.ndarray]:
    """An axis's per-stage cost: the "stage_cost" function registered onto it (the built-in axes' in
    `predictor.models.stage_costs`, imported above)."""
    cost = axis.function("stage_cost")
    if cost is None:
        raise LookupError(f"axis {axis.name!r} is priced per stage (Axis.stage_cost) but no stage cost is registered "
                          f"onto it: decorate its cost function with @axis_function({axis.name!r}, 'stage_cost')")
    return cost


class _Scalars:
    """A growing table of fixed-width float rows, found by key."""

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


class _Stages:
    """A growing table of per-pipeline-stage vectors (k per row, one entry per stage), found by key; the rows
    are stored end to end, so a deep pipeline's row costs its depth, not every row's."""

    def __init__(self, k: int) -> None:
        self.index: dict[Any, int] = {}
        self._rows: list[np.ndarray] = []
        self._flat = np.zeros((0, k))  # (total stages, k)
        self._start = np.zeros(0, dtype=np.int64)
        self._length = np.zeros(0, dtype=np.int64)

    def add(self, key: Any, row: np.ndarray) -> int:
        self.index[key] = len(self._rows)
        self._rows.append(np.atleast_2d(row))
        return self.index[key]

    def gather(self, rows: np.ndarray, depth: int) -> np.ndarray:
        """(k, len(rows), depth): rows of `depth` stages (a one-stage row, the shared zeros, is repeated)."""
        done = len(self._start)
        if done < len(self._rows):
            new = self._rows[done:]
            lengths = np.array([r.shape[1] for r in new], dtype=np.int64)
            self._start = np.concatenate([self._start, len(self._flat) + np.cumsum(lengths) - lengths])
            self._length = np.concatenate([self._length, lengths])
            self._flat = np.concatenate([self._flat, *(r.T for r in new)])
        at = self._start[rows][:, None] + np.minimum(np.arange(depth), self._length[rows][:, None] - 1)
        return self._flat[at].transpose(2, 0, 1)


class PlanPieces:
    """The analytical model's pieces for one workload on one device under one framework's constants."""

    def __init__(self, resolved: Resolved, graph: LayerGraph, config: AnalyticalConfig) -> None:
        self.resolved, self.given_config = resolved, config
        self.config = routed(config, resolved.spec.training.moe_imbalance)
        self.spec, self.device, self.framework = resolved.spec, resolved.device, resolved.framework
        self.graph_ref = weakref.ref(graph)
        self.cfg = self.config.for_device(self.device)
        self.domain = resolved.nvlink_domain
        self.collective_s, self.p2p_s = call_costs(self.cfg, self.device)
        self.kernels = resolved.kernels
        self.fused = self.kernels.fused_attention
        self.groups: dict[tuple, tuple] = {}
        self.group_ids: dict[comm.Group, int] = {}
        self.layouts: dict[tuple, Layout] = {}
        self.psi: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        # per pipeline stage: the layers' forward, backward, host forward, host backward, MoE host waits
        # forward, backward, attention, attention with its recomputation, tp per-call seconds
        # (`stage_costs.compute_parts`); each stage axis's communication; memory, in two pieces: the model states
        # (weights, gradients, optimizer) and what the micro-batches leave (activations, backward working set,
        # buffers, runtime, the CUDA graphs' static buffers), since a ZeRO stage does not change the second nor a
        # micro-batch or a recomputation the first (`accounting.state_bytes`, `activity_bytes`)
        self.compute = _Stages(12)
        self.comm = tuple(_Stages(1) for _ in STAGE_AXES)
        self.states = _Stages(3)
        self.activity = _Stages(5)
        # what the allocator reserves beyond its allocations (ScaleDL's eager runner on a measured device: nothing)
        self.fragmentation = 0.0 if self.device.measured else self.framework.memory.fragmentation
        # per plan: gradient sync, parameter gather, their per-call seconds and their calls, the last gradient call's
        # and one gather call's seconds (what nothing hides), the copies beside them; one p2p send, the optimizer step,
        # overlapped kinds
        self.sync = _Scalars(8)
        self.p2p = _Scalars(1)
        self.optimizer = _Scalars(1)
        self.overlap = _Scalars(len(OVERLAP_KINDS) + len(STAGE_AXES))  # and each stage axis's exposed share
        # a plan's four stage pieces' rows and its two memory rows, under one key each
        self.stage_rows: dict[tuple, tuple[int, ...]] = {}
        self.memory_rows: dict[tuple, tuple[int, ...]] = {}
        for rows in self.comm:  # a stage axis of degree 1: nothing per stage; no pipeline: no send
            rows.add(None, np.zeros(1))
        self.p2p.add(None, (0.0,))

    def serves(self, resolved: Resolved, graph: LayerGraph, config: AnalyticalConfig) -> bool:
        return (resolved.spec is self.spec and self.graph_ref() is graph and resolved.device == self.device
                and resolved.framework is self.framework and config == self.given_config)

    def _group_id(self, group: comm.Group) -> int:
        return self.group_ids.setdefault(group, len(self.group_ids))

    def _groups(self, plan: Plan, key: tuple) -> tuple:
        """(the plan's GPUs, the ids of the groups gradients sync over (`SYNC_GROUPS`), whether pipeline neighbours sit
        in different NVLink domains, then each stage axis's group id: None for an axis without a group of its own)."""
        g = plan_groups(plan, self.domain, self.device)
        ids = (plan.gpus, tuple(self._group_id(g.groups[name]) for name in SYNC_GROUPS), g.stage_link_inter,
               *(self._group_id(g.groups[a.group]) if a.group else None for a in STAGE_AXES))
        self.groups[key] = ids
        return ids

    def _layout(self, graph: LayerGraph, plan: Plan, key: tuple) -> Layout:
        """`apply_plan`'s layout, shared by the plans alike in degrees, placement, sp, mbs and v (pieces read
        the plan's own other fields from it)."""
        base = self.layouts.get(key)
        if base is None:
            base = self.layouts[key] = apply_plan(self.spec, graph, plan, self.device)
        lay = object.__new__(Layout)  # a shallow copy, at a tenth of copy.copy's cost
        lay.__dict__.update(base.__dict__, plan=plan)
        return lay

    def _psi(self, sharding: tuple, lay: Layout) -> tuple[np.ndarray, np.ndarray]:
        hit = self.psi.get(sharding)
        if hit is None:  # the parameters that train: LoRA's adapters alone (predictor.costs.lora), else all
            rank = self.spec.training.lora_rank
            hit = self.psi[sharding] = trainable_params(lay, rank) if rank else stage_params(lay)
        return hit

    def _sync_row(self, sharding: tuple, lay: Layout, m: int) -> tuple[float, ...]:
        """`stage_costs.grad_sync_time` over the dense and the expert parameters' groups, each call's edge a mean
        call; or under torchtitan's FSDP2 (`fsdp2_units`) its units, edges and copies (`predictor.models.fsdp2`)."""
        psi, psi_exp = self._psi(sharding, lay)
        whole = self.resolved.spec.training.optimizer == "muon"  # dist_muon all-reduces whole gradients
        experts = grad_sync_time(lay, psi_exp, m, self.collective_s, lay.expert_sync_group, whole)
        if self.fsdp2_units(lay.plan):
            recipe = self.resolved.recipe_name
            dense = fsdp2.grad_sync_time(lay, psi - psi_exp, m, self.collective_s, lay.sync_group,
                                         fsdp2.float8_gathers(recipe, lay.plan),
                                         self.device.mem_bandwidth * self.cfg.bw_eff)
            return tuple(np.add(dense, (*experts, *_mean_calls(experts), 0.0)))
        total = np.add(grad_sync_time(lay, psi - psi_exp, m, self.collective_s, lay.sync_group, whole), experts)
        return (*total, *_mean_calls(total), 0.0)

    def fsdp2_units(self, plan: Plan) -> bool:
        """Whether the plan's data parallelism is FSDP2 over torchtitan's units: its framework keeps FSDP2's states
        (`MemoryFacts.fsdp2_states`), the plan shards (zero >= 2), and every parameter trains (no LoRA)."""
        return self.framework.memory.fsdp2_states and plan.zero >= 2 and not self.spec.training.lora_rank

    def _optimizer_row(self, sharding: tuple, lay: Layout) -> tuple[float]:
        return (optimizer_time(self.resolved, lay, *self._psi(sharding, lay), self.cfg),)

    def _p2p_row(self, lay: Layout) -> tuple[float]:
        return (p2p_time(lay, self.device, self.p2p_s),)

    def _overlap_row(self, plan: Plan) -> tuple[float, ...]:
        """Whether each OVERLAP_KINDS kind hides, and per stage axis the share of its traffic that stays exposed when
        it does (the framework's own where its overlap decides it, `Framework.exposed_shares`)."""
        kinds = self.framework.overlap(plan)
        if not self.kernels.transformer_engine:
            kinds = kinds - self.framework.kernels.te_overlap
        own = self.framework.exposed_shares
        shares = (own[k.name](plan) if k.name in own else overlap.EDGE_SHARE.get(a.window, 0.0)
                  for a, k in zip(STAGE_AXES, _STAGE_KINDS))
        return (*(float(k in kinds) for k in OVERLAP_KINDS), *shares)

    def _levers(self, plan: Plan) -> Levers:
        recipe = self.resolved.recipe  # a block-scaled recipe keeps row- and columnwise weight copies
        return levers_of(plan, self.framework.memory, "mx" if recipe is not None and recipe.own_columnwise else "cs",
                         unfused_attention=not self.fused, compiled=self.framework.compiled(plan, self.spec))

    def _compute_row(self, graph: LayerGraph, lay: Layout) -> np.ndarray:
        """`compute_parts`, with the GPU's stalls on activation offloading added to the MoE waits (both are device
        time that the host's pace does not stretch)."""
        parts = compute_parts(self.resolved, graph, lay, self.config)
        if lay.plan.offload != "none" and not self.device.measured:
            to_host = offloaded_bytes(self.spec, graph, lay, self.framework.memory, self._levers(lay.plan))
            parts[4:6] += offload_waits(parts[0], parts[1], to_host, self.device)
        return parts

    def _states_row(self, lay: Layout) -> np.ndarray:
        """(weights, gradients, optimizer) bytes per pipeline stage: as the framework allocates them on a GPU
        (`predictor.memory.accounting`); on a measured device (ScaleDL's eager runner) the ZeRO model states."""
        if not self.device.measured:
            return state_bytes(self.spec, lay, self.framework.memory, self._levers(lay.plan))
        return np.stack(model_state_bytes(self.spec, lay))

    def _activity_row(self, graph: LayerGraph, lay: Layout, sharding: tuple) -> np.ndarray:
        """(saved activations, backward working set, buffers, runtime, CUDA graphs' static buffers) bytes per pipeline
        stage: on a GPU as the framework allocates them; on a measured device (no CUDA runtime) from the layer graph's
        saved elements, with its buffers."""
        if not self.device.measured:
            parts = activity_bytes(self.spec, graph, lay, self.framework.memory, self._levers(lay.plan),
                                   self.cfg.moe_imbalance)
            return np.concatenate([parts, static_bytes(lay, self.kernels, in_flight(lay))[None]])
        kept, one_block = saved_per_sample(lay, fused_attention=self.fused, kv_share=kv_share(self.spec))
        acts = kept * lay.plan.mbs * in_flight(lay) + one_block * lay.plan.mbs
        buffers = buffer_bytes(lay, self._psi(sharding, lay)[0], self.cfg.moe_imbalance)
        none = np.zeros_like(acts)
        return np.stack([acts, none, buffers + none, none, none])

    def _pieces(self) -> tuple[tuple[Any, Callable[[LayerGraph, Layout, tuple, int], Any]], ...]:
        """Each piece's table and how to compute a row of it (from a plan's layout, sharding and micro-batches),
        in the order of the rows of `table`'s index: stage pieces, memory pieces, then the others."""
        resolved, cfg = self.resolved, self.cfg
        return (
            (self.compute, lambda g, lay, sh, m: self._compute_row(g, lay)),
            *((rows, lambda g, lay, sh, m, cost=stage_cost(axis): cost(resolved, lay, cfg))
              for rows, axis in zip(self.comm, STAGE_AXES)),
            (self.states, lambda g, lay, sh, m: self._states_row(lay)),
            (self.activity, lambda g, lay, sh, m: self._activity_row(g, lay, sh)),
            (self.sync, lambda g, lay, sh, m: self._sync_row(sh, lay, m)),
            (self.p2p, lambda g, lay, sh, m: self._p2p_row(lay)),
            (self.optimizer, lambda g, lay, sh, m: self._optimizer_row(sh, lay)),
            (self.overlap, lambda g, lay, sh, m: self._overlap_row(lay.plan)),
        )

    def table(self, graph: LayerGraph, plans: Sequence[Plan]) -> PredictionTable:
        """Every plan's prediction (plans must be valid for the spec: see plan_errors).

        A plan's stage pieces (computation, each stage axis's communication) are found together under one key, its
        two memory pieces under another: a plan like an earlier one in both costs six lookups."""
        batch = self.spec.training.global_batch
        pieces = self._pieces()
        n_stage = 1 + len(STAGE_AXES)
        stage_rows, memory_rows = self.stage_rows, self.memory_rows
        rest = [rows.index for rows, _ in pieces[n_stage + 2:]]
        found: list[tuple[int, ...]] = []
        scalars: list[tuple[float, ...]] = []
        for plan in plans:
            # what the computation and memory read beyond the sharding: the recomputation, the offloading, and the
            # axes' `STAGE_FIELDS` (the dispatcher's permutations, `predictor.models.moe_kernels`, and buffers)
            stages, v, sp, mbs, zero, rc, d = (_STAGES(plan), plan.v, plan.sp, plan.mbs, plan.zero,
                                               (plan.recompute, plan.recompute_layers, plan.offload,
                                                *(getattr(plan, f) for f in STAGE_FIELDS)), _REPLICAS(plan))
            degrees = _DEGREES(plan)
            gkey = (degrees, plan.placement)
            gpus, sync, inter, *axis_groups = self.groups.get(gkey) or self._groups(plan, gkey)
            m = batch // (d * mbs)
            sharding = _SHARDING(plan)
            comm_keys = tuple((fields(plan), group) if degrees[at] > 1 else None
                              for at, fields, group in zip(_STAGE_AT, _COST_FIELDS, axis_groups))
            stage_key = (sharding, mbs, rc, comm_keys)
            states_key = (sharding, d, zero, plan.optimizer_offload, plan.moments, plan.grads)
            # `rc` holds the stage fields (the dispatcher's buffers); a measured device's buffers read the ZeRO stage
            activity_key = (sharding, d, mbs, rc, plan.schedule, m, self.device.measured and zero)
            memory_key = (states_key, activity_key)
            keys = ((sharding, d, zero, m if zero >= 3 else 0, sync),
                    (inter, mbs, sharding) if stages > 1 else None,
                    (sharding, zero >= 1, d, plan.optimizer_offload, plan.moments),
                    (plan.overlap, degrees, plan.schedule, zero, sp, plan.recompute))  # what overlap reads
            stage, memory = stage_rows.get(stage_key), memory_rows.get(memory_key)
            got = [index.get(key) for index, key in zip(rest, keys)]
            if stage is None or memory is None or None in got:
                lay = self._layout(graph, plan, (gkey, sp, mbs, v))
                if stage is None:
                    stage = stage_rows[stage_key] = self._found(pieces[:n_stage], ((sharding, mbs, rc), *comm_keys),
                                                                graph, lay, sharding, m)
                if memory is None:
                    memory = memory_rows[memory_key] = self._found(pieces[n_stage:n_stage + 2], memory_key, graph,
                                                                   lay, sharding, m)
                got = list(self._found(pieces[n_stage + 2:], keys, graph, lay, sharding, m))
            found.append((*stage, *memory, *got))
            scalars.append((m, mbs, v, stages, gpus, zero >= 3,
                            *(when is not None and getattr(plan, when[0]) == when[1] for when in _ALWAYS_HIDDEN)))
        return self._combine(graph, np.array(found, dtype=np.int64).T.reshape(len(pieces), -1),
                             np.array(scalars, dtype=float).T.reshape(6 + len(STAGE_AXES), -1))

    @staticmethod
    def _found(pieces: Sequence[tuple[Any, Callable]], keys: Sequence[Any], graph: LayerGraph, lay: Layout,
               sharding: tuple, m: int) -> tuple[int, ...]:
        """The rows of `keys` in `pieces`' tables, computing those not there yet."""
        out = []
        for (rows, build), key in zip(pieces, keys):
            j = rows.index.get(key)
            out.append(j if j is not None else rows.add(key, build(graph, lay, sharding, m)))
        return tuple(out)

    def _combine(self, graph: LayerGraph, index: np.ndarray, scalars: np.ndarray) -> PredictionTable:
        """The per-plan arithmetic, over arrays of plans (per pipeline depth over (plans × stages) arrays)."""
        spec = self.spec
        n_comm = len(STAGE_AXES)
        m, mbs, v, stages, gpus, zero3 = scalars[:6]
        always = scalars[6:].astype(bool)
        n = len(m)
        stage = np.empty((14 + n_comm, n))
        peak_gib, memory_parts = np.empty(n), np.empty((n, len(MEMORY_PARTS)))
        offsets = np.concatenate([[0], np.cumsum(stages, dtype=np.int64)]).astype(np.int64)
        stage_gib = np.empty(offsets[-1])
        for depth in np.unique(stages).astype(int).tolist():
            sel = np.flatnonzero(stages == depth)
            stage[:, sel] = self._slowest_stage(index[:, sel], depth)
            at = offsets[sel][:, None] + np.arange(depth)
            stage_gib[at], peak_gib[sel], memory_parts[sel] = self._peak_memory(index[:, sel], depth)
        f_s, b_s, comm_s = stage[0], stage[1], stage[2:2 + n_comm]
        att_s, kern_s, others, *path = stage[2 + n_comm:11 + n_comm]
        experts = stage[11 + n_comm:]  # the routed experts' forward, backward and MoE layers of the slowest stage
        # Fill and drain: the other stages' micro-batch time before the slowest stage starts and after it ends,
        # (Σ t − max t)/v; (p-1)/v of the slowest stage's time when the stages are balanced (Narayanan et al. 2021).
        bubble = others / v
        compute = m * (f_s + b_s)
        sync_row, p2p_row, optimizer_row, overlap_row = range(n_comm + 3, n_comm + 7)
        grad_sync, param_gather, sync_calls, grad_calls, gather_calls, grad_edge, gather_edge, copies = (
            self.sync.array()[index[sync_row]].T)
        one_send = self.p2p.array()[index[p2p_row], 0]
        sends = np.where(stages > 1, 2 * (m * v + stages - 1), 0.0)
        p2p = sends * one_send
        # What the framework's own kernels and costs add to the iteration before overlap: the slowest stage's
        # micro-batches plus the other stages' fill and drain (as compute and pp_bubble count them)
        attention, host, layer_calls = (m * at + other / v for at, other in zip(path[::2], path[1::2]))
        framework = np.stack([attention, host, layer_calls + sync_calls + sends * self.p2p_s], axis=1)
        optimizer = self.optimizer.array()[index[optimizer_row], 0]
        overlapped = self.overlap.array()[index[overlap_row]].T
        kinds, shares = overlapped[:len(OVERLAP_KINDS)], overlapped[len(OVERLAP_KINDS):]
        on = dict(zip(OVERLAP_KINDS, (k.astype(bool) for k in kinds)))
        hide = self._hidden(on, always, comm_s, m, f_s, b_s, att_s, kern_s, experts, (grad_sync, grad_calls, grad_edge),
                            (param_gather, gather_calls, gather_edge), zero3.astype(bool), p2p, one_send, shares)
        parts: dict[str, np.ndarray] = {}
        for k, (kind, part) in enumerate(zip(_STAGE_KINDS, _STAGE_PARTS)):
            parts[part] = m * comm_s[k] - hide[kind.name]
        slowed = sum((hide[kind] for kind in HIDDEN_KINDS), np.zeros_like(compute))
        parts.update({"compute": compute + overlap.slowdown(self.device) * slowed + copies,
                      _SYNC_PART: grad_sync + param_gather - hide[_GRAD.name] - hide[_GATHER.name],
                      _BUBBLE_PART: bubble, _SEND_PART: p2p - hide[_SEND.name], "optimizer": optimizer})
        breakdown = np.stack([parts[k] for k in TIME_PARTS], axis=1)
        iter_time = row_sums(breakdown)
        model_flops = (graph.fwd_flops + graph.bwd_flops) * spec.training.global_batch
        tflops = model_flops / iter_time / gpus / 1e12
        return PredictionTable(
            iter_time_s=iter_time, breakdown=breakdown,
            peak_memory_gib=peak_gib, stage_memory_gib=stage_gib, stage_offsets=offsets, memory_breakdown=memory_parts,
            tflops_per_gpu=tflops, mfu=tflops * 1e12 / self.device.flops(spec.training.precision),
            hidden=np.stack([hide[k] for k in HIDDEN_KINDS], axis=1),
            extra={"kernel_compute_s": m * kern_s,  # compute without the host: < compute when host-bound
                   "framework_s": framework}, extra_names={"framework_s": FRAMEWORK_PARTS},
        )

    @staticmethod
    def _hidden(on: dict[str, np.ndarray], always: np.ndarray, comm_s: np.ndarray, m: np.ndarray, f_s: np.ndarray,
                b_s: np.ndarray, att_s: np.ndarray, kern_s: np.ndarray, experts: np.ndarray,
                grads: tuple[np.ndarray, ...], gathers: tuple[np.ndarray, ...], zero3: np.ndarray, p2p: np.ndarray,
                one_send: np.ndarray, shares: np.ndarray) -> dict[str, np.ndarray]:
        """Seconds of each HIDDEN_KINDS communication hidden, over plans (`predictor.models.overlap`): each kind the
        plan overlaps beside the window its framework's schedule gives it, all of them beside the stage's
        computation. `grads` and `gathers`: the gradient sync's and the parameter all-gather's seconds, calls, and the
        call nothing hides; `shares`: per stage axis, the share of its traffic nothing hides (`_overlap_row`)."""
        grad_sync, grad_calls, grad_edge = grads
        param_gather, gather_calls, gather_edge = gathers
        compute = m * (f_s + b_s)
        windows = {"compute": compute, "attention": m * att_s, "gemms": m * np.maximum(kern_s - att_s, 0.0)}
        # the axes hidden phase by phase run their exchanges in the same dispatch and combine phases; what
        # delay_wgrad_compute ("wgrad") hides more of them, by the combined 1F1B's phases
        phased = [k for k, axis in enumerate(STAGE_AXES) if axis.window == "phases"]
        together = sum((comm_s[k] for k in phased), np.zeros_like(f_s))
        gained = m * np.where(on["wgrad"], overlap.combined_1f1b_exposed(together, f_s, b_s, *experts, False)
                              - overlap.combined_1f1b_exposed(together, f_s, b_s, *experts, True), 0.0)
        hide: dict[str, np.ndarray] = {}
        for k, (axis, kind) in enumerate(zip(STAGE_AXES, _STAGE_KINDS)):
            total = m * comm_s[k]
            edge = total * shares[k] + comm_s[k] * overlap.EDGE_MICROBATCHES.get(axis.window, 0.0)
            if axis.window == "phases":  # half beside the other micro-batch's attention, half beside the rest
                share = np.where(together > 0, comm_s[k] / np.maximum(together, 1e-300), 0.0)
                own = np.minimum(total / 2, windows["attention"]) + np.minimum(total / 2, windows["gemms"])
                own = np.clip(np.minimum(own + gained * share, total - edge), 0.0, None)
            else:
                own = np.clip(total - edge, 0.0, windows[axis.window])
            hide[kind.name] = np.where(always[k] if axis.overlapped_when else on[kind.overlap], own, 0.0)
        # ZeRO-3 gathers each unit again in every forward and backward; otherwise once, before the first forward
        passes = np.where(zero3, 2 * m, 1.0)
        gather_f = overlap.pipelined(param_gather / passes, gather_calls / passes, f_s, gather_edge)
        gather_b = np.where(zero3, overlap.pipelined(param_gather / passes, gather_calls / passes, b_s, gather_edge),
                            0.0)
        hide[_GATHER.name] = np.where(on[_GATHER.overlap], np.where(zero3, m * (gather_f + gather_b), gather_f), 0.0)
        # the gradient buckets beside the last backward, after what that backward's gathers hide on the communicator
        grad_window = b_s - np.where(on[_GATHER.overlap], gather_b, 0.0)
        hide[_GRAD.name] = np.where(on[_GRAD.overlap], overlap.pipelined(grad_sync, grad_calls, grad_window, grad_edge),
                                    0.0)
        hide[_SEND.name] = np.where(on[_SEND.overlap], np.clip(p2p - 2 * one_send, 0.0, compute), 0.0)
        return overlap.share_window(hide, compute)

    def _slowest_stage(self, index: np.ndarray, depth: int) -> np.ndarray:
        """Of plans with `depth` pipeline stages, the slowest stage's forward, backward, each stage axis's
        communication, attention and kernel seconds per micro-batch, the other stages' seconds per micro-batch, and
        for each of FRAMEWORK_PARTS the slowest stage's seconds per micro-batch and the other stages' sum (rows)."""
        (t_f, t_b, host_f, host_b, sync_f, sync_b, attention, attention_all, calls,
         *experts) = self.compute.gather(index[0], depth)
        comm = [rows.gather(index[1 + k], depth)[0] for k, rows in enumerate(self.comm)]
        if self.device.measured:  # synchronous: the host's work adds to the kernels'
            fwd, bwd = t_f + host_f, t_b + host_b
            host = host_f + host_b
        else:  # asynchronous GPU: a host-bound micro-batch stretches its compute to the host's pace, less the time
            # the GPU waits on the collectives the host runs ahead during
            ahead = sum((comm[k] for k in _HOST_AHEAD), np.zeros_like(t_f))
            stretch = np.maximum(1.0, (host_f + host_b - ahead) / np.maximum(t_f + t_b, 1e-30))
            fwd, bwd = t_f * stretch + sync_f, t_b * stretch + sync_b
            host = (t_f + t_b) * (stretch - 1)
        per_mb = fwd + bwd
        for c in comm:
            per_mb = per_mb + c
        s = np.argmax(per_mb, axis=1)[:, None]

        def at_s(x: np.ndarray) -> np.ndarray:
            return np.take_along_axis(x, s, axis=1)[:, 0]

        return np.stack([at_s(fwd), at_s(bwd), *(at_s(c) for c in comm), at_s(attention), at_s(t_f + t_b),
                         row_sums(per_mb) - at_s(per_mb),
                         *(r for x in (attention_all, host, calls) for r in (at_s(x), row_sums(x) - at_s(x))),
                         *(at_s(x) for x in experts)])

    def _peak_memory(self, index: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Of plans with `depth` pipeline stages: GiB per stage, the peak GiB and the peak rank's MEMORY_PARTS GiB."""
        activity = self.activity.gather(index[2 + len(STAGE_AXES)], depth)  # (parts, plans, stages)
        parts = stage_memory_parts(self.states.gather(index[1 + len(STAGE_AXES)], depth), activity[:4], self.fragmentation)
        parts[MEMORY_PARTS.index("buffers")] += activity[4]
        total = parts.sum(axis=0)
        top = np.argmax(total, axis=1)[:, None]
        at_top = np.stack([np.take_along_axis(x, top, axis=1)[:, 0] for x in parts], axis=1) / GIB
        return total / GIB, np.take_along_axis(total, top, axis=1)[:, 0] / GIB, at_top
