"""What a collective costs inside a CPU training step, against the device profile's idle micro-benchmark.

    .venv/bin/python bench/cpu_collective_cost.py      # on an otherwise idle machine; ~20 s

Two gloo ranks, one thread each, as the CPU dataset's measured runs use them. Prints, per step:
  - a 128 KiB all-reduce alone, mean of back-to-back calls (the device profile's α-β fit,
    `predictor.measure.collectives`, takes the best of five calls, each after a barrier);
  - the same all-reduce interleaved with four 256^3 matmuls (its cost once ranks also compute);
  - one MLP block (128 -> 512 -> 128, micro-batch 8 x 32 tokens) forward + backward in one process and
    under DTensor tensor parallelism (ColwiseParallel + RowwiseParallel: two all-reduces per step).
The gap between the tp=2 block and half the one-process block, less its all-reduces, is the framework's
cost per tensor-parallel layer that the analytical composition does not price.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predictor.measure.collectives import free_port  # noqa: E402

HIDDEN, TOKENS, MBS = 128, 32, 8


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))


def _per_call(fn: Callable[[], object], sync: Callable[[], object] = lambda: None, n: int = 200) -> float:
    """Seconds per call of `fn` after a warm-up, bracketed by `sync` (a barrier across ranks)."""
    for _ in range(20):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n


def _rank(rank: int, world: int, port: int, out: mp.SimpleQueue) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    act = torch.randn(MBS * TOKENS * HIDDEN)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    alone = _per_call(lambda: dist.all_reduce(act), dist.barrier)
    compute = _per_call(lambda: [a @ b for _ in range(4)], dist.barrier)
    both = _per_call(lambda: ([a @ b for _ in range(4)], dist.all_reduce(act)), dist.barrier)
    block = parallelize_module(_mlp(), init_device_mesh("cpu", (world,)), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(MBS, TOKENS, HIDDEN, requires_grad=True)
    tp = _per_call(lambda: block(x).sum().backward(), dist.barrier, n=100)
    if rank == 0:
        out.put((alone, both - compute, tp))
    dist.destroy_process_group()


def main() -> int:
    torch.set_num_threads(1)
    block, x = _mlp(), torch.randn(MBS, TOKENS, HIDDEN, requires_grad=True)
    single = _per_call(lambda: block(x).sum().backward(), n=100)
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_rank, args=(2, free_port(), out), nprocs=2)
    alone, interleaved, tp = out.get()
    print(f"all-reduce of {MBS * TOKENS * HIDDEN * 4 // 1024} KiB: alone {alone * 1e3:.2f} ms, "
          f"interleaved with compute {interleaved * 1e3:.2f} ms")
    print(f"MLP block fwd+bwd: one process {single * 1e3:.2f} ms, tp=2 {tp * 1e3:.2f} ms; beyond half the "
          f"one-process time and two interleaved all-reduces: {(tp - single / 2 - 2 * interleaved) * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
