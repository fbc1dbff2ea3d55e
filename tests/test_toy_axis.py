"""An axis added in one place: its registry entry and its cost function and rules (registered onto it), in a module
outside ScaleDL named by SCALEDL_AXES, and a framework that declares it with its launch flag (a framework that does not declare it refuses it),
run in a fresh interpreter so that no other test sees them; beside it, an axis that splits a dimension the pricing
already knows (`Axis.splits`), which needs its registry entry alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

TOY = '''
from predictor.plan.axes import Axis, HiddenKind, TimePart, axis_function


@axis_function("xp", "rules")
def xp_rules(plan, spec):
    """A toy rule: xp must be a power of two."""
    return [] if plan.xp & (plan.xp - 1) == 0 else [f"xp={plan.xp} is not a power of two"]


@axis_function("xp", "stage_cost")
def xp_stage_time(resolved, lay, cfg):
    """A millisecond per node of each stage per extra xp rank."""
    return lay.stage_counts.sum(axis=1) * 1e-3 * (lay.plan.xp - 1)


AXIS = Axis("xp", "toy parallel", "nothing", "one exchange per layer", "nothing", order=2, multiplies_gpus=False,
            explain="xp={degree} spends {share:.0f} % of the time in its toy exchange",
            parts=(TimePart("xp_comm", "toy exchange", "tp_comm"),), hidden=(HiddenKind("xp_comm", "toy exchange", "xp"),),
            overlap=("xp",), stage_cost=True, space_default=(2,), options={"xp_route": ("direct", "relay")})

# A toy axis that splits a dimension the pricing already knows (the sequence, as context parallelism does) and has
# no mechanism of its own: the pricing core shards by what is split, so the registry entry is all it takes.
SEQUENCE = Axis("sq", "toy sequence parallel", "the sequence", "none", "activations divided by sq", order=2,
                multiplies_gpus=False, explain="sq={degree} ({share:.0f} % of the time)", splits=("sequence",),
                space_default=(1,))
'''

# A framework running the toy axis: Megatron-Core's, declaring xp with its flag, and its registry line.
TOY_FRAMEWORK = '''
from dataclasses import replace

from predictor.frameworks import FRAMEWORKS, MEGATRON

TOY = replace(MEGATRON, name="toyframe", title="Toyframe", axes={**MEGATRON.axes, "xp": "--toy-parallel-size"},
              launch=None)
FRAMEWORKS[TOY.name] = TOY
'''

CHECK = '''
import json
import toy_framework
from orchestrator.report.explain import explain
from orchestrator.search.types import SearchResult
from predictor.frameworks import FRAMEWORKS
from predictor.frameworks.base import degree_args
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import HIDDEN_KINDS, OVERLAP_KINDS, TIME_PARTS, Plan, plan_errors
from predictor.plan.share import RankShare
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec
from search_spaces import enumerate_plans, resolve_space

spec = parse_spec({"model": {"family": "gpt", "hidden": 1024, "layers": 8, "heads": 16, "seq_len": 1024,
                             "vocab": 32000},
                   "training": {"global_batch": 32, "precision": "bf16", "framework": "toyframe"},
                   "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}})
toy, plain, split = Plan.parse("dp=8,xp=2"), Plan.parse("dp=8"), Plan.parse("dp=8,sq=2")
table = AnalyticalPredictor().predict_table(spec, graph_for(spec.model), [toy, plain, split])
_, space = resolve_space(spec)
plans = enumerate_plans(spec, space).plans
found = SearchResult(plans, AnalyticalPredictor().predict_table(spec, graph_for(spec.model), plans), 80.0, 80.0)
print(json.dumps({
    "toy": str(toy), "plain": str(plain), "gpus": toy.gpus, "errors": plan_errors(toy, spec),
    "ruled": plan_errors(Plan.parse("dp=8,xp=3"), spec),
    "framework": toy_framework.TOY.errors(toy, spec),
    "megatron": FRAMEWORKS["megatron"].errors(toy, spec),
    "parts": TIME_PARTS, "hidden": HIDDEN_KINDS, "overlap": OVERLAP_KINDS,
    "degrees": sorted({p.xp for p in plans}), "routes": sorted({p.xp_route for p in plans}),
    "routed": str(Plan.parse("dp=8,xp=2,xp_route=relay")), "space_routes": space.xp_route,
    "explained": explain(found, found.table.iter_time_s.argsort(), resolve(spec), 80.0),
    "priced": [table.row(i).breakdown["xp_comm"] for i in (0, 1)],
    "times": [table.row(i).iter_time_s for i in (0, 1)],
    "args": degree_args(toy, toy_framework.TOY.axes),
    "sequence": RankShare.of(split).sequence,
    "split": [[float(table.extra["kernel_compute_s"][i]), table.row(i).memory_breakdown["activations"]]
              for i in (1, 2)],
}))
'''


def test_toy_axis_is_enumerated_priced_explained_and_written(tmp_path: Path) -> None:
    (tmp_path / "toy_axis.py").write_text(textwrap.dedent(TOY))
    (tmp_path / "toy_framework.py").write_text(textwrap.dedent(TOY_FRAMEWORK))
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "SCALEDL_AXES": "toy_axis:AXIS,toy_axis:SEQUENCE",
           "PYTHONPATH": os.pathsep.join([str(root), str(tmp_path)])}
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, cwd=root,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    # a Plan field of its own, written after every older field, leaving older plans' strings as they were
    assert got["toy"].endswith(",xp=2") and got["gpus"] == 8 and got["errors"] == []  # it regroups the 8 ranks
    assert got["ruled"] == ["xp=3 is not a power of two"]  # its own rules, applied by plan_errors
    assert got["framework"] == []  # the framework declaring it runs it
    assert "Megatron-Core has no toy parallelism (xp=2)" in got["megatron"][0]  # one that does not refuses it
    assert got["plain"] == "dp=8,tp=1,pp=1,mbs=1,zero=0,recompute=none,sp=false,schedule=1f1b,v=1,placement=tp-dp-pp"
    assert "xp_comm" in got["parts"] and "xp_comm" in got["hidden"] and "xp" in got["overlap"]
    assert got["degrees"] == [2]  # every enumerated plan takes the search space's default for it
    # its option is a plan field after it and a search-space field, declared once in its entry
    assert got["routed"].endswith(",xp=2,xp_route=relay") and got["space_routes"] == ["direct"] == got["routes"]
    assert "xp=2 spends" in got["explained"] and "toy exchange" in got["explained"]
    toy_s, plain_s = got["priced"]
    assert toy_s > 0 and plain_s == 0.0  # its cost function priced it, exposed (the framework overlaps no xp)
    assert got["times"][0] > got["times"][1]
    assert got["args"][-2:] == ["--toy-parallel-size", "2"]
    # the axis that splits the sequence: a rank holds half of it, its kernels compute and it keeps about half
    assert got["sequence"] == 2
    (plain_compute, plain_acts), (split_compute, split_acts) = got["split"]
    # (its GEMMs, on half the rows, run at a lower rate)
    assert 0.5 <= split_compute / plain_compute < 0.9 and 0.4 < split_acts / plain_acts < 0.6
