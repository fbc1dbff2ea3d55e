"""What collectives, messages and tensor-parallel layers cost inside a CPU training step, measured.

The α-β fit of `predictor.measure.collectives` times each collective alone, after a barrier, best
of five: the link at rest. Inside a step the two ranks also compute on the machine's cores, and a
collective between two matmuls costs several times more; DTensor tensor parallelism adds a
framework cost per sharded linear on top of its all-reduces. All three are measured here with two
single-threaded gloo ranks, as the CPU dataset's runs use them, as means over many calls:

  - `collective_s`: seconds one 16 KiB all-reduce adds between compute (interleaved time less the
    compute alone);
  - `p2p_s`: the same for one 16 KiB send/recv between the two ranks (a pipeline stage boundary);
  - `tp_linear_s`: the extra seconds, forward + backward, of one DTensor-sharded linear: an MLP
    block (column- then row-parallel linear) under tp=2, less the same half-width block run
    locally, less its two interleaved all-reduces, halved.

Workers are fresh interpreters (`python -m predictor.measure.contention`), like the collectives'.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Callable

from predictor.costs import comm
from predictor.measure.collectives import run_local_ranks
from predictor.spec.hardware import Link

HIDDEN, TOKENS, MBS = 128, 32, 8  # a small transformer MLP block: latency-bound, as CPU plans are
SMALL_BYTES = 16 * 1024


def _per_call(fn: Callable[[], object], sync: Callable[[], object], n: int) -> float:
    """Mean seconds per call of `fn` after a warm-up, bracketed by `sync` (a barrier across ranks)."""
    for _ in range(max(5, n // 10)):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n


def _worker(rank: int, world: int, port: int, calls: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    def mlp(width: int) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(HIDDEN, width), nn.GELU(), nn.Linear(width, HIDDEN))

    small = torch.ones(SMALL_BYTES // 4)
    act = torch.ones(MBS * TOKENS * HIDDEN)
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def work() -> None:
        for _ in range(4):
            a @ b

    def message() -> None:
        if rank == 0:
            dist.send(small, 1)
        elif rank == 1:
            dist.recv(small, 0)

    def after_work(call: Callable[[], object]) -> float:
        """Seconds `call` adds when it follows the compute `work` on every rank."""
        return _per_call(lambda: (work(), call()), dist.barrier, calls) - compute

    compute = _per_call(work, dist.barrier, calls)
    both = after_work(lambda: dist.all_reduce(small))
    sent = after_work(message)
    act_ar = after_work(lambda: dist.all_reduce(act))
    x = torch.randn(MBS, TOKENS, HIDDEN, requires_grad=True)
    local = mlp(4 * HIDDEN // world)
    local_s = _per_call(lambda: local(x).sum().backward(), dist.barrier, calls // 2)
    block = parallelize_module(mlp(4 * HIDDEN), init_device_mesh("cpu", (world,)),
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
    tp_s = _per_call(lambda: block(x).sum().backward(), dist.barrier, calls // 2)
    out = torch.tensor([both, sent, (tp_s - local_s - 2 * act_ar) / 2], dtype=torch.float64)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)  # a step waits for its slowest rank
    if rank == 0:
        names = ("collective_s", "p2p_s", "tp_linear_s")
        sys.stdout.write(json.dumps({k: max(float(v), 0.0) for k, v in zip(names, out)} | {"bytes": SMALL_BYTES}) + "\n")
        sys.stdout.flush()
    dist.barrier()
    os._exit(0)  # gloo can abort in its destructors otherwise (ARCHITECTURE.md)


def idle_seconds(link: Link, op_links: dict[str, Link], size: float) -> tuple[float, float]:
    """(all-reduce, send/recv) seconds of a `size`-byte message between 2 ranks on the idle links (each
    op's own α-β where `op_links` has it): what the in-step costs are compared against."""
    group = comm.Group(2, 1, link, link, tuple(sorted(op_links.items())))
    return float(comm.allreduce(size, group)), float(comm.p2p(size, group.intra_for("send_recv")))


def measure_step_costs(world_size: int = 2, calls: int = 400, runs: int = 3,
                       timeout_s: float = 120.0) -> dict[str, float]:
    """{'collective_s', 'p2p_s', 'tp_linear_s'} seconds (and the message 'bytes') on this machine with
    `world_size` local single-threaded ranks: the median of `runs` fresh benchmarks, each a mean over
    `calls` calls (one run's means swing 10-20 % from the next)."""
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2 to measure step costs, got {world_size}")
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    results = [json.loads(run_local_ranks("predictor.measure.contention", world_size, [str(calls)],
                                          "step-cost benchmark", timeout_s)) for _ in range(runs)]
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


if __name__ == "__main__":
    _rank, _world, _port, _calls = (int(x) for x in sys.argv[1:5])
    _worker(_rank, _world, _port, _calls)
