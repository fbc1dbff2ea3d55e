"""How long building a layer graph takes, and how much memory, for the big presets.

Each preset is built in a fresh process: `import` is the package start-up (torch, transformers,
predictor), `build` is `predictor.graph.build.build_graph` itself (it includes the lazy import of the
family's transformers modeling module the first time; wall and CPU seconds: on a machine shared
with other jobs the CPU time is the fair figure), `peak RSS` is the process's maximum
resident memory (resource.getrusage). Usage: python -m bench.graph_build [preset ...]
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench import common
from bench.common import ROOT

DEFAULT = ["gpt3-175b", "llama2-70b", "llama3-70b", "t5-11b", "gpt2-xl", "bert-large", "vit-h14"]

_CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
import torch, transformers
import predictor.graph.build
from predictor.graph.build import build_graph
from predictor.spec.workload import ModelSpec
t1, c1 = time.perf_counter(), time.process_time()
g = build_graph(ModelSpec(preset=sys.argv[1]))
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"import_s": t1 - t0, "build_s": t2 - t1, "build_cpu_s": c2 - c1, "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "nodes": len(g.nodes), "blocks": g.num_blocks, "params": g.params, "fwd_tflop": g.fwd_flops / 1e12}))
"""


def main() -> int:
    parser = common.parser(__doc__)
    parser.add_argument("presets", nargs="*", default=DEFAULT, help=f"presets to build (default: {' '.join(DEFAULT)})")
    presets = parser.parse_args().presets
    print(f"{'preset':<12} {'import s':>9} {'build s':>8} {'build CPU s':>12} {'peak RSS GiB':>13} {'nodes':>6} {'blocks':>7} "
          f"{'params':>14} {'fwd TFLOP/sample':>17}")
    failed = 0
    for preset in presets:
        proc = subprocess.run([sys.executable, "-c", _CHILD, preset], cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            failed += 1
            print(f"{preset:<12} FAILED: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{preset:<12} {r['import_s']:>9.2f} {r['build_s']:>8.2f} {r['build_cpu_s']:>12.2f} {r['rss_gib']:>13.2f} {r['nodes']:>6} "
              f"{r['blocks']:>7} {r['params']:>14,} {r['fwd_tflop']:>17.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
