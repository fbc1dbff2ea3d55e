"""Peak memory of one `scaledl plan` split by process: the driver, each kind of Ray process, the replicas.

Runs the command of this checkout (`python -m orchestrator.cli plan SPEC ARGS`) and samples the resident memory of
every process in its tree every 0.1 s, grouped by kind (the driver; Ray workers by their `ray::` title, which names
the actor and the method it runs; Ray's daemons by program). Prints the tree's peak, what each kind held at that
moment, and each kind's own peak. Where the tree's memory goes decides what can cut it: an embedded Ray's daemons
and idle workers are there whatever ScaleDL does.

    .venv/bin/python -m bench.plan_rss [SPEC] [-- scaledl plan options, e.g. --space full]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

from bench import common
from bench.common import ROOT

_DAEMONS = ("gcs_server", "raylet", "dashboard/agent", "dashboard.py", "log_monitor", "monitor.py", "runtime_env")


def kind(process: psutil.Process) -> str:
    """What a process of the tree is: driver, a Ray worker's title, a Ray daemon, or its program."""
    try:
        cmd = process.cmdline()
    except psutil.Error:
        return "gone"
    text = " ".join(cmd)
    if "orchestrator.cli" in text:
        return "driver"
    if cmd and cmd[0].startswith("ray::"):
        return cmd[0].split()[0]
    return next((name for name in _DAEMONS if name in text), Path(cmd[0]).name if cmd else process.name())


def sample(spec: str, options: list[str]) -> tuple[float, int, dict[str, int], Counter[str]]:
    """(wall seconds, the tree's peak bytes, bytes per kind at that peak, each kind's own peak bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "orchestrator.cli", "plan", spec, *options, "--out", f"{tmp}/out"]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        root = psutil.Process(proc.pid)
        peak, at_peak, own = 0, {}, Counter()
        while proc.poll() is None:
            now: Counter[str] = Counter()
            for p in [root, *root.children(recursive=True)]:
                try:
                    now[kind(p)] += p.memory_info().rss
                except psutil.Error:
                    pass
            if sum(now.values()) > peak:
                peak, at_peak = sum(now.values()), dict(now)
            own |= now  # each kind's own peak
            time.sleep(0.1)
        if proc.returncode:
            raise SystemExit(f"scaledl plan failed ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        return time.perf_counter() - start, peak, at_peak, own


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("spec", nargs="?", default="examples/gpt3-175b-a100x1024.yaml")
    parser.add_argument("options", nargs="*", help="scaledl plan options (after --)")
    args = parser.parse_args()
    wall, peak, at_peak, own = sample(str(Path(args.spec).resolve()), args.options)
    print(f"wall {wall:.1f} s, peak RSS of the tree {peak / 2**20:.0f} MB")
    print(f"{'process (all of a kind)':32} {'at the peak MB':>14} {'own peak MB':>12}")
    for name, size in own.most_common():
        print(f"{name:32} {at_peak.get(name, 0) / 2**20:14.0f} {size / 2**20:12.0f}")


if __name__ == "__main__":
    main()
