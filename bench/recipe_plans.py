"""Does the planner keep the plans production runs use? Every Megatron-Bridge 25.11 recipe, searched for real.

For each row of ../shared/ground_truth/megatron_bridge_2511.csv: the recipe's plan written with the levers its
recipe sets that a plan can say (recomputed modules, full recomputation of N layers, offloaded layers, BF16 moments and
gradients; `memory_eval.RECIPE_LEVERS`), predicted by the analytical model: does it fit its GPU (reserved + runtime within
the capacity less the search's headroom)? Then the search a user would run with the recipe's parallel degrees fixed
(`--space full` narrowed to the row's tp, pp, cp, ep, v and micro-batch; ZeRO stage, recomputation, schedule,
placement and overlap free) followed by the lever pass (`orchestrator.search.levers.explore_levers`): is its winner
predicted no slower than the recipe's plan? No Ray: the search's plans are predicted in this process, as its
replicas would.

    .venv/bin/python -m bench.recipe_plans > bench/results/recipe_plans.txt
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pandas as pd

from bench import common
from bench.memory_eval import BRIDGE, recipe_workload
from orchestrator.planning import sized_spec
from orchestrator.search.levers import Repredictor, explore_levers
from orchestrator.search.types import SearchResult
from predictor.graph.cache import graph_for
from predictor.memory.facts import HEADROOM
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.spec.hardware import GIB
from predictor.spec.resolver import get_device
from search_spaces import enumerate_plans
from search_spaces.space import load_space, narrow


def _search(spec, plan: Plan, predictor: Repredictor, limit_gib: float, capacity_gib: float) -> SearchResult:
    full = load_space("full")  # its cap on virtual stages (8) raised to the recipe's (Qwen3-235B: 12)
    full = full.model_copy(update={"max_v": max(full.max_v or 1, plan.v)})
    space = narrow(full, {"tp": [plan.tp], "pp": [plan.pp], "cp": [plan.cp], "ep": [plan.ep], "v": [plan.v],
                          "mbs": [plan.mbs]}, "full")
    plans = enumerate_plans(spec, space).plans
    result = SearchResult(plans, predictor.table(spec, plans), limit_gib, capacity_gib)
    return explore_levers(result, [spec], predictor)


def main() -> int:
    args = common.parser(__doc__, shared=True).parse_args()
    (path,) = common.ground_truth(args.shared, BRIDGE)
    t0 = time.perf_counter()
    print(f"## {BRIDGE}: recipe plans with their levers, and the search with the recipe's degrees fixed "
          f"(headroom {HEADROOM:.0%})")
    print(f"{'system':<10} {'model':<21} {'prec':<6} {'recipe plan (levers)':<58} {'GiB':>6} {'limit':>6} fits "
          f"{'recipe s':>8} {'winner s':>8} winner")
    fits = no_slower = total = 0
    for row in pd.read_csv(path, comment="#").to_dict("records"):
        built = recipe_workload(row)
        if built is None:
            continue
        spec, plan = built
        capacity = get_device(spec.cluster.device).mem_capacity / GIB
        limit = capacity * (1 - HEADROOM)
        predictor = Repredictor(AnalyticalPredictor(), graph_for(spec.model), sized_spec)
        mine = predictor.table(spec, [plan])
        result = _search(spec, plan, predictor, limit, capacity)
        t = np.where(result.infeasible, np.inf, result.table.iter_time_s)
        best = int(np.argmin(t)) if len(t) else -1
        winner_s = float(t[best]) if best >= 0 else np.inf
        recipe_s, peak = float(mine.iter_time_s[0]), float(mine.peak_memory_gib[0])
        total += 1
        fits += peak <= limit
        no_slower += winner_s <= recipe_s * (1 + 1e-9)
        extra = ",".join(f"{k}={getattr(plan, k)}" for k in ("recompute", "recompute_layers", "offload", "moments",
                                                                "grads") if getattr(plan, k) != getattr(Plan(), k)) or "-"
        short = f"dp={plan.dp},tp={plan.tp},pp={plan.pp},cp={plan.cp},v={plan.v},ep={plan.ep} ({extra})"
        winner = str(result.plans[best]) if best >= 0 else "none fits"
        print(f"{row['system']:<10} {row['model']:<21} {row['precision']:<6} {short:<58} {peak:>6.1f} {limit:>6.1f} "
              f"{'yes' if peak <= limit else 'NO ':<4} {recipe_s:>8.3f} {winner_s:>8.3f} {winner}")
    print(f"recipe plans predicted to fit with their plan-field levers: {fits}/{total}; search winner predicted no "
          f"slower than the recipe plan: {no_slower}/{total}")
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
