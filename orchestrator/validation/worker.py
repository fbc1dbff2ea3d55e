"""The rank actor of a validation run: joins the run's process group and trains with the composed runner."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

import psutil
import ray


@ray.remote(max_concurrency=2)
class RankWorker:
    """One rank of a validation run; a second thread answers memory polls while it trains."""

    def __init__(self, memory_limit_bytes: int | None):
        self.limit = memory_limit_bytes
        self.peak = 0
        self.over = 0  # RSS reached when the limit was passed (0: not passed)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        """Track the RSS high-water mark; past the limit, flag it and end the process like the kernel OOM killer."""
        proc = psutil.Process()
        while True:  # until the process ends: the driver kills every rank actor after the run
            rss = proc.memory_info().rss
            self.peak = max(self.peak, rss)
            if self.limit is not None and rss > self.limit:
                self.over = rss
                time.sleep(2.0)  # long enough for the driver's next poll to see the flag
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.01)

    def where(self) -> tuple[str, str, int, str, int]:
        """(node id, node address, a free port on it) for the rendezvous, and (host name, cores this process may
        run on): Ray nodes on one machine (`ray.cluster_utils`) share its cores."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), port, socket.gethostname(),
                len(os.sched_getaffinity(0)))

    def memory(self) -> tuple[int, int]:
        return self.peak, self.over

    def run(self, job: dict[str, Any], rank: int, world_size: int, master_addr: str, master_port: int,
            threads: int) -> dict[str, Any]:
        """Join the run's process group and train with the measurement code's per-rank body."""
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        from predictor.measure.dist_worker import run_iteration

        torch.set_num_threads(threads)
        device = torch.device("cuda", 0) if torch.cuda.is_available() and job["device"] != "cpu" else torch.device("cpu")
        if world_size > 1:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size,
                                    init_method=f"tcp://{master_addr}:{master_port}",
                                    timeout=timedelta(seconds=job["timeout_s"]))
        # The actor is killed afterwards, so gloo's exit-time abort (ARCHITECTURE.md) never happens here.
        return run_iteration(job, rank, world_size, device)
