"""Per-layer costs of the analytical model and its constants: roofline time of each layer graph node.

Per layer: max(FLOPs / (peak · eff(GEMM shape)), bytes / (bandwidth · bw_eff)) plus a kernel launch
cost. Every constant is in `AnalyticalConfig` with its reason; nothing here is fit to measured
iterations except the framework constants `bench/modern_eval.py --record` (Megatron-Core on Hopper and Blackwell)
and `bench/vtrain_eval.py --record` (DeepSpeed on Ampere) write.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, fields, replace
from functools import cache

import numpy as np

from predictor.costs.parallel import BYTES, shard_nodes
from predictor.frameworks import Framework
from predictor.frameworks.base import SoftmaxFallback
from predictor.graph.layer_graph import LayerGraph
from predictor.kernels.attention import BWD_FLOPS, AttentionCurves, attention_curves
from predictor.kernels.gemm import measured_gemm
from predictor.models.lowprec import low_precision_gemms, quantisation_times
from predictor.plan.share import RankShare
from predictor.spec.hardware import DEVICES, GB, Device, GemmFact, device_facts, gemm_facts, generation
from predictor.spec.resolver import Resolved
from predictor.spec.workload import ModelSpec, WorkloadSpec


@dataclass(frozen=True)
class AnalyticalConfig:
    """Constants of the analytical model (first principles and vendor documentation, not fit).

    gemm_eff_max: fraction of dense peak a large tensor-core GEMM sustains. Where the device generation has a
        public GEMM table (predictor/data/device_facts.json: Hopper 0.878, Blackwell 0.679), `device_config` fits
        it there; elsewhere 0.8, cuBLAS large fp16/bf16 GEMMs on A100 under the board power limit (NVIDIA
        "Matrix Multiplication Background" user guide performance figures). A measured device's peak is already an
        achieved matmul rate, so it uses 1.0. Where the generation has a measured GEMM grid in a device profile
        (`predictor.kernels.gemm`: XLA's H100 and B200 tables) and the framework has no constant fitted on the
        generation, the grid's rate at each GEMM's shape prices it instead of this curve (`measured_gemm_rates`).
    gemm_half_dim: GEMM dimension at which efficiency halves, f(x) = x / (x + c): one thread-block
        tile edge (128 on Ampere/Hopper cuBLAS kernels, same guide), whose fixed prologue/epilogue
        cost is comparable to one tile's math. Measured CPUs: 32 (register/cache blocking of a
        single-thread BLAS kernel is tens of elements).
    tile: GEMM output tile edge for wave quantisation over the device's SMs (same guide).
    bw_eff: achieved fraction of the data sheet's HBM bandwidth by streaming kernels (the elementwise and normalisation
        layers, unfused softmax, the quantisation passes). Where the generation has STREAM-like measurements in the
        device facts, `device_config` takes their geometric mean (Ampere 0.882: memcpy and copy benchmarks on A100 40GB
        and A800 80GB; Blackwell 0.840: CCCL's BabelStream on B200); elsewhere 0.9 (BabelStream-class results reach
        ~90 % of the data sheet); measured devices: 1.0.
    launch_s: per-kernel launch and inter-kernel gap on a GPU, a few microseconds (CUDA launch
        latency as shown in NVIDIA's CUDA Graphs material); forward of a node ~1 kernel, backward ~2.
    score_passes: extra memory passes over the attention scores beyond the two batched GEMMs
        (softmax read+write, dropout read+write+1-byte mask) in the unfused attention of Megatron.
    host_op_s: host (CPU) cost of one eager PyTorch operator: Python, dispatcher, autograd
        bookkeeping, kernel launch; order 10 µs (PyTorch "Accelerating PyTorch with CUDA Graphs"
        blog, 2021; H. He, "Making Deep Learning Go Brrrr From First Principles", 2022). A GPU
        runs asynchronously behind the host, so a stage's micro-batch takes max(device, host);
        small layers are host-bound. On a measured CPU the host is the device: the costs add.
        Operators per node are in HOST_OPS; backward issues ~2 per forward operator. Recorded for DeepSpeed on
        Ampere (vTrain's single-node runs of Megatron-DeepSpeed, leave-one-model-out): 40 µs per counted operator,
        which also carries the operators the graph does not count.
    fp8_gemm_eff: fraction of the dense FP8 peak an FP8 GEMM kernel reaches relative to a bf16 GEMM of the same
        shape reaching gemm_eff_max: the kernel alone, its operands already quantised (the quantisation kernels
        and copies are priced apart, `predictor.models.lowprec`). From the generation's public FP8 GEMM figures
        where the catalogue has them (`device_config`: Hopper 0.989, Blackwell 0.866), else 1.0.
    fp4_gemm_eff: the same for an NVFP4 GEMM against the dense FP4 peak: Blackwell 0.586, from Transformer Engine's
        pre-quantised benchmark of one layer's GEMMs on B300 (`device_config`), else 1.0.
    bf16_gemm_eff_max: gemm_eff_max of the linear layers' GEMMs in a 16-bit (bf16/fp16) run, where a framework's
        16-bit GEMM rate on a generation was measured apart from its low-precision runs; None: gemm_eff_max. A
        framework's gemm_eff_max chosen on FP8 runs only fixes its product with fp8_gemm_eff for the linears, so it
        says nothing of their BF16 rate. Attention and an FP8/FP4 run's linears keep gemm_eff_max. Prior: the
        generation's public BF16 GEMM table (`device_config`, Blackwell 0.679); Megatron-Core on B200: chosen
        leave-one-plan-out on SimuMax's B200 BF16 runs (bench/simumax_time.py), and recorded for that device only.
    grouped_gemm_eff: fraction of a dense GEMM's efficiency (at the same per-expert shape) a routed expert's
        grouped GEMM reaches, with its token permutation and unpermutation (Megatron-Core's grouped GEMM and
        permute fusion, TE). 1.0 from first principles; calibrated on the MoE rows (bench/modern_eval.py).
    expert_host_s: seconds per local expert, MoE layer and forward pass (twice per backward) that the GPU waits
        for the host: Megatron-Core's alltoall token dispatcher copies the tokens-per-expert counts to the host
        to size its all-to-all (a device-to-host synchronisation per MoE layer), after which the host launches
        the layer's per-expert work (the grouped GEMM's per-expert splits and, in FP8, each expert's
        quantisation: a few eager operators at `host_op_s` each per local expert) before the GPU can go on.
        0 from first principles (no synchronisation); calibrated with grouped_gemm_eff.
    moe_imbalance: the tokens the busiest expert rank receives over the balanced share, which every rank of
        the expert-parallel group waits for; it stretches the experts' time and sizes the dispatch buffers. 1.0:
        balanced routing, as the published runs force it (Megatron-Bridge recipes); real routing with an
        auxiliary loss lies above 1.
    call_s: a collective or pipeline send/recv call's cost beyond its α-β time (the framework's
        and the communication library's own work per call). 0 from first principles; learned from
        measured iterations with host_op_s by `predictor.models.calibration`; recorded for DeepSpeed on Ampere
        with host_op_s (100 µs). A measured CPU's step costs (collective_call_s, p2p_call_s in Device.extra) take
        precedence.
    compute_share: the share of the device facts' compute rates (the measured GEMM grid, the fused-attention
        figures, the GEMM curve) a framework's kernels reach on the GPUs it runs on: 1.0 from first principles, so the
        facts price it; torchtitan's, chosen leave-one-source-out on its published runs (bench/torchtitan_eval.py),
        carries what its file's 500 W and power-limited parts and its own kernels leave of the full-power tables. A
        scale of the facts, not a replacement: recording it keeps them (`FACT_SCALES`).
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
    fp8_gemm_eff: float = 1.0
    fp4_gemm_eff: float = 1.0
    bf16_gemm_eff_max: float | None = None
    grouped_gemm_eff: float = 1.0
    expert_host_s: float = 0.0
    moe_imbalance: float = 1.0
    call_s: float = 0.0
    compute_share: float = 1.0
    step_p2p: bool = True

    def for_device(self, device: Device) -> "AnalyticalConfig":
        if not device.measured:
            return self
        return replace(self, gemm_eff_max=1.0, bf16_gemm_eff_max=None, gemm_half_dim=32.0, tile=0, bw_eff=1.0,
                       launch_s=0.0)

    def linear_eff_max(self, precision: str) -> float:
        """gemm_eff_max of the linears' GEMMs at the run's `precision` (`bf16_gemm_eff_max` in a 16-bit run)."""
        if precision not in HALF_PRECISIONS or self.bf16_gemm_eff_max is None:
            return self.gemm_eff_max
        return self.bf16_gemm_eff_max


# The constants bench/modern_eval.py calibrates per framework and device generation (`Framework.constants`).
# How much communication hides is the schedule's (`predictor.models.overlap`), not a constant.
CALIBRATED_FIELDS: tuple[str, ...] = ("gemm_eff_max",)
# Calibrated after them, on the MoE rows only, with the dense constants fixed: they act on MoE layers alone.
MOE_CALIBRATED_FIELDS: tuple[str, ...] = ("grouped_gemm_eff", "expert_host_s")


def routed(config: AnalyticalConfig, imbalance: float | None) -> AnalyticalConfig:
    """`config` with a workload's routing imbalance (`training.moe_imbalance`) where it names one: a property of the
    data and the router, not of the framework, so it overrides the constant."""
    return config if imbalance is None else replace(config, moe_imbalance=imbalance)


# A kernel profile's measured costs (`Device.extra`) that replace first principles' values.
MEASURED_COSTS: tuple[str, ...] = ("launch_s", "host_op_s")


def framework_config(framework: Framework, generation: str, device: str | None = None,
                     measured: dict[str, float] | None = None) -> AnalyticalConfig:
    """The analytical constants of `framework` on a `device` of a `generation`: the constants recorded for the device
    alone over those recorded for its generation, over the cluster's `measured` launch and host costs (a kernel
    profile's, `MEASURED_COSTS`), over the generation's first principles (`device_config`; those alone where none
    was fitted on it). A constant measured on one device (B200, a 1,000 W board) does not price the others of its
    generation: GB200 and GB300 run other power limits and data-sheet peaks."""
    recorded = {**framework.constants.get(generation, {}), **framework.constants.get(device or "", {})}
    known = {f.name for f in fields(AnalyticalConfig)}
    costs = {k: v for k, v in (measured or {}).items() if k in MEASURED_COSTS}
    return replace(device_config(generation), **{**costs, **{k: v for k, v in recorded.items() if k in known}})


# GEMMs whose every dimension reaches this are where the saturating curve of `gemm_efficiency` describes a public
# table; smaller ones are launch- and tail-bound, and training's linears are larger.
FACT_MIN_DIM = 1024


def _fact_fraction(fact: GemmFact) -> float | None:
    """The large-GEMM fraction of peak (`gemm_eff_max`) one catalogue entry implies: over its points of at least
    FACT_MIN_DIM, the geometric mean of achieved / (peak · the curve's shape and wave factor); for an entry that
    gives only its best figure, that over the peak."""
    device = DEVICES[fact.device]
    peak = device.flops(fact.precision)
    big = [p for p in fact.points if min(p[1:4]) >= FACT_MIN_DIM]
    if not big:
        return fact.best / peak if fact.best else None
    b, m, n, k, achieved = (np.array(col, dtype=float) for col in zip(*big))
    shape = gemm_efficiency(m, n, k, b, replace(AnalyticalConfig(), gemm_eff_max=1.0), int(device.extra["sms"]))
    return float(np.exp(np.mean(np.log(achieved / (peak * shape)))))


def _best_fraction(fact: GemmFact) -> float:
    peak = DEVICES[fact.device].flops(fact.precision)
    return max([p[4] for p in fact.points] + [fact.best]) / peak


def _stream_fraction(generation: str) -> float | None:
    """The geometric mean of achieved over data-sheet bandwidth of the generation's STREAM-like catalogue entries."""
    shares = [e["achieved_gbps"] * GB / (e["datasheet_gbps"] * GB if "datasheet_gbps" in e
                                         else DEVICES[e["device"]].mem_bandwidth)
              for e in device_facts()["memory_bound"] if e["generation"] == generation and e.get("stream")]
    return float(np.exp(np.mean(np.log(shares)))) if shares else None


@cache
def device_config(generation: str) -> AnalyticalConfig:
    """First principles on a device generation: `gemm_eff_max` from the public bf16 GEMM table of that generation
    (predictor/data/device_facts.json), `fp8_gemm_eff` from its fp8 one relative to it (by the curve where both
    give shapes, else by their best figures) and `bw_eff` from its STREAM-like bandwidth figures; the defaults where
    the catalogue has none."""
    stream = _stream_fraction(generation)
    base = AnalyticalConfig() if stream is None else replace(AnalyticalConfig(), bw_eff=round(stream, 3))
    bf16, fp8 = gemm_facts(generation, "bf16"), gemm_facts(generation, "fp8")
    if not bf16:
        return base
    eff = _fact_fraction(bf16[0])
    low = {}
    if fp8:
        ratio = (_fact_fraction(fp8[0]) / eff if fp8[0].points and bf16[0].points
                 else _best_fraction(fp8[0]) / _best_fraction(bf16[0]))
        low = {"fp8_gemm_eff": round(min(ratio, 1.0), 3)}
    fp4 = _layer_gemm_ratio(generation, "nvfp4", "fp4")
    if fp4 is not None:
        low["fp4_gemm_eff"] = round(fp4, 3)
    return replace(base, gemm_eff_max=round(eff, 3), **low)


def _layer_gemm_ratio(generation: str, recipe: str, precision: str) -> float | None:
    """A recipe's GEMM efficiency relative to BF16 from a catalogue benchmark of one layer's GEMMs with pre-quantised
    operands: (BF16 time / its time) over (its peak / the BF16 peak); None where the generation has none."""
    entry = next((e for e in device_facts()["low_precision_recipes"]
                  if e["generation"] == generation and recipe in e.get("layer_gemm_ms", {}).get("pre_quantized", {})),
                 None)
    if entry is None:
        return None
    device, ms = DEVICES[entry["device"]], entry["layer_gemm_ms"]["pre_quantized"]
    return ms["bf16"] / ms[recipe] * device.flops("bf16") / device.flops(precision)


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
# 16-bit training precisions: whose linears `AnalyticalConfig.bf16_gemm_eff_max` prices.
HALF_PRECISIONS: tuple[str, ...] = ("bf16", "fp16")
# A fused causal attention kernel (FlashAttention, cuDNN via Transformer Engine) skips the tiles above the
# diagonal: half the s² work of the unmasked product (Dao 2023, FlashAttention-2 §3.1).
CAUSAL_FUSED_WORK = 0.5


def sliding_window_work(model: ModelSpec, document: int | None = None) -> float:
    """The share of full causal attention work a fused kernel does over the model's layers: a local layer's query
    sees at most `sliding_window` keys, so of the s²/2 causal tiles it computes the band s·w − w²/2
    (FlashAttention's window_size skips the rest); global layers do all of theirs. Packed documents of `document`
    tokens (`training.document_tokens`; a variable-length kernel over cu_seqlens) attend within each document: s/d
    documents of d²/2 tiles (of the band d·w − w²/2 on a local layer). One mean over the layers: every pipeline
    stage is priced with the model's mix of local and global layers. Unfused attention computes the whole masked
    s×s product whatever the window, so this applies to fused kernels only."""
    s, w, local = model.tokens, model.sliding_window, model.local_layers
    if not s:
        return 1.0
    d = min(document or s, s)
    if not local or w is None or w >= d:
        return d / s
    band = (2 * w - w * w / d) / s
    return ((model.layers - local) * d / s + local * band) / model.layers


def layer_times(resolved: Resolved, graph: LayerGraph, share: RankShare, mbs: int,
                cfg: AnalyticalConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of one occurrence of each graph node on one rank at micro-batch `mbs`, the
    nodes sharded as `share` says (`predictor.costs.parallel.shard_nodes`), on the resolved spec's device under its
    framework and recipe.

    The learned predictor falls back to this for layers it has no timings for.
    """
    spec, device, framework, recipe = resolved.spec, resolved.device, resolved.framework, resolved.recipe
    cfg = (cfg or AnalyticalConfig()).for_device(device)
    prec = spec.training.precision
    fused, fallback = resolved.fused_attention, resolved.softmax_fallback
    curves = fused_attention_curves(resolved)
    # a framework whose gemm_eff_max was fitted on the generation keeps the curve it was fitted with
    grid = not framework.fitted_on(resolved.generation, device.name)
    key = (id(graph), share, mbs, device.name, device.flops(prec),
           device.mem_bandwidth, prec, recipe, cfg, fused, fallback, curves and curves.how, grid,
           spec.training.document_tokens)
    hit = _TIME_CACHE.get(key)
    if hit is not None and hit[0]() is graph:
        return hit[1]
    value = _layer_times(spec, graph, share, mbs, device, cfg, fused, fallback, recipe, curves, grid)
    _TIME_CACHE[key] = (weakref.ref(graph, lambda _r, k=key: _TIME_CACHE.pop(k, None)), value)
    return value


def softmax_fallbacks(nodes, mbs: int, fused: bool, fallback: SoftmaxFallback | None) -> np.ndarray:
    """Which of the (sharded) nodes are unfused attention whose softmax runs the framework's eager fallback at
    micro-batch `mbs` (a node's gemm_batch is its heads per rank, gemm_m and gemm_n the query and key lengths)."""
    if fused or fallback is None:
        return np.zeros(len(nodes.kind), dtype=bool)
    return nodes.attention & ~fallback.fused(nodes.gemm_batch * mbs, nodes.gemm_m, nodes.gemm_n)


# Precisions whose runs' fused attention is a 16-bit kernel (an FP8/FP4 recipe leaves attention in BF16: Megatron-Core's
# --fp8-dot-product-attention is off by default); an FP32 run's attention has no catalogued kernel.
FUSED_KERNEL_PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8", "fp4")


def fused_attention_curves(resolved: Resolved) -> AttentionCurves | None:
    """The device facts' figures of the fused-attention kernel the spec's framework runs on the device's generation
    (`Framework.attention_backends`): the first principles of its attention where none of the framework's constants
    were fitted on the generation. None where its attention is unfused, the catalogue has no figures of its kernel
    there, or its constants were fitted on the generation (or the device) with attention as batched GEMMs at their
    `gemm_eff_max`, as recorded constants override the GEMM facts: attention then prices as those GEMMs."""
    gen, kernel = resolved.generation, resolved.attention_backend
    if (kernel is None or resolved.spec.training.precision not in FUSED_KERNEL_PRECISIONS
            or resolved.framework.fitted_on(gen, resolved.device.name)):
        return None
    return attention_curves(gen, kernel)


def measured_gemm_rates(nodes, m, batch, prec: str, recipe, device: Device, cfg: AnalyticalConfig) -> np.ndarray | None:
    """FLOP/s of each node's GEMMs from the measured grid of the device's generation (`measured_gemm`), the routed
    experts' (a grouped GEMM at their tokens per expert) times grouped_gemm_eff; None where the generation has no
    grid at the run's 16-bit or FP32 precision. A recipe's low-precision GEMMs take their own grid where the profile
    has one, else the 16-bit grid's rate times the peak ratio and the generation's fp8_gemm_eff / fp4_gemm_eff."""
    half = measured_gemm(device, "bf16" if recipe is not None else prec)
    if half is None:
        return None
    shape = (m, nodes.gemm_n, nodes.gemm_k, batch)
    rate = half[0].rate(*shape) * half[1]
    if recipe is not None:
        own = measured_gemm(device, recipe.precision)
        low = (own[0].rate(*shape) * own[1] if own is not None else
               rate * device.flops(recipe.precision) / device.flops("bf16")
               * (cfg.fp4_gemm_eff if recipe.precision == "fp4" else cfg.fp8_gemm_eff))
        rate = np.where(low_precision_gemms(nodes), low, rate)
    return rate * np.where(nodes.experts, cfg.grouped_gemm_eff, 1.0)


def _layer_times(spec, graph, share, mbs, device, cfg, fused, fallback, recipe, curves, grid):
    nodes = shard_nodes(graph, share, spec.model.heads)
    prec = spec.training.precision
    eb = BYTES[prec]
    peak = np.full(len(nodes.kind), device.flops(prec))
    if recipe is not None:  # the recipe's GEMMs at its peak; attention, router, embedding and output layer in BF16
        low_peak = device.flops(recipe.precision) * (cfg.fp4_gemm_eff if recipe.precision == "fp4" else cfg.fp8_gemm_eff)
        peak = np.where(low_precision_gemms(nodes), low_peak, device.flops("bf16"))
    vector_peak = device.flops("fp32")
    bw = device.mem_bandwidth * cfg.bw_eff
    sms = int(device.extra.get("sms", 0))
    is_gemm = nodes.gemm_m > 0
    m = nodes.gemm_m * np.where(nodes.attention, 1, mbs)
    batch = nodes.gemm_batch * np.where(nodes.attention, mbs, 1)
    # gemm_efficiency is proportional to gemm_eff_max: the linears (experts included) scale to their own maximum.
    linear = cfg.linear_eff_max(prec) / cfg.gemm_eff_max
    eff = (gemm_efficiency(m, nodes.gemm_n, nodes.gemm_k, batch, cfg, sms) * np.where(nodes.attention, 1.0, linear)
           * np.where(nodes.experts, cfg.grouped_gemm_eff, 1.0))
    causal = CAUSAL_FUSED_WORK * sliding_window_work(spec.model, spec.training.document_tokens)
    work = np.where(nodes.attention & fused & spec.model.decoder, causal, 1.0)
    fwd_f = nodes.fwd_flops * mbs * work
    bwd_f = nodes.bwd_flops * mbs * work
    gemm_bytes = (m * nodes.gemm_k + nodes.gemm_k * nodes.gemm_n + m * nodes.gemm_n) * batch * eb
    if fused:  # the s×s product never reaches memory: Q, K, V in and O out
        gemm_bytes = np.where(nodes.attention, 4 * m * nodes.gemm_k * batch * eb, gemm_bytes)
    io_bytes = np.where(is_gemm, gemm_bytes, nodes.io_elems * mbs * eb + nodes.params * eb)
    measured = measured_gemm_rates(nodes, m, batch, prec, recipe, device, cfg) if grid else None
    compute_rate = np.where(is_gemm, (peak * eff if measured is None else measured) * cfg.compute_share, vector_peak)
    fwd = np.maximum(fwd_f / compute_rate, io_bytes / bw)
    bwd = np.maximum(bwd_f / compute_rate, 2 * io_bytes / bw)
    if curves is not None:  # the kernel's published rate at the rank's query length and head dimension
        causal = spec.model.decoder
        att = nodes.attention
        rate_f = curves.rate(False, causal, nodes.gemm_k, nodes.gemm_m) * cfg.compute_share
        rate_b = curves.rate(True, causal, nodes.gemm_k, nodes.gemm_m) * cfg.compute_share
        fwd = np.where(att, np.maximum(fwd_f / rate_f, io_bytes / bw), fwd)
        bwd = np.where(att, np.maximum(BWD_FLOPS * fwd_f / rate_b, 2 * io_bytes / bw), bwd)
    # Unfused attention: the s² scores make extra passes through memory (the GEMM I/O is counted above).
    passes = 0.0 if fused else cfg.score_passes
    scores = np.where(nodes.attention, nodes.gemm_m * nodes.gemm_n * batch * eb, 0.0)
    # The expert-parallel group waits for its busiest rank: its experts run moe_imbalance times the balanced share.
    busiest = np.where(nodes.experts, cfg.moe_imbalance, 1.0)
    fwd, bwd = fwd * busiest, bwd * busiest
    fwd = fwd + passes * scores / bw + cfg.launch_s
    bwd = bwd + 2 * passes * scores / bw + 2 * cfg.launch_s
    eager = softmax_fallbacks(nodes, mbs, fused, fallback)
    if eager.any():  # the softmax's eager fallback: more passes over the scores and its extra kernels
        extra_f, extra_b = fallback.passes
        fwd = fwd + eager * (extra_f * scores / bw + fallback.ops * cfg.launch_s)
        bwd = bwd + eager * (extra_b * scores / bw + 2 * fallback.ops * cfg.launch_s)
    if recipe is not None:  # the quantisation kernels before the GEMMs, each after the kernel it reads from
        quant_f, quant_b = quantisation_times(graph, nodes, mbs, recipe, device, bw, cfg.launch_s)
        fwd, bwd = fwd + quant_f * busiest, bwd + quant_b * busiest
    return fwd, bwd
