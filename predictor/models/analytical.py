"""Analytical roofline predictor: the baseline, and the fallback of the learned ScaleDL model.

Per layer: max(FLOPs / (peak · eff(GEMM shape)), bytes / (bandwidth · bw_eff)) plus a kernel
launch cost; communication from `predictor.comm`, call by call; pipeline fill and drain from the
other stages' time per micro-batch ((p-1)/(v·m) of the ideal when stages are balanced); optimizer
step memory-bound over the local optimizer state. Nothing here is fit to measurements of training
iterations; every constant is in `AnalyticalConfig` with its reason.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from predictor import comm
from predictor.axes import DECODER_FAMILIES
from predictor.frameworks import FRAMEWORKS, MEASURED_DEFAULT, Framework, framework_of
from predictor.device_resolver import spec_device
from predictor.hardware import Device
from predictor.layer_graph import LayerGraph
from predictor.memory import GIB, memory_per_stage, optimizer_bytes_per_param, peak, stage_params
from predictor.moe import active_params, alltoall
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
    overlap_eff: fraction of the computation a framework's overlapped communication can hide behind
        (gradient reduce-scatter behind the last micro-batch's backward, parameter all-gather behind a
        forward, tensor-parallel collectives behind their GEMMs, pipeline send/recv and context-parallel
        K/V exchange behind the next computation). 1.0 from first principles (a stream runs beside
        the kernels until they end); calibrated by `bench/modern_eval.py` (leave-one-system-out).
    overlap_slowdown: seconds of computation lost per second of communication hidden beside it: NCCL
        kernels take SMs and memory bandwidth from the GEMMs they run beside (Megatron-LM's
        `--tp-comm-overlap` and FSDP docs give 1-3 SMs per channel of 132). 0 from first principles;
        calibrated with overlap_eff.
    fp8_gemm_eff: fraction of the dense FP8/FP4 peak an FP8/FP4 GEMM reaches relative to a bf16 GEMM
        of the same shape reaching gemm_eff_max (Transformer Engine's casts, scaling and amax
        reductions ride on every linear). 1.0 from first principles; calibrated as overlap_eff.
    grouped_gemm_eff: fraction of a dense GEMM's efficiency (at the same per-expert shape) a routed expert's
        grouped GEMM reaches, with its token permutation and unpermutation (Megatron-Core's grouped GEMM and
        permute fusion, TE). 1.0 from first principles; calibrated on the MoE rows (bench/modern_eval.py).
    a2a_eff: share of the link bandwidth the MoE token dispatch and combine all-to-alls reach (many messages
        of tokens·top_k·hidden/ep bytes each, NCCL's all-to-all through its p2p path). 1.0 from first
        principles; calibrated with grouped_gemm_eff.
    expert_host_s: seconds per local expert, MoE layer and forward pass (twice per backward) that the GPU waits
        for the host: Megatron-Core's alltoall token dispatcher copies the tokens-per-expert counts to the host
        to size its all-to-all (a device-to-host synchronisation per MoE layer), after which the host launches
        the layer's per-expert work (the grouped GEMM's per-expert splits and, in FP8, each expert's
        quantisation: a few eager operators at `host_op_s` each per local expert) before the GPU can go on.
        0 from first principles (no synchronisation); calibrated with grouped_gemm_eff.
    moe_imbalance: the tokens the busiest expert rank receives over the balanced share, which every rank of
        the ep group waits for; it stretches the experts' time and sizes the dispatch buffers. 1.0: balanced
        routing, as the published runs force it (Megatron-Bridge recipes); real routing with an auxiliary
        loss lies above 1.
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
    overlap_eff: float = 1.0
    overlap_slowdown: float = 0.0
    fp8_gemm_eff: float = 1.0
    grouped_gemm_eff: float = 1.0
    a2a_eff: float = 1.0
    expert_host_s: float = 0.0
    moe_imbalance: float = 1.0
    call_s: float = 0.0
    step_p2p: bool = True

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> "AnalyticalConfig":
        """A config a checkpoint saved: its retired fields (overlap_dp, overlap_tp: fractions of collectives
        hidden, always saved as 0, so nothing hidden) are dropped; any other value is refused."""
        saved = dict(saved)
        for retired in ("overlap_dp", "overlap_tp"):
            if saved.pop(retired, 0.0) != 0.0:
                raise ValueError(f"checkpoint's analytical config sets the retired {retired}; retrain it")
        return cls(**saved)

    def for_device(self, device: Device) -> "AnalyticalConfig":
        if not device.measured:
            return self
        return replace(self, gemm_eff_max=1.0, gemm_half_dim=32.0, tile=0, bw_eff=1.0, launch_s=0.0)


# Constants calibrated per framework on public measurements of it (bench/modern_eval.py --record: chosen on the
# whole file, its leave-one-system-out figure recorded beside them); a framework absent here keeps first principles.
FRAMEWORK_CONSTANTS = Path(__file__).resolve().parent.parent / "checkpoints" / "framework-constants.json"
CALIBRATED_FIELDS: tuple[str, ...] = ("fp8_gemm_eff", "overlap_eff", "overlap_slowdown", "gemm_eff_max")
# Calibrated after them, on the MoE rows only, with the dense constants fixed: they act on MoE layers alone.
MOE_CALIBRATED_FIELDS: tuple[str, ...] = ("grouped_gemm_eff", "a2a_eff", "expert_host_s")


@cache
def framework_config(framework: str) -> AnalyticalConfig:
    """The analytical constants of `framework`: its recorded calibration over the first-principles defaults."""
    if not FRAMEWORK_CONSTANTS.is_file():
        return AnalyticalConfig()
    recorded = json.loads(FRAMEWORK_CONSTANTS.read_text()).get(framework, {}).get("constants", {})
    known = {f.name for f in fields(AnalyticalConfig)}
    return replace(AnalyticalConfig(), **{k: v for k, v in recorded.items() if k in known})


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
# Precisions whose GEMMs run on low-precision tensor cores while the rest of the step stays in bf16.
LOW_PRECISIONS: tuple[str, ...] = ("fp8", "fp4")
# A fused causal attention kernel (FlashAttention, cuDNN via Transformer Engine) skips the tiles above the
# diagonal: half the s² work of the unmasked product (Dao 2023, FlashAttention-2 §3.1).
CAUSAL_FUSED_WORK = 0.5


def layer_times(spec: WorkloadSpec, graph: LayerGraph, tp: int, sp: bool, mbs: int, device: Device,
                cfg: AnalyticalConfig | None = None, cp: int = 1, ep: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of one occurrence of each graph node on one tp·cp rank at micro-batch `mbs`.

    The learned predictor falls back to this for layers it has no timings for.
    """
    cfg = (cfg or AnalyticalConfig()).for_device(device)
    prec = spec.training.precision
    fused = fused_attention(spec, device)
    key = (id(graph), tp, sp, mbs, cp, ep, device.name, device.flops(prec), device.mem_bandwidth, prec, cfg, fused)
    hit = _TIME_CACHE.get(key)
    if hit is not None and hit[0]() is graph:
        return hit[1]
    value = _layer_times(spec, graph, tp, sp, mbs, device, cfg, cp, fused, ep)
    _TIME_CACHE[key] = (weakref.ref(graph, lambda _r, k=key: _TIME_CACHE.pop(k, None)), value)
    return value


def fused_attention(spec: WorkloadSpec, device: Device) -> bool:
    """Whether the spec's framework runs attention as one fused kernel (no s² scores through memory)."""
    return framework_of(spec).fused_attention and not device.measured


def _layer_times(spec, graph, tp, sp, mbs, device, cfg, cp, fused, ep):
    nodes = shard_nodes(graph, tp, sp, spec.model.heads, cp, ep)
    prec = spec.training.precision
    eb = BYTES[prec]
    low = prec in LOW_PRECISIONS
    # FP8/FP4 recipes cast the linears' GEMMs only; attention and everything else stay in bf16.
    linear_peak = device.flops(prec) * (cfg.fp8_gemm_eff if low else 1.0)
    peak = np.where(nodes.attention, device.flops("bf16") if low else linear_peak, linear_peak)
    vector_peak = device.flops("fp32")
    bw = device.mem_bandwidth * cfg.bw_eff
    sms = int(device.extra.get("sms", 0))
    is_gemm = nodes.gemm_m > 0
    m = nodes.gemm_m * np.where(nodes.attention, 1, mbs)
    batch = nodes.gemm_batch * np.where(nodes.attention, mbs, 1)
    eff = gemm_efficiency(m, nodes.gemm_n, nodes.gemm_k, batch, cfg, sms) * np.where(nodes.experts, cfg.grouped_gemm_eff, 1.0)
    work = np.where(nodes.attention & fused & (spec.model.family in DECODER_FAMILIES), CAUSAL_FUSED_WORK, 1.0)
    fwd_f = nodes.fwd_flops * mbs * work
    bwd_f = nodes.bwd_flops * mbs * work
    gemm_bytes = (m * nodes.gemm_k + nodes.gemm_k * nodes.gemm_n + m * nodes.gemm_n) * batch * eb
    if fused:  # the s×s product never reaches memory: Q, K, V in and O out
        gemm_bytes = np.where(nodes.attention, 4 * m * nodes.gemm_k * batch * eb, gemm_bytes)
    io_bytes = np.where(is_gemm, gemm_bytes, nodes.io_elems * mbs * eb + nodes.params * eb)
    compute_rate = np.where(is_gemm, peak * eff, vector_peak)
    fwd = np.maximum(fwd_f / compute_rate, io_bytes / bw)
    bwd = np.maximum(bwd_f / compute_rate, 2 * io_bytes / bw)
    # Unfused attention: the s² scores make extra passes through memory (the GEMM I/O is counted above).
    passes = 0.0 if fused else cfg.score_passes
    scores = np.where(nodes.attention, nodes.gemm_m * nodes.gemm_n * batch * eb, 0.0)
    # The ep group waits for its busiest rank: its experts run moe_imbalance times the balanced share.
    busiest = np.where(nodes.experts, cfg.moe_imbalance, 1.0)
    fwd, bwd = fwd * busiest, bwd * busiest
    fwd = fwd + passes * scores / bw + cfg.launch_s
    bwd = bwd + 2 * passes * scores / bw + 2 * cfg.launch_s
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


def _memory_gib(spec: WorkloadSpec, lay: Layout, fused: bool,
                imbalance: float = 1.0) -> tuple[float, list[float], dict[str, float]]:
    """Peak GiB of the plan's fullest rank, GiB per pipeline stage, and the fullest rank's parts."""
    parts = memory_per_stage(spec, lay, fused, imbalance)
    total, top = peak(parts)
    return float(total[top]) / GIB, [float(x) / GIB for x in total], {k: float(parts[k][top]) / GIB for k in MEMORY_PARTS}


@dataclass(frozen=True)
class StageTimes:
    """Seconds per pipeline rank for one micro-batch (arrays of length pp)."""

    fwd: np.ndarray  # forward, host-stretched where the GPU waits for the host
    bwd: np.ndarray  # backward with recomputation
    tp: np.ndarray  # tensor-parallel collectives
    cp: np.ndarray  # context-parallel K/V exchange
    kernels: np.ndarray  # the kernels' own forward + backward (before a host-bound GPU stretches them)
    attention: np.ndarray  # the attention cores' forward + backward: what a cp ring hides behind
    ep: np.ndarray  # expert-parallel token dispatch and combine all-to-alls


def _hidden(comm: float, window: float, on: bool, cfg: AnalyticalConfig) -> float:
    """Seconds of `comm` hidden behind `window` seconds of computation when its overlap is `on`."""
    return min(comm, cfg.overlap_eff * window) if on else 0.0


class AnalyticalPredictor(Predictor):
    """Roofline + α-β + schedule model; no learned state.

    Communication a framework overlaps (`predictor.frameworks`) is charged only where it is exposed:
    gradient reduction behind the backward of the last micro-batch, parameter all-gathers behind a
    forward (every micro-batch's under ZeRO-3), tensor-parallel collectives and pipeline send/recv
    behind the stage's computation, the context-parallel ring behind attention; each hidden second
    slows the computation beside it by `overlap_slowdown`. `Prediction.hidden_comm` keeps what was hidden.
    """

    name = "analytical"

    def __init__(self, config: AnalyticalConfig | None = None, device: Device | None = None) -> None:
        self.given = config  # None: each framework's calibrated constants (framework_config)
        self.device = device  # None: spec_device(spec)

    @property
    def config(self) -> AnalyticalConfig:
        """The constants given, else the first-principles ones (frameworks may refine them: `framework_config`)."""
        return self.given or AnalyticalConfig()

    def predict(self, spec: WorkloadSpec, graph: LayerGraph, plans: Sequence[Plan]) -> list[Prediction]:
        device = self.device or spec_device(spec)
        model_flops = (graph.fwd_flops + graph.bwd_flops) * spec.training.global_batch
        # A mixture of experts' parameters: all of them, and those one token passes (its top_k experts' only).
        sizes = {"params": graph.params, "active_params": active_params(graph.params, spec.model)} if spec.model.is_moe else {}
        # A measured device runs ScaleDL's own runner, whatever the spec names.
        framework = FRAMEWORKS[MEASURED_DEFAULT] if device.measured else framework_of(spec)
        config = self.given or framework_config(framework.name)
        # Plans of a batch share stages, gradient syncs and memory (they differ in placement, ZeRO, schedule...):
        # each piece is computed once per batch for the plan fields it depends on.
        batch_cache: dict[tuple, Any] = {}
        predictions = [self._one(spec, graph, plan, device, model_flops, framework, config, batch_cache) for plan in plans]
        for p in predictions:
            p.extra.update(sizes)
        return predictions

    def _stage_times(self, spec: WorkloadSpec, graph: LayerGraph, lay: Layout, device: Device,
                     config: AnalyticalConfig) -> StageTimes:
        """Per pipeline rank, one micro-batch: computation (with recomputation), tp and cp communication."""
        plan, nodes, counts = lay.plan, lay.nodes, lay.stage_counts
        fwd, bwd = layer_times(spec, graph, plan.tp, plan.sp, plan.mbs, device, config, plan.cp, plan.ep)
        cfg = config.for_device(device)
        t_f = counts @ fwd
        t_b = counts @ bwd
        rep = nodes.repeated
        if plan.recompute == "full":
            t_b = t_b + counts[:, rep] @ fwd[rep]
        elif plan.recompute == "selective":
            t_b = t_b + counts[:, nodes.attention] @ fwd[nodes.attention]
        t_tp = self._tp_stage_time(lay, cfg, device) if plan.tp > 1 else np.zeros_like(t_f)
        t_cp = self._cp_stage_time(spec, lay, device) if plan.cp > 1 else np.zeros_like(t_f)
        t_ep = self._ep_stage_time(lay, cfg) if plan.ep > 1 else np.zeros_like(t_f)
        attention = counts[:, nodes.attention] @ (fwd + bwd)[nodes.attention]
        ops = np.array([HOST_OPS.get(k, 1) for k in nodes.kind], dtype=float) * cfg.host_op_s
        host_f = counts @ ops
        host_b = 2 * host_f
        if plan.recompute == "full":
            host_b = host_b + counts[:, rep] @ ops[rep]
        elif plan.recompute == "selective":
            host_b = host_b + counts[:, nodes.attention] @ ops[nodes.attention]
        if device.measured:  # synchronous: the host's work adds to the kernels'
            return StageTimes(t_f + host_f, t_b + host_b, t_tp, t_cp, t_f + t_b, attention, t_ep)
        # asynchronous GPU: a host-bound micro-batch stretches its compute to the host's pace
        stretch = np.maximum(1.0, (host_f + host_b - t_tp) / np.maximum(t_f + t_b, 1e-30))
        # each MoE layer's dispatcher waits for the host once per pass (forward, backward, a recomputed forward),
        # which then launches its local experts' kernels: expert_host_s per local expert (gemm_batch = E/ep)
        sync_f = counts @ (nodes.experts * nodes.gemm_batch) * cfg.expert_host_s
        sync_b = sync_f * (3 if plan.recompute == "full" else 2)
        return StageTimes(t_f * stretch + sync_f, t_b * stretch + sync_b, t_tp, t_cp, t_f + t_b, attention, t_ep)

    @staticmethod
    def _cp_stage_time(spec: WorkloadSpec, lay: Layout, device: Device) -> np.ndarray:
        """Context-parallel seconds per pipeline rank for one micro-batch: each attention layer exchanges
        the K and V of its sequence chunk with the other cp-1 ranks in forward, and K, V and their
        gradients in backward (Megatron-Core's p2p ring, torchtitan's ring; `cp_comm=allgather`: one
        all-gather of K, V in forward and a reduce-scatter of their gradients in backward)."""
        plan, nodes, counts = lay.plan, lay.nodes, lay.stage_counts
        kv_heads = spec.model.kv_heads or spec.model.heads or 1
        head_dim = (spec.model.hidden or 0) / (spec.model.heads or 1)
        chunk = 2 * lay.tokens / plan.cp * plan.mbs * kv_heads / plan.tp * head_dim * lay.act_bytes  # K and V
        layers = counts @ nodes.attention.astype(float)
        g = lay.cp_group
        if plan.cp_comm == "allgather":
            one = comm.allgather(chunk * plan.cp, g) + comm.reduce_scatter(2 * chunk * plan.cp, g)
        else:
            link = g.inter if g.n_inter > 1 else g.intra_for("send_recv")
            one = 3 * (plan.cp - 1) * comm.p2p(chunk, link)  # forward K, V; backward K, V, dK, dV
        return layers * one

    @staticmethod
    def _ep_stage_time(lay: Layout, cfg: AnalyticalConfig) -> np.ndarray:
        """Expert-parallel seconds per pipeline rank for one micro-batch: each MoE layer dispatches its
        tokens·top_k·hidden elements to the experts' ranks and combines the results back, in forward and again
        (their gradients) in backward: 4 all-to-alls over the ep group, 6 with full recomputation
        (Megatron-Core's alltoall token dispatcher; `predictor.moe.alltoall`)."""
        plan, nodes, counts = lay.plan, lay.nodes, lay.stage_counts
        calls = 6 if plan.recompute == "full" else 4
        size = nodes.dispatch * plan.mbs * lay.act_bytes * cfg.moe_imbalance
        one = np.array([alltoall(x, lay.ep_group, cfg.a2a_eff) for x in size])
        return calls * (counts @ one)

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
        return collectives + framework

    def _one(self, spec: WorkloadSpec, graph: LayerGraph, plan: Plan, device: Device, model_flops: float,
             framework: Framework, config: AnalyticalConfig, batch_cache: dict[tuple, Any]) -> Prediction:
        cfg = config.for_device(device)
        lay = apply_plan(spec, graph, plan, device)
        m = lay.microbatches

        def cached(key: tuple, compute: Callable[[], Any]) -> Any:
            if key not in batch_cache:
                batch_cache[key] = compute()
            return batch_cache[key]

        sharding = (plan.pp, plan.v, plan.tp, plan.sp, plan.cp, plan.ep)  # what a rank's layers and parameters depend on
        st = cached(("stage", *sharding, plan.mbs, plan.recompute, plan.cp_comm, lay.tp_group, lay.cp_group),
                    lambda: self._stage_times(spec, graph, lay, device, config))
        overlapped = framework.overlap(plan)
        collective_s, p2p_s = call_costs(cfg, device)
        per_mb = st.fwd + st.bwd + st.tp + st.cp + st.ep
        s = int(np.argmax(per_mb))
        p, v = plan.pp, plan.v
        compute = m * (st.fwd[s] + st.bwd[s])
        tp_comm = m * st.tp[s]
        cp_comm = m * st.cp[s]
        ep_comm = m * st.ep[s]
        # Fill and drain: the other stages' micro-batch time before the slowest stage starts and after it ends,
        # (Σ t − max t)/v; (p-1)/v of the slowest stage's time when the stages are balanced (Narayanan et al. 2021).
        bubble = (per_mb.sum() - per_mb[s]) / v
        if p > 1:
            link = device.inter_node if lay.pp_link_inter else device.op_links.get("send_recv", device.intra_node)
            one = comm.p2p(lay.p2p_elems * lay.act_bytes, link) + p2p_s
            pp_p2p = float(2 * (m * v + p - 1) * one)
        else:
            pp_p2p = 0.0
        psi, psi_exp = cached(("psi", *sharding), lambda: stage_params(lay))
        grad_sync, param_gather = cached(
            ("dp", *sharding, plan.dp, plan.zero, m, lay.dp_group, lay.edp_group),
            lambda: np.add(self._dp_time(lay, psi - psi_exp, m, collective_s, lay.dp_group),
                           self._dp_time(lay, psi_exp, m, collective_s, lay.edp_group)))
        hidden = {
            "tp_comm": _hidden(tp_comm, compute, "tp" in overlapped, cfg),
            "cp_comm": _hidden(cp_comm, m * st.attention[s], plan.cp_comm == "ring", cfg),
            "ep_comm": _hidden(ep_comm, compute, "ep" in overlapped, cfg),
            "dp_grad": _hidden(grad_sync, st.bwd[s], "dp" in overlapped, cfg),
            "dp_param": _hidden(param_gather, compute if plan.zero >= 3 else st.fwd[s], "param" in overlapped, cfg),
            "pp_p2p": _hidden(pp_p2p, compute, "pp" in overlapped, cfg),
        }
        opt_bytes = 2 * optimizer_bytes_per_param(spec.training.optimizer, spec.training.precision) + lay.grad_bytes + lay.param_bytes
        shard, expert_shard = (plan.dp * plan.cp, lay.edp_group.size) if plan.zero >= 1 else (1, 1)
        local = (psi - psi_exp) / shard + psi_exp / expert_shard
        optimizer = float(local.max()) * opt_bytes / (device.mem_bandwidth * cfg.bw_eff)
        breakdown = {"compute": float(compute + cfg.overlap_slowdown * sum(hidden.values())),
                     "tp_comm": float(tp_comm - hidden["tp_comm"]), "cp_comm": float(cp_comm - hidden["cp_comm"]),
                     "ep_comm": float(ep_comm - hidden["ep_comm"]),
                     "dp_comm": float(grad_sync + param_gather - hidden["dp_grad"] - hidden["dp_param"]),
                     "pp_bubble": float(bubble), "pp_p2p": pp_p2p - hidden["pp_p2p"], "optimizer": optimizer}
        iter_time = sum(breakdown.values())
        peak, per_stage, memory_parts = cached(("memory", *sharding, plan.dp, plan.zero, plan.mbs, plan.recompute,
                                                plan.schedule, m), lambda: _memory_gib(spec, lay, fused_attention(spec, device),
                                                                      cfg.moe_imbalance))
        tflops = model_flops / iter_time / plan.gpus / 1e12
        return Prediction(
            iter_time_s=iter_time, breakdown=breakdown,
            peak_memory_gib=peak, memory_per_stage_gib=list(per_stage), memory_breakdown=dict(memory_parts),
            tflops_per_gpu=tflops, mfu=tflops * 1e12 / device.flops(spec.training.precision),
            hidden_comm={k: float(x) for k, x in hidden.items() if x > 0},
            extra={"kernel_compute_s": float(m * st.kernels[s])},  # compute without the host: < compute when host-bound
        )

    @staticmethod
    def _dp_time(lay: Layout, psi: np.ndarray, microbatches: int, call_s: float, g: comm.Group) -> tuple[float, float]:
        """(gradient sync, parameter all-gather) seconds of the stage whose sync is slowest, call by call over
        the group `g` (dp·cp ranks; the expert-data-parallel ranks for the experts): each call pays the link latency, and on a measured device `call_s` (its in-step cost).

        ZeRO-0/1: DDP buckets (DDP_BUCKET_BYTES) all-reduced, or reduce-scattered and the updated
        weights all-gathered. ZeRO-2/3: one FSDP unit per block plus one for the rest of the stage, each
        reduce-scattering its gradients; ZeRO-2 gathers its weights once per step, ZeRO-3 again in every
        micro-batch's forward and backward.
        """
        plan = lay.plan
        if g.size == 1 or not psi.any():
            return 0.0, 0.0
        grads, weights = psi * lay.grad_bytes, psi * lay.param_bytes
        if plan.zero <= 1:
            calls = np.maximum(1.0, np.ceil(grads / DDP_BUCKET_BYTES))
            if plan.zero == 0:
                grad, param = calls * (comm.allreduce(grads / calls, g) + call_s), np.zeros_like(psi)
            else:
                grad = calls * (comm.reduce_scatter(grads / calls, g) + call_s)
                param = calls * (comm.allgather(weights / calls, g) + call_s)
        else:
            units = np.ceil(lay.blocks_per_stage) + 1
            gathers = 2 * microbatches if plan.zero >= 3 else 1
            grad = units * (comm.reduce_scatter(grads / units, g) + call_s)
            param = units * gathers * (comm.allgather(weights / units, g) + call_s)
        worst = int(np.argmax(grad + param))
        return float(grad[worst]), float(param[worst])
