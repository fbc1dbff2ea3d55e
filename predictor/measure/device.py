"""This machine as a `Device`: single-thread matmul FLOP/s, memory bandwidth and gloo links, measured once.

One rank of a `cpu` cluster is one single-threaded process, so everything is measured with one
thread. Collectives are fitted to α-β links, one per op (gloo's ops differ 3-8x at equal sizes).
Besides these idle links, the costs inside a training step are measured
(`predictor.measure.contention`): what each collective call and p2p message adds beyond the link's
α-β time while ranks compute, and DTensor's cost per sharded linear (`Device.extra`). The result
is cached as JSON in `$SCALEDL_CACHE` (default `~/.cache/scaledl/`) with a fingerprint (CPU model,
core count, torch version, profile version); a different fingerprint re-measures. The whole
first-use measurement takes about 45 s. Measured beside other work, the peaks come out low and every
later prediction slow: the record keeps the load average it was measured at, and using a record
measured on a busy machine warns, naming the file to delete for a re-measurement.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch

from predictor.measure.collectives import CollectivePoint, benchmark_collectives, bus_bandwidth, fit_link, fit_op_links
from predictor.measure.contention import idle_seconds, measure_step_costs
from predictor.measure.machine import cpu_model_name
from predictor.spec.hardware import Device, Link
from predictor.spec.workload import SpecError

CACHE_FILE = "cpu_device.json"
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_MEMO: dict[str, Device] = {}
PROFILE_VERSION = "3"  # 2: with step costs, 3: their median of 3 runs; an older cache is re-measured
# Other runnable work per core, beside the measuring process itself, above which a measurement is called busy:
# its two gloo ranks and single-thread kernels then share cores with someone else's processes.
BUSY_LOAD_PER_CORE = 0.25


def cache_dir() -> Path:
    return Path(os.environ.get("SCALEDL_CACHE") or Path.home() / ".cache" / "scaledl")


def fingerprint() -> dict[str, str]:
    return {"cpu": cpu_model_name(), "cores": str(os.cpu_count()), "torch": torch.__version__,
            "profile": PROFILE_VERSION}


def _best_time(fn, budget_s: float, min_reps: int = 3) -> float:
    """Best wall time of `fn` over repetitions within `budget_s` (at least min_reps, after a warm-up)."""
    fn()
    best, start, reps = float("inf"), time.perf_counter(), 0
    while reps < min_reps or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return best


def measure_matmul_flops(precision: str, n: int = 512, budget_s: float = 0.5) -> float:
    """Single-thread dense matmul FLOP/s of an n×n×n product in `precision`."""
    a = torch.randn(n, n, dtype=_DTYPES[precision])
    b = torch.randn(n, n, dtype=_DTYPES[precision])
    return 2.0 * n**3 / _best_time(lambda: torch.mm(a, b), budget_s)


def measure_mem_bandwidth(mib: int = 64, budget_s: float = 0.5) -> float:
    """Single-thread copy bandwidth, bytes/s (read + write counted), on buffers larger than the caches."""
    src = torch.ones(mib * 1024**2 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2.0 * src.numel() * 4 / _best_time(lambda: dst.copy_(src), budget_s)


def measure_cpu() -> dict:
    """Measure this machine now; returns the JSON-able record stored in the cache."""
    load = os.getloadavg()[0]  # before our own ranks start: this process and whatever else runs
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        flops = {p: measure_matmul_flops(p) for p in _DTYPES}
        bandwidth = measure_mem_bandwidth()
    finally:
        torch.set_num_threads(threads)
    points = benchmark_collectives()
    link = fit_link(points, "gloo on this machine, 2 local processes, α-β fit")
    return {
        "fingerprint": fingerprint(),
        "peak_flops": flops,
        "mem_bandwidth": bandwidth,
        "link": {"bandwidth": link.bandwidth, "latency": link.latency},
        "collectives": [[p.op, p.bytes, p.world_size, p.seconds] for p in points],
        "step_costs": measure_step_costs(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": load,
    }


def busy_measurement(record: dict) -> str | None:
    """Why a measured record's figures may be low (the machine ran other work while it was measured), or None.
    Records from before the load was kept say nothing."""
    load, cores = record.get("load_average"), int(record["fingerprint"].get("cores") or 1)
    if load is None or load - 1 <= BUSY_LOAD_PER_CORE * cores:
        return None
    return f"1-minute load average {load:.1f} on {cores} cores when it was measured at {record['measured_at']}"


def measure_cuda(index: int = 0, n: int = 8192, reps: int = 10) -> dict:
    """Measure a CUDA GPU now: n³ matmul FLOP/s per precision (CUDA events, after warm-up) and copy bandwidth.

    fp32 is plain fp32 (TF32 off, PyTorch's default). Collectives need a second GPU and are
    left out (`link` is None): a one-GPU machine has no link to measure.
    """
    dev = torch.device("cuda", index)

    def seconds(fn) -> float:
        fn()
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    flops = {}
    for name, dtype in _DTYPES.items():
        a, b = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))
        flops[name] = 2.0 * n**3 / seconds(lambda: torch.mm(a, b))
        del a, b
    src = torch.ones(2**30 // 4, device=dev)
    dst = torch.empty_like(src)
    bandwidth = 2.0 * src.numel() * 4 / seconds(lambda: dst.copy_(src))
    props = torch.cuda.get_device_properties(dev)
    return {
        "fingerprint": {"gpu": props.name, "memory_bytes": str(props.total_memory), "torch": torch.__version__,
                        "cuda": str(torch.version.cuda)},
        "peak_flops": flops,
        "mem_bandwidth": bandwidth,
        "memory_capacity": props.total_memory,
        "link": None,
        "collectives": [],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _device_from(record: dict, where: str) -> Device:
    """The Device of a measured record: the α-β link fitted to all its collectives and each op's own
    (`op_links`, what the analytical model prices them with), and in `extra` what a collective call and
    a p2p message cost inside a step beyond their idle time, and DTensor's cost per sharded linear (none
    where the record predates step costs)."""
    source = f"gloo between 2 local processes {where}, α-β fit"
    points = [CollectivePoint(*row) for row in record.get("collectives", [])]
    link = fit_link(points, source) if points else Link(record["link"]["bandwidth"], record["link"]["latency"], source)
    op_links = fit_op_links(points, source) if points else {}
    extra = {}
    costs = record.get("step_costs")
    if costs:
        idle_all_reduce, idle_p2p = idle_seconds(link, op_links, costs["bytes"])
        extra = {"collective_call_s": max(0.0, costs["collective_s"] - idle_all_reduce),
                 "p2p_call_s": max(0.0, costs["p2p_s"] - idle_p2p),
                 "tp_linear_s": costs["tp_linear_s"]}
    capacity = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))  # a profile does not record it
    return Device("cpu", dict(record["peak_flops"]), float(record["mem_bandwidth"]), capacity, link, link,
                  f"measured {where} ({record['fingerprint']['cpu']}) at {record['measured_at']}", measured=True,
                  extra=extra, op_links=op_links, model=record["fingerprint"]["cpu"])


def _write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def _cpu_record(refresh: bool = False) -> dict:
    """This machine's profile record: the cached one when its fingerprint matches, else measured and cached."""
    path = cache_dir() / CACHE_FILE
    record = None
    if not refresh and path.exists():
        try:
            record = json.loads(path.read_text())
            if record.get("fingerprint") != fingerprint():
                record = None
        except (OSError, ValueError):
            record = None
    if record is None:
        record = measure_cpu()
        _write_atomic(path, record)
    return record


def measured_cpu(refresh: bool = False) -> Device:
    """The `cpu` Device: from the cache when its fingerprint matches this machine, else measured and cached."""
    path = cache_dir() / CACHE_FILE
    key = str(path)
    if refresh or key not in _MEMO:
        record = _cpu_record(refresh)
        busy = busy_measurement(record)
        if busy:
            warnings.warn(f"this machine's profile ({path}) was measured while other work ran ({busy}): its "
                          "FLOP/s and bandwidth may be low and every prediction slow; delete the file on an idle "
                          "machine to re-measure it (about 45 s)", stacklevel=2)
        _MEMO[key] = _device_from(record, "on this machine")
    return _MEMO[key]


def save_cpu_profile(path: str | Path) -> None:
    """Write the profile `measured_cpu` prices this machine with to `path` (a dataset's device.json), so
    the dataset's runs are priced as on this machine wherever they are read."""
    _write_atomic(Path(path), _cpu_record())


def profile_device(path: str | Path, base: Device | None = None) -> Device:
    """The Device of a measured profile file, whatever machine it was measured on: a spec that names it is priced as
    on that machine. A dataset's device.json (`scaledl profile`'s device record) or a kernel profile
    (`scaledl profile --kernels`): of a CPU, the measured `cpu` device; of GPUs, the catalogue's `base` with the
    cluster's measured links and launch and host costs (`kernel_profile_device`)."""
    key = f"profile:{path}:{base.name if base else 'cpu'}"
    if key not in _MEMO:
        path = Path(path).resolve()
        try:
            record = json.loads(path.read_text())
            if "gemm" in record:
                from predictor.kernels.profile import ProfileError, parse_profile

                try:
                    parse_profile(record, str(path))
                except ProfileError as err:
                    raise SpecError(f"cluster.device_profile: {err}") from None
                device = kernel_profile_device(record, base, f"in {path.name}")
            else:
                device = _device_from(record, f"in {path.name}")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise SpecError(f"cluster.device_profile {str(path)!r} is not a readable device profile "
                            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); point it at a "
                            f"device.json written by `scaledl profile`, shipped with a dataset, or a kernel profile "
                            f"written by `scaledl profile --kernels`") from None
        _MEMO[key] = device
    return _MEMO[key]


def _link_points(record: dict, link: str) -> list[CollectivePoint]:
    """A kernel profile's collective points over `link` back as seconds (bus bytes over bus bandwidth)."""
    from predictor.measure.kernel_profile import machine

    measured = machine(record)
    if not measured:  # published figures: their links are the catalogue's generations, priced by their curves
        return []
    ranks = measured["ranks_per_node"] if link == "intra_node" else len(measured["nodes"])
    points = []
    for op, rows in record.get("collectives", {}).get(link, {}).items():
        for nbytes, busbw in rows:
            share = bus_bandwidth(CollectivePoint(op, int(nbytes), ranks, 1.0)) / nbytes
            points.append(CollectivePoint(op, int(nbytes), ranks, nbytes * share / busbw))
    return points


def kernel_profile_device(record: dict, base: Device | None, where: str) -> Device:
    """A kernel profile as a Device. Of a CPU (`base` None): measured peaks (each precision's fastest GEMM), copy
    bandwidth and per-op gloo links inside the node, as `measured_cpu`. Of GPUs: the catalogue device `base` with
    its links replaced by the α-β fits of the measured collectives (inside a node, across nodes) and `extra`'s
    launch_s and host_op_s, which price the launches and host-bound steps in place of first principles."""
    from predictor.measure.kernel_profile import machine

    measured = machine(record)
    when = measured.get("at", "?")
    source = f"kernel profile {where} ({record['sources'].get('provenance', record['device'])})"
    intra, inter = _link_points(record, "intra_node"), _link_points(record, "inter_node")
    costs = {k: float(record[k]) for k in ("launch_s", "host_op_s") if k in record}
    if base is None:
        peaks = {p: max(row[-1] for row in v["points"]) for p, v in record["gemm"].items() if v.get("points")}
        bandwidth = max(row[-1] for row in record["memory_bound"]["points"])
        link = fit_link(intra, source) if intra else Link(float("inf"), 0.0, f"{source}: no collectives measured")
        capacity = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        hardware = measured["nodes"][0].get("cpu", "cpu") if measured else record["device"]
        return Device("cpu", peaks, bandwidth, capacity, link, fit_link(inter, source) if inter else link,
                      f"measured {where} ({hardware}) at {when}", measured=True,
                      op_links=fit_op_links(intra, source) if intra else {}, model=hardware)
    changes: dict = {"extra": {**base.extra, **costs}, "source": f"{base.source}; {source}"}
    if intra:
        changes["intra_node"] = fit_link(intra, f"{source}, inside a node")
    if inter:
        changes["inter_node"] = fit_link(inter, f"{source}, across nodes")
    return replace(base, **changes)
