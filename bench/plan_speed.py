"""Speed of `scaledl plan` end to end, and whether its answer matches exhaustive enumeration.

Runs the real command in a subprocess (Python start, imports, embedded Ray start unless the search is priced in
the driver, graph, replicas, search, report files), sampling the memory of its whole process tree, then predicts
every valid plan of the same space in this process without Ray and checks that the top plan is
the same. Prints one table row per run and the median wall time. `--before DIR` also times the
checkout in DIR (e.g. a `git worktree` of the previous commit), its runs alternating with this one's,
so a before/after comparison sees the same machine and load.

    .venv/bin/python -m bench.plan_speed [SPEC] [--space NAME] [--nodes LIST] [--runs N] [--predictor NAME] [--before DIR]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench import common
from bench.common import ROOT


def _sample(proc: psutil.Process, cpu: dict[int, float]) -> int:
    """RSS of the process tree now; records each process's CPU seconds so far into `cpu`."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
            t = p.cpu_times()
            cpu[p.pid] = max(cpu.get(p.pid, 0.0), t.user + t.system)
        except psutil.Error:
            pass
    return total


def run_once(spec: str, space: str | None, nodes: str | None, predictor: str, out: Path, root: Path = ROOT) -> dict:
    """One `scaledl plan` of the code in `root` (run as `python -m orchestrator.cli` there: the console script
    runs whichever checkout is installed)."""
    cmd = [sys.executable, "-m", "orchestrator.cli", "plan", str(Path(spec).resolve()), "--out", str(out),
           "--predictor", predictor]
    if space:
        cmd += ["--space", space]
    if nodes:
        cmd += ["--nodes", nodes]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ps, peak, cpu = psutil.Process(proc.pid), 0, {}
    while proc.poll() is None:
        peak = max(peak, _sample(ps, cpu))
        time.sleep(0.1)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"scaledl plan failed ({proc.returncode}): {proc.stderr.read()[-2000:]}")
    report = json.loads((out / "report.json").read_text())
    if (out / "timings.json").exists():  # with the report's and the shutdown's (a checkout before it wrote none)
        report["search"]["timings"] = json.loads((out / "timings.json").read_text())
    # CPU seconds of the whole tree (sampled every 0.1 s, so the last tenth of a second is missed): on a
    # shared machine this, not the wall time, says what the command costs; / 2 bounds an idle 2-core run.
    return {"wall_s": wall, "peak_rss_gib": peak / 2**30, "cpu_s": sum(cpu.values()), "report": report}


def exhaustive_best(spec_path: str, space_name: str | None, nodes: str | None, predictor: str,
                    limit_gib: float) -> tuple[str, int, float]:
    """(best plan, plans, seconds) predicting every valid plan of every cluster size here, one table per size,
    without Ray or Tune, with the memory-lever variants `scaledl plan` adds (`orchestrator.search.levers`)."""
    import numpy as np

    from orchestrator.commands.plan import parse_nodes
    from orchestrator.planning import sized_spec
    from orchestrator.search.levers import Repredictor, explore_levers
    from orchestrator.search.replica import join_tables
    from orchestrator.search.types import SearchResult
    from predictor.graph.cache import graph_for
    from predictor.models.registry import load_predictor
    from predictor.spec.workload import load_spec
    from search_spaces import enumerate_plans, resolve_space

    spec = load_spec(spec_path)
    space = resolve_space(spec, space_name)[1]
    model, _ = load_predictor(predictor, spec.cluster.device)
    graph = graph_for(spec.model)
    plans, tables, seconds = [], [], 0.0
    sizes = [sized_spec(spec, size) for size in (parse_nodes(nodes) if nodes else [spec.cluster.nodes])]
    for sized in sizes:
        valid = enumerate_plans(sized, space).plans
        start = time.perf_counter()
        tables.append(model.predict_table(sized, graph, valid))
        seconds += time.perf_counter() - start
        plans += valid
    table = join_tables(tables)  # a size with no valid plan answers an empty table, which may lack the extra columns
    levered = explore_levers(SearchResult(plans, table, limit_gib, limit_gib), sizes, Repredictor(model, graph, sized_spec))
    table, plans = levered.table, levered.plans
    ok = np.flatnonzero(~(table.peak_memory_gib > limit_gib))
    if not len(ok):
        return "-", len(plans), seconds  # nothing fits: as the report's ranking shows it
    fastest = ok[table.iter_time_s[ok] == table.iter_time_s[ok].min()]  # ties: less memory, then the plan's text
    return min((table.peak_memory_gib[i], str(plans[i])) for i in fastest)[1], len(plans), seconds


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("spec", nargs="?", default="examples/gpt3-175b-a100x1024.yaml")
    parser.add_argument("--space")
    parser.add_argument("--nodes", help="cluster sizes searched together, as `scaledl plan --nodes` takes them")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--predictor", default="auto")
    parser.add_argument("--before", type=Path, metavar="DIR", help="also time the checkout in DIR, runs alternating")
    args = parser.parse_args()
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    print(f"{'run':>3} {'wall s':>7} {'cpu s':>6} {'ray+graph s':>11} {'search s':>8} {'plans':>7} {'plans/s':>8} "
          f"{'peak GiB':>8}  top plan")
    last = None
    roots = {"before": args.before.resolve(), "after": ROOT} if args.before else {"this": ROOT}
    walls: dict[str, list[float]] = {name: [] for name in roots}
    for i in range(args.runs):
        for name, root in roots.items():
            with tempfile.TemporaryDirectory() as tmp:
                r = run_once(args.spec, args.space, args.nodes, args.predictor, Path(tmp) / "out", root)
            walls[name].append(r["wall_s"])
            _print_run(f"{i + 1}{name[0] if args.before else ''}", r)
            last = r["report"]
    for name, times in walls.items():
        print(f"{name} ({roots[name]}): wall median {statistics.median(times):.2f} s of {len(times)} runs "
              f"({', '.join(f'{t:.2f}' for t in times)})")
    assert last is not None
    best, n, seconds = exhaustive_best(args.spec, args.space, args.nodes, args.predictor, last["device"]["memory_limit_gib"])
    same = (last["ranked"][0]["plan"] if last["ranked"] else "-") == best
    print(f"exhaustive in-process: {n} plans in {seconds:.2f} s ({n / seconds:.0f} plans/s, one predict_table call per cluster size, no Ray); "
          f"top plan {best}; scaledl plan agrees: {'yes' if same else 'NO'}")
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    sys.exit(0 if same else 1)


def _print_run(label: str, r: dict) -> None:
    """The run's table row and its phases."""
    s = r["report"]["search"]
    top = r["report"]["ranked"][0]["plan"] if r["report"]["ranked"] else "-"
    t = s["timings"]
    print(f"{label:>3} {r['wall_s']:>7.2f} {r['cpu_s']:>6.1f} {t.get('ray_init_s', 0) + t.get('graph_wait_s', t.get('graph_s', 0)):>11.2f} {s['search_s']:>8.2f} "
          f"{s['evaluated_plans']:>7} {s['plans_per_s']:>8.0f} {r['peak_rss_gib']:>8.2f}  {top}")
    # replicas_ready overlaps the search (Tune starts while the replicas load): not in the sum.
    sequential = sum(v for k, v in t.items() if k not in ("replicas_ready_s", "total_s") and not k.endswith("_own_s"))
    if "startup_s" in t:
        print(f"     split (s): {_split(t)}")
    print("     phases (s): " + ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in t.items())
          + f"; outside the phases (python start and imports before timings had them, exit) {r['wall_s'] - sequential:.2f}"
          + f"; search after the replicas were ready: {s['search_after_ready_s']:.2f} s = "
          f"{s['plans_per_s_after_ready']:.0f} plans/s; once the first trial ran: {s['running_s']:.2f} s = "
          f"{s['plans_per_s_running']:.0f} plans/s; trials predicting: {s['predict_s']:.2f} s = "
          f"{s['plans_per_s_predicting']:.0f} plans/s")


def _split(t: dict[str, float]) -> str:
    """Where a run's time went: imports, Ray's start and what ran beside it (none for a search priced in the
    driver, without Ray), prediction, report and shutdown."""
    if "ray_init_s" in t:
        start = (f"Ray start {t['ray_init_s']:.2f} (meanwhile graph {t['graph_own_s']:.2f}, enumeration "
                 f"{t['enumeration_own_s']:.2f}, report imports {t['report_imports_own_s']:.2f}), then waiting on graph + "
                 f"enumeration {t['enumerate_s'] + t['graph_wait_s']:.2f}")
    else:
        start = (f"no Ray (priced in the driver): enumeration {t['enumerate_s']:.2f}, graph {t['graph_s']:.2f}, "
                 f"report imports {t['report_imports_s']:.2f}")
    return (f"imports {t['startup_s']:.2f}, {start}, prediction (search) {t['search_s']:.2f}, report "
            f"{t['levers_s'] + t['wider_s'] + t['report_s']:.2f}, shutdown {t['shutdown_s']:.2f}")


if __name__ == "__main__":
    main()
