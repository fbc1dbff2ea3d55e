"""Overlap as a mechanism (`predictor.models.overlap`), over every example's search space: no plan hides more
communication than the computation beside it, no iteration is shorter than any one kind of its communication, and no
plan on an A100 is predicted above the best model FLOPs utilisation published for one (issue 43). Each is what the
mechanisms give, never a clamp: the default suite checks a sample of each example's `full` space, `-m slow` all of it.
"""

from pathlib import Path

import numpy as np
import pytest

from predictor.costs.prediction import TIME_PARTS
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.overlap import slowdown
from predictor.plan import HIDDEN_KINDS, Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import WorkloadSpec, load_spec
from search_spaces import load_space
from search_spaces.enumerate import enumerate_plans, sample_plans

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.yaml"))
# Plans sampled from each example's full space (the largest hold millions; a sample covers every prototype alike).
SAMPLE = 3000
CHUNK = 8192  # plans per prediction call, as a search's replica receives them
# Each hidden kind and the part of the breakdown its exposed rest lands in.
EXPOSED_IN = {"tp_comm": "tp_comm", "cp_comm": "cp_comm", "ep_comm": "ep_comm", "etp_comm": "etp_comm",
              "dp_grad": "dp_comm", "dp_param": "dp_comm", "pp_p2p": "pp_p2p"}
# The most model FLOPs utilisation a plan may be predicted at, per device generation: Megatron-LM's best published
# A100 runs reached 52-56 % (Korthikanti et al. 2022, selective recomputation, 530B and 1T); issue 43 sets 60 %.
MFU_CEILING = {"ampere": 0.60}


def violations(spec: WorkloadSpec, plans: list[Plan]) -> dict[str, list[str]]:
    """Per bound ("overlap": hidden beyond the computation or an iteration shorter than a kind's communication; "mfu":
    above the generation's ceiling), every plan of `plans` that breaks it, named with its figures."""
    resolved = resolve(spec)
    ceiling = MFU_CEILING.get(resolved.generation, 1.0)
    graph, model, out = graph_for(spec.model), AnalyticalPredictor(), {"overlap": [], "mfu": []}
    assert set(EXPOSED_IN) == set(HIDDEN_KINDS)
    for start in range(0, len(plans), CHUNK):
        chunk = plans[start:start + CHUNK]
        table = model.predict_table(spec, graph, chunk)
        parts = dict(zip(TIME_PARTS, table.breakdown.T))
        hidden = table.hidden.sum(axis=1)
        computation = parts["compute"] - slowdown(resolved.device) * hidden  # before the SMs lost to communication
        for i in np.flatnonzero(hidden > computation * (1 + 1e-9)):
            out["overlap"].append(f"{chunk[i]}: hides {hidden[i]:.3f} s beside {computation[i]:.3f} s of computation")
        for part in set(EXPOSED_IN.values()):  # the busiest link: every kind's whole communication fits the iteration
            whole = parts[part] + sum(table.hidden[:, HIDDEN_KINDS.index(k)] for k, p in EXPOSED_IN.items() if p == part)
            for i in np.flatnonzero(table.iter_time_s < whole * (1 - 1e-9)):
                out["overlap"].append(f"{chunk[i]}: {table.iter_time_s[i]:.3f} s, shorter than its {part} {whole[i]:.3f} s")
        for i in np.argsort(-table.mfu)[:int(np.sum(table.mfu > ceiling))]:
            out["mfu"].append(f"{chunk[i]}: MFU {100 * table.mfu[i]:.1f} % on {resolved.device.name}")
    return out


def report(found: list[str], plans: int) -> str:
    return f"{len(found)} of {plans} plans break the bound, e.g.\n" + "\n".join(found[:10])


def sampled(path: Path) -> tuple[WorkloadSpec, list[Plan]]:
    spec = load_spec(path)
    plans = list(sample_plans(spec, load_space("full"), SAMPLE, seed=1).plans)
    assert plans, path
    return spec, plans


def every(path: Path) -> tuple[WorkloadSpec, list[Plan]]:
    spec = load_spec(path)
    return spec, list(enumerate_plans(spec, load_space("full")).plans)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_no_sampled_plan_hides_more_than_its_computation_or_beats_its_busiest_link(path):
    spec, plans = sampled(path)
    found = violations(spec, plans)["overlap"]
    assert not found, report(found, len(plans))


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_no_plan_of_a_full_space_hides_more_than_its_computation_or_beats_its_busiest_link(path):
    spec, plans = every(path)
    found = violations(spec, plans)["overlap"]
    assert not found, report(found, len(plans))


# The examples whose full space the mechanisms still predict above the ceiling (strict: a pass fails, to be removed).
ABOVE_CEILING = {"gpt3-175b-a100x1024": "GPT-3 175B on A100 reaches 71.8 % (dp=256,tp=4,mbs=6,zero=2: one micro-batch, "
                                        "every collective hidden) and 67.1 % among plans that fit (docs/modeling.md, "
                                        "Overlap): its GEMMs run at 0.71-0.75 of peak, as vTrain's 175B A100 runs "
                                        "allow (predicted 7.6 % slow)"}
A100_EXAMPLES = [pytest.param(p, id=p.stem, marks=[pytest.mark.xfail(strict=True, reason=ABOVE_CEILING[p.stem])]
                              if p.stem in ABOVE_CEILING else []) for p in EXAMPLES
                 if resolve(load_spec(p)).generation in MFU_CEILING]


@pytest.mark.parametrize("path", A100_EXAMPLES)
def test_no_sampled_plan_on_an_a100_beats_the_best_published_mfu(path):
    spec, plans = sampled(path)
    found = violations(spec, plans)["mfu"]
    assert not found, report(found, len(plans))


@pytest.mark.slow
@pytest.mark.parametrize("path", A100_EXAMPLES)
def test_no_plan_of_a_full_space_on_an_a100_beats_the_best_published_mfu(path):
    spec, plans = every(path)
    found = violations(spec, plans)["mfu"]
    assert not found, report(found, len(plans))
