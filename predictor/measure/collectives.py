"""Collective micro-benchmarks with torch.distributed (gloo on CPU), fitted to α-β link parameters.

`benchmark_collectives` runs all-reduce, all-gather, reduce-scatter and send/recv over a range of
message sizes with `world_size` local processes (one thread each) and returns the raw points;
`fit_link` fits them to the α-β model of `predictor.comm` (the ScaleDL paper's Eq. 15), so the
fitted link reproduces the measurements through the same formulas the predictors use;
`fit_op_links` fits each op alone, the links a measured device prices its collectives with.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from predictor import comm
from predictor.hardware import Link

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
DEFAULT_SIZES: tuple[int, ...] = tuple(4 ** k * 1024 for k in range(0, 7))  # 1 KiB .. 4 MiB


@dataclass(frozen=True)
class CollectivePoint:
    """One measurement: `op` over `world_size` ranks on a buffer of `bytes` (the full buffer), best-of-reps seconds."""

    op: str
    bytes: int
    world_size: int
    seconds: float


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now: the rendezvous of a local process group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, sizes: tuple[int, ...], reps: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    points = []
    for op in OPS:
        for size in sizes:
            numel = max(size // 4, world)
            numel -= numel % world
            buf = torch.ones(numel, dtype=torch.float32)
            part = torch.empty(numel // world, dtype=torch.float32)
            times = []
            for i in range(reps + 2):  # two warm-up rounds
                dist.barrier()
                t0 = time.perf_counter()
                if op == "all_reduce":
                    dist.all_reduce(buf)
                elif op == "all_gather":
                    dist.all_gather_into_tensor(buf, part)
                elif op == "reduce_scatter":
                    dist.reduce_scatter_tensor(part, buf)
                elif rank == 0:  # send_recv: one direction between ranks 0 and 1
                    dist.send(buf, 1)
                elif rank == 1:
                    dist.recv(buf, 0)
                if i >= 2:
                    times.append(time.perf_counter() - t0)
            # Best of the repetitions (other load on the machine only ever adds time); the
            # collective ends when the slowest rank ends: max over ranks.
            t = torch.tensor([min(times)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            points.append([op, numel * 4, world, float(t.item())])
    if rank == 0:
        sys.stdout.write(json.dumps(points) + "\n")
        sys.stdout.flush()
    dist.barrier()
    os._exit(0)  # gloo can abort in its destructors otherwise (ARCHITECTURE.md)


def run_local_ranks(module: str, world_size: int, args: list[str], what: str, timeout_s: float = 120.0) -> str:
    """Run `python -m module RANK WORLD PORT *args` as `world_size` fresh single-threaded interpreters on
    127.0.0.1 and return the last line rank 0 printed. Fresh interpreters work from any caller, including
    scripts without a `__main__` guard; a failure raises with the ranks' stderr, `what` naming the benchmark."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", module, str(r), str(world_size), str(port), *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world_size)]
    try:
        outs = [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if procs[0].returncode != 0 or not outs[0][0].strip():
        err = "\n".join(o[1].strip()[-2000:] for o in outs if o[1].strip())
        raise RuntimeError(f"{what} failed (exit codes {[p.returncode for p in procs]}): {err}")
    return outs[0][0].strip().splitlines()[-1]


def benchmark_collectives(sizes: tuple[int, ...] = DEFAULT_SIZES, world_size: int = 2, reps: int = 5,
                          timeout_s: float = 120.0) -> list[CollectivePoint]:
    """Measure every op in OPS at every size with `world_size` local single-threaded processes."""
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2 to measure collectives, got {world_size}")
    line = run_local_ranks("predictor.measure.collectives", world_size, [str(reps), ",".join(map(str, sizes))],
                           "collective benchmark", timeout_s)
    return [CollectivePoint(*row) for row in json.loads(line)]


def _coefficients(op: str, n: int, tree: bool = False) -> tuple[float, float]:
    """(latency steps, bandwidth factor) of `op` over n ranks in the α-β model of predictor.comm.

    `tree`: the all-reduce takes recursive doubling (ceil(log2 n) steps of α + S/B), the branch
    `comm.allreduce` prices when it is the cheaper one.
    """
    if op == "all_reduce":
        if tree:
            steps = float(np.ceil(np.log2(n)))
            return steps, steps
        return 2 * (n - 1), 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return n - 1, (n - 1) / n
    return 1.0, 1.0


def _lstsq_link(points: list[CollectivePoint], tree: list[bool], source: str) -> Link:
    """Least-squares α and B of t = a_op·α + b_op·S/B with each all-reduce on its given branch."""
    a = np.array([[*_coefficients(p.op, p.world_size, t)] for p, t in zip(points, tree)])
    size = np.array([p.bytes for p in points], dtype=float)
    t = np.array([p.seconds for p in points])
    design = np.column_stack([a[:, 0], a[:, 1] * size]) / t[:, None]
    (alpha, inv_bw), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if inv_bw <= 0:  # latency-dominated data: bandwidth from the largest messages alone
        big = size == size.max()
        inv_bw = float(np.median((t[big] - a[big, 0] * max(alpha, 0)) / (a[big, 1] * size[big])))
    return Link(bandwidth=float(1.0 / max(inv_bw, 1e-15)), latency=max(float(alpha), 0.0), source=source)


def fit_link(points: list[CollectivePoint], source: str = "measured", rounds: int = 5) -> Link:
    """The α (latency) and B (bus bandwidth) under which predictor.comm's formulas best reproduce `points`.

    Relative residuals are minimised (each row divided by its time) so small messages, which
    fix α, weigh as much as large ones, which fix B. An all-reduce is fitted on the branch
    (ring or recursive doubling) that `comm.allreduce` takes for it under the fitted link, so
    the fit and the prediction use one formula: start from the ring, refit until the branches settle.
    """
    tree = [False] * len(points)
    link = _lstsq_link(points, tree, source)
    for _ in range(rounds):
        settled = [p.op == "all_reduce" and bool(comm.tree_beats_ring(p.bytes, p.world_size, link)) for p in points]
        if settled == tree:
            break
        tree = settled
        link = _lstsq_link(points, tree, source)
    return link


def fit_op_links(points: list[CollectivePoint], source: str = "measured") -> dict[str, Link]:
    """Each op's own α-β (`fit_link` on that op's points): one link for all of them misprices gloo on
    CPU by 3-8x, as its all-reduce, all-gather, reduce-scatter and send/recv run different algorithms."""
    return {op: fit_link([p for p in points if p.op == op], f"{source}, {op} alone")
            for op in sorted({p.op for p in points})}


if __name__ == "__main__":
    _rank, _world, _port, _reps, _sizes = sys.argv[1:6]
    _worker(int(_rank), int(_world), int(_port), tuple(int(x) for x in _sizes.split(",")), int(_reps))
