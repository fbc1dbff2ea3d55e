"""Kernel micro-benchmarks on one torch device: what a device profile's points are (`predictor.measure.kernel_profile`).

The same functions run on a CPU (torch's CPU kernels, synchronous: best wall time) and on a CUDA GPU (CUDA
events around calls queued back to back, the rate a training step's queue of kernels sees, without the
launch latency of a call from an idle GPU). Each returns a rate: FLOP/s for the matrix products and
attention, bytes/s for the memory-bound copy, seconds for the launch and host costs.

- GEMM: `torch.matmul` of (batch, m, k) x (batch, k, n), 2·batch·m·n·k FLOPs.
- grouped GEMM: `torch._grouped_mm` (the kernel torchtitan's MoE layers run) over `groups` experts of
  `tokens` tokens each, 2·groups·tokens·n·k FLOPs.
- attention: `F.scaled_dot_product_attention`, FLOPs as FlashAttention's benchmarks count them
  (4·b·h·s²·d forward, 2.5 times that backward; `predictor.kernels.attention.BWD_FLOPS`).
- memory-bound: a device-to-device copy, read and write counted (the STREAM copy's convention).
- launch: a tiny kernel's time, queued back to back (the GPU's per-kernel floor; on a CPU the dispatcher's);
  host operator: one eager operator that autograd records, on the host (`AnalyticalConfig.host_op_s`).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any, Callable

import torch
import torch.nn.functional as F

from predictor.kernels.attention import BWD_FLOPS

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
# What a CUDA SDPA backend is called in a profile (torch.nn.attention.SDPBackend member -> name).
CUDA_ATTENTION = {"FLASH_ATTENTION": "flash", "CUDNN_ATTENTION": "cudnn", "EFFICIENT_ATTENTION": "efficient"}
CPU_ATTENTION = "sdpa-cpu"


def seconds_per_call(fn: Callable[[], Any], device: torch.device, budget_s: float = 0.05, calls: int = 0) -> float:
    """Seconds one call of `fn` takes in steady state.

    CUDA: `calls` calls (default: enough for about `budget_s`) queued between two events, after a warm-up, their
    mean. CPU: the best of repeated single calls within `budget_s` (other load only ever adds time)."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        if not calls:
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize(device)
            calls = max(3, min(1000, int(budget_s / max(time.perf_counter() - t0, 1e-6))))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    best, begun, reps = float("inf"), time.perf_counter(), 0
    while reps < 3 or time.perf_counter() - begun < budget_s:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return best


def _operands(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if dtype.is_floating_point and dtype.itemsize == 1:  # fp8: made in bf16 and cast (no randn kernel in fp8)
        return torch.randn(shape, device=device, dtype=torch.bfloat16).to(dtype)
    return torch.randn(shape, device=device, dtype=dtype)


def gemm_rate(batch: int, m: int, n: int, k: int, precision: str, device: torch.device, budget_s: float = 0.05) -> float:
    """FLOP/s of a batched (batch, m, k) x (batch, k, n) product in `precision` (fp8: `torch._scaled_mm`, unit
    scales, bf16 output, one product per batch element as Transformer Engine's FP8 linears run)."""
    dtype = DTYPES[precision]
    if precision == "fp8":
        a = _operands((m, k), dtype, device)
        b = _operands((n, k), dtype, device).t()  # _scaled_mm takes its second operand column-major
        one = torch.ones((), device=device)
        fn = lambda: [torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16) for _ in range(batch)]  # noqa: E731
    else:
        a, b = _operands((batch, m, k), dtype, device), _operands((batch, k, n), dtype, device)
        fn = lambda: torch.matmul(a, b)  # noqa: E731
    return 2.0 * batch * m * n * k / seconds_per_call(fn, device, budget_s)


def grouped_gemm_rate(groups: int, tokens: int, n: int, k: int, precision: str, device: torch.device,
                      budget_s: float = 0.05) -> float:
    """FLOP/s of one grouped GEMM: `groups` experts, `tokens` rows each, (tokens, k) x (k, n) per expert."""
    dtype = DTYPES[precision]
    a = _operands((groups * tokens, k), dtype, device)
    b = _operands((groups, k, n), dtype, device)
    offsets = torch.arange(1, groups + 1, device=device, dtype=torch.int32) * tokens
    return 2.0 * groups * tokens * n * k / seconds_per_call(lambda: torch._grouped_mm(a, b, offs=offsets), device,
                                                            budget_s)


def attention_backends(device: torch.device) -> dict[str, Any]:
    """The SDPA backends to measure on `device`: name -> context that selects it (None: torch's own choice)."""
    if device.type != "cuda":
        return {CPU_ATTENTION: None}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return {name: (lambda member=getattr(SDPBackend, key): sdpa_kernel(member))
            for key, name in CUDA_ATTENTION.items() if hasattr(SDPBackend, key)}


def attention_rates(seq: int, head_dim: int, heads: int, batch: int, precision: str, device: torch.device,
                    backend: Any = None, budget_s: float = 0.05) -> tuple[float, float]:
    """(forward, backward) FLOP/s of unmasked self-attention over `seq` tokens, through `backend`'s context."""
    dtype = DTYPES[precision]
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    flops = 4.0 * batch * heads * seq * seq * head_dim
    with backend() if backend else nullcontext():
        out = F.scaled_dot_product_attention(q, k, v)
        grad = torch.ones_like(out)
        forward = seconds_per_call(lambda: F.scaled_dot_product_attention(q, k, v), device, budget_s)
        both = seconds_per_call(lambda: torch.autograd.backward(F.scaled_dot_product_attention(q, k, v), grad),
                                device, budget_s)
    return flops / forward, BWD_FLOPS * flops / max(both - forward, forward * 1e-3)


def copy_rate(nbytes: int, device: torch.device, budget_s: float = 0.05) -> float:
    """Bytes/s of a copy of `nbytes` (read + write counted: 2·nbytes moved per call)."""
    src = torch.ones(max(1, nbytes // 4), device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2.0 * src.numel() * 4 / seconds_per_call(lambda: dst.copy_(src), device, budget_s)


def launch_seconds(device: torch.device, ops: int = 200) -> float:
    """Seconds per tiny kernel run back to back: on a GPU its launch-and-run floor, captured in a CUDA graph
    so the host's pace does not set it (as a training step's queue hides the host); on a CPU the dispatcher's."""
    x = torch.zeros(1, device=device)
    if device.type != "cuda":
        return seconds_per_call(lambda: x.add_(1.0), device, 0.02)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        x.add_(1.0)  # warm-up outside capture
        torch.cuda.synchronize(device)
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(ops):
                x.add_(1.0)
    return seconds_per_call(graph.replay, device, calls=20) / ops


def host_op_seconds(device: torch.device, ops: int = 500) -> float:
    """Host seconds per eager operator that autograd records (Python, dispatcher, autograd node, launch), timed
    on the host without waiting for the device: what a host-bound step pays per operator."""
    x = torch.ones(1, device=device, requires_grad=True)

    def chain() -> None:
        y = x
        for _ in range(ops):
            y = y * 1.0

    chain()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        chain()
        best = min(best, time.perf_counter() - t0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return best / ops
