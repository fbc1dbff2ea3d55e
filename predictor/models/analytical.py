"""Analytical roofline predictor: the baseline, and the fallback of the learned ScaleDL model.

Per layer: max(FLOPs / (peak · eff(GEMM shape)), bytes / (bandwidth · bw_eff)) plus a kernel
launch cost; communication from `predictor.comm`, call by call; pipeline fill and drain from the
other stages' time per micro-batch ((p-1)/(v·m) of the ideal when stages are balanced); optimizer
step memory-bound over the local optimizer state. Nothing here is fit to measurements of training
iterations; every constant is in `AnalyticalConfig` with its reason.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from predictor import comm
from predictor.hardware import Device, spec_device
from predictor.layer_graph import LayerGraph
from predictor.memory import GIB, memory_per_stage, optimizer_bytes_per_param, peak
from predictor.models.base import Predictor
from predictor.parallel import BYTES, Layout, apply_plan, shard_nodes
from predictor.plan import Plan
from predictor.prediction import MEMORY_PARTS, Prediction
from predictor.workload import WorkloadSpec


@dataclass(frozen=True)
class AnalyticalConfig:
    """Constants of the analytical model (first principles and vendor documentation, not fit).

    gemm_eff_max: fraction of dense peak a large tensor-core GEMM sustains. cuBLAS large fp16/bf16
        GEMMs on A100/H100 run at roughly 80% of the data-sheet peak under the board power limit
        (NVIDIA "Matrix Multiplication Background" user guide performance figures); a measured
        device's peak is already an achieved matmul rate, so it uses 1.0.
    gemm_half_dim: GEMM dimension at which efficiency halves, f(x) = x / (x + c): one thread-block
        tile edge (128 on Ampere/Hopper cuBLAS kernels, same guide), whose fixed prologue/epilogue
        cost is comparable to one tile's math. Measured CPUs: 32 (register/cache blocking of a
        single-thread BLAS kernel is tens of elements).
    tile: GEMM output tile edge for wave quantisation over the device's SMs (same guide).
    bw_eff: achieved fraction of HBM bandwidth by streaming kernels (BabelStream-class results on
        A100/H100 reach ~90% of the data sheet); measured devices: 1.0.
    launch_s: per-kernel launch and inter-kernel gap on a GPU, a few microseconds (CUDA launch
        latency as shown in NVIDIA's CUDA Graphs material); forward of a node ~1 kernel, backward ~2.
    score_passes: extra memory passes over the attention scores beyond the two batched GEMMs
        (softmax read+write, dropout read+write+1-byte mask) in the unfused attention of Megatron.
    host_op_s: host (CPU) cost of one eager PyTorch operator: Python, dispatcher, autograd
        bookkeeping, kernel launch; order 10 µs (PyTorch "Accelerating PyTorch with CUDA Graphs"
        blog, 2021; H. He, "Making Deep Learning Go Brrrr From First Principles", 2022). A GPU
        runs asynchronously behind the host, so a stage's micro-batch takes max(device, host);
        small layers are host-bound. On a measured CPU the host is the device: the costs add.
        Operators per node are in HOST_OPS; backward issues ~2 per forward operator.
    overlap_dp: fraction of data-parallel gradient sync hidden behind backward (0: Megatron with
        pipelining syncs after the last micro-batch); overlap_tp likewise for tensor-parallel
        all-reduces (0: they sit between dependent GEMMs).
    call_s: a collective or pipeline send/recv call's cost beyond its α-β time (the framework's
        and the communication library's own work per call). 0 from first principles; learned from
        measured iterations with host_op_s by `predictor.models.calibration`. A measured CPU's
        step costs (collective_call_s, p2p_call_s in Device.extra) take precedence.
    step_p2p: whether a pipeline send/recv is charged a measured CPU's in-step p2p cost (p2p_call_s).
        This model charges it: without it, it predicts the CPU dataset's in-domain training rows of
        pipeline plans 41 % off instead of 30 %. ScaleDL's composition does not (see ScaleDLPredictor).
    """

    gemm_eff_max: float = 0.80
    gemm_half_dim: float = 128.0
    tile: int = 128
    bw_eff: float = 0.90
    launch_s: float = 3e-6
    score_passes: float = 4.5
    host_op_s: float = 10e-6
    overlap_dp: float = 0.0
    overlap_tp: float = 0.0
    call_s: float = 0.0
    step_p2p: bool = True

    def for_device(self, device: Device) -> "AnalyticalConfig":
        if not device.measured:
            return self
        return replace(self, gemm_eff_max=1.0, gemm_half_dim=32.0, tile=0, bw_eff=1.0, launch_s=0.0)


def call_costs(cfg: AnalyticalConfig, device: Device) -> tuple[float, float]:
    """(collective, send/recv) cost per call beyond α-β: a measured device's in-step costs where its
    profile has them (`scaledl profile`), else the configured (first-principles or fitted) `call_s`."""
    p2p = device.extra.get("p2p_call_s", cfg.call_s) if cfg.step_p2p else cfg.call_s
    return device.extra.get("collective_call_s", cfg.call_s), p2p


# Eager operators one forward of a node issues (Megatron-style modules): a linear is matmul + bias
# add; unfused attention is split/view/transposes, baddbmm, scale-mask-softmax, dropout (with its
# RNG-state fork), bmm, permute + contiguous; a cross-entropy over the vocabulary ~6 reductions
# and elementwise ops. Kinds not listed issue one.
HOST_OPS: dict[str, int] = {"linear": 2, "attention": 12, "embedding": 3, "rmsnorm": 4, "dropout": 2, "loss": 6,
                            "conv": 2}


# PyTorch DDP's gradient bucket (bucket_cap_mb=25): one all-reduce per bucket. Megatron's buckets are of the
# same order (tens of MB); on fast links the count hardly matters, on a CPU's gloo each call costs ~1 ms.
DDP_BUCKET_BYTES = 25 * 2**20


def gemm_efficiency(m, n, k, batch, cfg: AnalyticalConfig, sms: int = 0):
    """Achievable fraction of peak for a (batched) GEMM of shape m×k · k×n: saturating in each dim, wave-quantised."""
    m, n, k = (np.maximum(np.asarray(x, dtype=float), 1.0) for x in (m, n, k))
    c = cfg.gemm_half_dim
    eff = cfg.gemm_eff_max * (m / (m + c)) * (n / (n + c)) * (k / (k + c))
    if sms and cfg.tile:
        tiles = np.ceil(m / cfg.tile) * np.ceil(n / cfg.tile) * np.maximum(np.asarray(batch, dtype=float), 1.0)
        eff = eff * tiles / (np.ceil(tiles / sms) * sms)
    return eff


_TIME_CACHE: dict[tuple, tuple[weakref.ref, tuple[np.ndarray, np.ndarray]]] = {}


def layer_times(spec: WorkloadSpec, graph: LayerGraph, tp: int, sp: bool, mbs: int, device: Device,
                cfg: AnalyticalConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of one occurrence of each graph node on one tp rank at micro-batch `mbs`.

    The learned predictor falls back to this for layers it has no timings for.
    """
    cfg = (cfg or AnalyticalConfig()).for_device(device)
    prec = spec.training.precision
    key = (id(graph), tp, sp, mbs, device.name, device.flops(prec), device.mem_bandwidth, prec, cfg)
    hit = _TIME_CACHE.get(key)
    if hit is not None and hit[0]() is graph:
        return hit[1]
    value = _layer_times(spec, graph, tp, sp, mbs, device, cfg)
    _TIME_CACHE[key] = (weakref.ref(graph, lambda _r, k=key: _TIME_CACHE.pop(k, None)), value)
    return value


def _layer_times(spec, graph, tp, sp, mbs, device, cfg):
    nodes = shard_nodes(graph, tp, sp, spec.model.heads)
    prec = spec.training.precision
    eb = BYTES[prec]
    peak = device.flops(prec)
    vector_peak = device.flops("fp32")
    bw = device.mem_bandwidth * cfg.bw_eff
    sms = int(device.extra.get("sms", 0))
    is_gemm = nodes.gemm_m > 0
    m = nodes.gemm_m * np.where(nodes.attention, 1, mbs)
    batch = nodes.gemm_batch * np.where(nodes.attention, mbs, 1)
    eff = gemm_efficiency(m, nodes.gemm_n, nodes.gemm_k, batch, cfg, sms)
    fwd_f = nodes.fwd_flops * mbs
    bwd_f = nodes.bwd_flops * mbs
    gemm_bytes = (m * nodes.gemm_k + nodes.gemm_k * nodes.gemm_n + m * nodes.gemm_n) * batch * eb
    io_bytes = np.where(is_gemm, gemm_bytes, nodes.io_elems * mbs * eb + nodes.params * eb)
    compute_rate = np.where(is_gemm, peak * eff, vector_peak)
    fwd = np.maximum(fwd_f / compute_rate, io_bytes / bw)
    bwd = np.maximum(bwd_f / compute_rate, 2 * io_bytes / bw)
    # Unfused attention: the s² scores make extra passes through memory (the GEMM I/O is counted above).
    scores = np.where(nodes.attention, nodes.gemm_m * nodes.gemm_n * batch * eb, 0.0)
    fwd = fwd + cfg.score_passes * scores / bw + cfg.launch_s
    bwd = bwd + 2 * cfg.score_passes * scores / bw + 2 * cfg.launch_s
    return fwd, bwd


def _tp_time(layout: Layout, calls: np.ndarray, elems: np.ndarray, call_s: float) -> np.ndarray:
    """Seconds for `calls` tp all-reduces (reduce-scatter + all-gather pairs with sp) moving `elems`
    elements in total, per stage; each collective also costs `call_s` (a measured device's in-step cost)."""
    if layout.plan.tp == 1:
        return np.zeros_like(calls)
    size = np.where(calls > 0, elems / np.maximum(calls, 1), 0.0) * layout.act_bytes
    g = layout.tp_group
    if layout.plan.sp:
        return calls * (comm.reduce_scatter(size, g) + comm.allgather(size, g) + 2 * call_s)
    return calls * (comm.allreduce(size, g) + call_s)


def _memory_gib(spec: WorkloadSpec, lay: Layout) -> tuple[float, list[float], dict[str, float]]:
    """Peak GiB of the plan's fullest rank, GiB per pipeline stage, and the fullest rank's parts."""
    parts = memory_per_stage(spec, lay)
    total, top = peak(parts)
    return float(total[top]) / GIB, [float(x) / GIB for x in total], {k: float(parts[k][top]) / GIB for k in MEMORY_PARTS}


class AnalyticalPredictor(Predictor):
    """Roofline + α-β + schedule model; no learned state."""

    name = "analytical"

    def __init__(self, config: AnalyticalConfig | None = None, device: Device | None = None) -> None:
        self.config = config or AnalyticalConfig()
        self.device = device  # None: spec_device(spec)

    def predict(self, spec: WorkloadSpec, graph: LayerGraph, plans: Sequence[Plan]) -> list[Prediction]:
        device = self.device or spec_device(spec)
        model_flops = (graph.fwd_flops + graph.bwd_flops) * spec.training.global_batch
        # Plans of a batch share stages, gradient syncs and memory (they differ in placement, ZeRO, schedule...):
        # each piece is computed once per batch for the plan fields it depends on.
        batch_cache: dict[tuple, Any] = {}
        return [self._one(spec, graph, plan, device, model_flops, batch_cache) for plan in plans]

    def _stage_times(self, spec: WorkloadSpec, graph: LayerGraph, lay: Layout, device: Device,
                     cfg: AnalyticalConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per pipeline rank, one micro-batch: forward, backward (with recomputation) and tp-collective seconds,
        and the kernels' own forward + backward seconds (before a host-bound GPU stretches them)."""
        plan, nodes, counts = lay.plan, lay.nodes, lay.stage_counts
        fwd, bwd = layer_times(spec, graph, plan.tp, plan.sp, plan.mbs, device, self.config)
        t_f = counts @ fwd
        t_b = counts @ bwd
        rep = nodes.repeated
        if plan.recompute == "full":
            t_b = t_b + counts[:, rep] @ fwd[rep]
        elif plan.recompute == "selective":
            t_b = t_b + counts[:, nodes.attention] @ fwd[nodes.attention]
        t_tp = self._tp_stage_time(lay, cfg, device) if plan.tp > 1 else np.zeros_like(t_f)
        ops = np.array([HOST_OPS.get(k, 1) for k in nodes.kind], dtype=float) * cfg.host_op_s
        host_f = counts @ ops
        host_b = 2 * host_f
        if plan.recompute == "full":
            host_b = host_b + counts[:, rep] @ ops[rep]
        elif plan.recompute == "selective":
            host_b = host_b + counts[:, nodes.attention] @ ops[nodes.attention]
        if device.measured:  # synchronous: the host's work adds to the kernels'
            return t_f + host_f, t_b + host_b, t_tp, t_f + t_b
        # asynchronous GPU: a host-bound micro-batch stretches its compute to the host's pace
        stretch = np.maximum(1.0, (host_f + host_b - t_tp) / np.maximum(t_f + t_b, 1e-30))
        return t_f * stretch, t_b * stretch, t_tp, t_f + t_b

    @staticmethod
    def _tp_stage_time(lay: Layout, cfg: AnalyticalConfig, device: Device) -> np.ndarray:
        """Tensor-parallel seconds per pipeline rank for one micro-batch: the collectives, and on a
        measured device the runtime's own cost per sharded linear (`tp_linear_s`, DTensor on CPU)."""
        plan, nodes, counts = lay.plan, lay.nodes, lay.stage_counts
        framework = counts @ nodes.tp_linear * device.extra.get("tp_linear_s", 0.0)
        call_s = call_costs(cfg, device)[0]
        rep = nodes.repeated
        fwd_calls = counts @ nodes.tp_fwd_ar
        bwd_calls = counts @ nodes.tp_bwd_ar
        fwd_elems = counts @ (nodes.tp_fwd_ar * nodes.tp_payload) * plan.mbs
        bwd_elems = counts @ (nodes.tp_bwd_ar * nodes.tp_payload) * plan.mbs
        if plan.recompute == "full":  # the recomputed forward repeats the blocks' forward all-reduces
            fwd_calls = fwd_calls + counts[:, rep] @ nodes.tp_fwd_ar[rep]
            fwd_elems = fwd_elems + counts[:, rep] @ (nodes.tp_fwd_ar * nodes.tp_payload)[rep] * plan.mbs
        collectives = _tp_time(lay, fwd_calls, fwd_elems, call_s) + _tp_time(lay, bwd_calls, bwd_elems, call_s)
        return collectives * (1 - cfg.overlap_tp) + framework

    def _one(self, spec: WorkloadSpec, graph: LayerGraph, plan: Plan, device: Device, model_flops: float,
             batch_cache: dict[tuple, Any]) -> Prediction:
        cfg = self.config.for_device(device)
        lay = apply_plan(spec, graph, plan, device)
        m = lay.microbatches

        def cached(key: tuple, compute: Callable[[], Any]) -> Any:
            if key not in batch_cache:
                batch_cache[key] = compute()
            return batch_cache[key]

        sharding = (plan.pp, plan.v, plan.tp, plan.sp)  # what a rank's layers and parameters depend on
        t_f, t_b, t_tp, kernels = cached(("stage", *sharding, plan.mbs, plan.recompute, lay.tp_group),
                                         lambda: self._stage_times(spec, graph, lay, device, cfg))
        collective_s, p2p_s = call_costs(cfg, device)
        per_mb = t_f + t_b + t_tp
        s = int(np.argmax(per_mb))
        p, v = plan.pp, plan.v
        compute = m * (t_f[s] + t_b[s])
        tp_comm = m * t_tp[s]
        # Fill and drain: the other stages' micro-batch time before the slowest stage starts and after it ends,
        # (Σ t − max t)/v; (p-1)/v of the slowest stage's time when the stages are balanced (Narayanan et al. 2021).
        bubble = (per_mb.sum() - per_mb[s]) / v
        if p > 1:
            link = device.inter_node if lay.pp_link_inter else device.op_links.get("send_recv", device.intra_node)
            one = comm.p2p(lay.p2p_elems * lay.act_bytes, link) + p2p_s
            pp_p2p = float(2 * (m * v + p - 1) * one)
        else:
            pp_p2p = 0.0
        psi = cached(("psi", *sharding), lambda: lay.stage_counts @ lay.nodes.params)
        dp_comm = cached(("dp", *sharding, plan.dp, plan.zero, m, lay.dp_group),
                         lambda: float(np.max(self._dp_time(lay, psi, m, collective_s))) * (1 - cfg.overlap_dp))
        opt_bytes = 2 * optimizer_bytes_per_param(spec.training.optimizer, spec.training.precision) + lay.grad_bytes + lay.param_bytes
        shard = plan.dp if plan.zero >= 1 else 1
        optimizer = float(psi.max()) / shard * opt_bytes / (device.mem_bandwidth * cfg.bw_eff)
        breakdown = {"compute": float(compute), "tp_comm": float(tp_comm), "dp_comm": dp_comm,
                     "pp_bubble": float(bubble), "pp_p2p": pp_p2p, "optimizer": optimizer}
        iter_time = sum(breakdown.values())
        peak, per_stage, memory_parts = cached(("memory", *sharding, plan.dp, plan.zero, plan.mbs, plan.recompute,
                                                plan.schedule, m), lambda: _memory_gib(spec, lay))
        tflops = model_flops / iter_time / plan.gpus / 1e12
        return Prediction(
            iter_time_s=iter_time, breakdown=breakdown,
            peak_memory_gib=peak, memory_per_stage_gib=list(per_stage), memory_breakdown=dict(memory_parts),
            tflops_per_gpu=tflops, mfu=tflops * 1e12 / device.flops(spec.training.precision),
            extra={"kernel_compute_s": float(m * kernels[s])},  # compute without the host: < compute when host-bound
        )

    @staticmethod
    def _dp_time(lay: Layout, psi: np.ndarray, microbatches: int, call_s: float) -> np.ndarray:
        """Gradient sync per stage, call by call: each call pays the link latency, and on a measured
        device `call_s` (its in-step cost).

        ZeRO-0/1: DDP buckets (DDP_BUCKET_BYTES) all-reduced, or reduce-scattered and the updated
        weights all-gathered. ZeRO-2/3: one FSDP unit per block plus one for the rest of the stage, each
        reduce-scattering its gradients; ZeRO-2 gathers its weights once per step, ZeRO-3 again in every
        micro-batch's forward and backward.
        """
        plan, g = lay.plan, lay.dp_group
        if plan.dp == 1:
            return np.zeros_like(psi)
        grads, weights = psi * lay.grad_bytes, psi * lay.param_bytes
        if plan.zero <= 1:
            calls = np.maximum(1.0, np.ceil(grads / DDP_BUCKET_BYTES))
            if plan.zero == 0:
                return calls * (comm.allreduce(grads / calls, g) + call_s)
            return calls * (comm.reduce_scatter(grads / calls, g) + comm.allgather(weights / calls, g) + 2 * call_s)
        units = np.ceil(lay.blocks_per_stage) + 1
        gathers = 2 * microbatches if plan.zero >= 3 else 1
        return units * (comm.reduce_scatter(grads / units, g) + gathers * comm.allgather(weights / units, g)
                        + (1 + gathers) * call_s)
