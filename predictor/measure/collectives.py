"""Collective micro-benchmarks with torch.distributed (gloo on CPU), fitted to α-β link parameters.

`benchmark_collectives` runs all-reduce, all-gather, reduce-scatter and send/recv over a range of
message sizes with `world_size` local processes (one thread each) and returns the raw points;
`fit_link` fits them to the α-β model of `predictor.costs.comm` (the ScaleDL paper's Eq. 15), so the
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

from predictor.costs import comm
from predictor.spec.hardware import Link

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
    return free_port_on("127.0.0.1")


def free_port_on(addr: str) -> int:
    """A TCP port free now on `addr` (a node's address other nodes reach it at)."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, sizes: tuple[int, ...], reps: int, backend: str = "gloo",
            addr: str = "127.0.0.1") -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":  # one GPU per rank: the node's GPUs in rank order (one per process across nodes)
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)

    def wait() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    points = []
    for op in OPS:
        for size in sizes:
            numel = max(size // 4, world)
            numel -= numel % world
            buf = torch.ones(numel, dtype=torch.float32, device=device)
            part = torch.empty(numel // world, dtype=torch.float32, device=device)
            times = []
            for i in range(reps + 2):  # two warm-up rounds
                dist.barrier()
                wait()
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
                wait()
                if i >= 2:
                    times.append(time.perf_counter() - t0)
            # Best of the repetitions (other load on the machine only ever adds time); the
            # collective ends when the slowest rank ends: max over ranks.
            t = torch.tensor([min(times)], dtype=torch.float64, device=device)
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
    return run_ranks(module, range(world_size), world_size, free_port(), args, what, timeout_s)


def run_ranks(module: str, ranks: range | list[int], world_size: int, port: int, args: list[str], what: str,
              timeout_s: float = 120.0) -> str:
    """Run `python -m module RANK WORLD PORT *args` for each of `ranks` (of a group of `world_size` whose other
    ranks may run on other nodes, meeting at `port` of rank 0's address, which `args` carry where the module
    takes one) and return the last line rank 0 printed ('' where rank 0 runs elsewhere)."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", module, str(r), str(world_size), str(port), *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in ranks]
    try:
        outs = [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    first = list(ranks).index(0) if 0 in ranks else None
    failed = any(p.returncode != 0 for p in procs) or (first is not None and not outs[first][0].strip())
    if failed:
        err = "\n".join(o[1].strip()[-2000:] for o in outs if o[1].strip())
        raise RuntimeError(f"{what} failed (exit codes {[p.returncode for p in procs]}): {err}")
    return outs[first][0].strip().splitlines()[-1] if first is not None else ""


def benchmark_collectives(sizes: tuple[int, ...] = DEFAULT_SIZES, world_size: int = 2, reps: int = 5,
                          timeout_s: float = 120.0, backend: str = "gloo", ranks: list[int] | None = None,
                          addr: str = "127.0.0.1", port: int | None = None) -> list[CollectivePoint]:
    """Measure every op in OPS at every size over `world_size` single-threaded processes on `backend` (gloo on
    CPU tensors, nccl with one GPU each). All ranks run here by default; `ranks` runs only those, the rest of
    the group running on other nodes and meeting at `addr`:`port` (rank 0's). Rank 0's runner gets the points;
    a runner without rank 0 gets []."""
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2 to measure collectives, got {world_size}")
    ranks = list(range(world_size)) if ranks is None else ranks
    line = run_ranks("predictor.measure.collectives", ranks, world_size, port or free_port(),
                     [str(reps), ",".join(map(str, sizes)), backend, addr], f"{backend} collective benchmark", timeout_s)
    return [CollectivePoint(*row) for row in json.loads(line)] if line else []


def _coefficients(op: str, n: int, tree: bool = False) -> tuple[float, float]:
    """(latency steps, bandwidth factor) of `op` over n ranks in the α-β model of predictor.costs.comm.

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
    """The α (latency) and B (bus bandwidth) under which predictor.costs.comm's formulas best reproduce `points`.

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


def bus_bandwidth(point: CollectivePoint) -> float:
    """nccl-tests' bus bandwidth of a measured point, bytes/s: the bytes each rank's link carries over the time
    (all-reduce 2(n-1)/n of the buffer, all-gather and reduce-scatter (n-1)/n, send/recv the message), which is
    what `predictor.costs.collective_curve` prices a collective by."""
    n = point.world_size
    share = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n}.get(point.op, 1.0)
    return point.bytes * share / point.seconds


if __name__ == "__main__":
    _rank, _world, _port, _reps, _sizes, *_rest = sys.argv[1:]
    _worker(int(_rank), int(_world), int(_port), tuple(int(x) for x in _sizes.split(",")), int(_reps), *_rest)
