"""Sound pruning of dominated plans: a plan whose field holds a value its predictor never prices faster nor in less
memory than another value (`Predictor.dominated`) is left out of the enumeration when that twin is valid, counted in
`Enumeration.pruned` with why, and the best plan that fits is the same as with every plan predicted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.registry import checkpoint_path, dominated_values
from predictor.spec.workload import load_spec
from search_spaces import candidate_count, enumerate_plans, load_space, narrow

ROOT = Path(__file__).resolve().parents[1]
GPT3 = load_spec(ROOT / "examples/gpt3-175b-a100x1024.yaml")
LLAMA = load_spec(ROOT / "examples/llama3-70b-torchtitan-h100x64.yaml")  # torchtitan runs gpipe
RULES = AnalyticalPredictor.dominated


def _twin_valid(plan, valid: set, rule) -> bool:
    return getattr(plan, rule.field) == rule.value and plan.with_(**{rule.field: rule.by}) in valid


# GPT-3's full space cut to ~46,000 plans: overlap=none pruned; Llama 3 70B's under torchtitan: gpipe pruned.
SPACES = [(GPT3, {"mbs": [1], "max_pp": 16, "zero": [0, 1], "placement": ["tp-dp-pp", "dp-tp-pp"]}),
          (LLAMA, {"mbs": [1, 2]})]


@pytest.mark.parametrize("spec, section", SPACES, ids=["gpt3", "llama-torchtitan"])
def test_enumeration_leaves_out_exactly_the_plans_with_a_valid_better_twin(spec, section) -> None:
    space = narrow(load_space("full"), section)
    every = enumerate_plans(spec, space)
    valid = set(every.plans)
    pruned = enumerate_plans(spec, space, RULES)
    left_out = {p for p in every.plans if any(_twin_valid(p, valid, r) for r in RULES)}
    assert left_out and pruned.plans == [p for p in every.plans if p not in left_out]
    assert sum(pruned.pruned.values()) - sum(every.pruned.values()) == len(left_out)
    assert pruned.checked == every.checked - len(left_out) and pruned.rejected == every.rejected
    assert candidate_count(spec, space) == every.checked  # counted before enumerating, the dominated plans included
    assert all("never faster nor smaller" in r for r in set(pruned.pruned) - set(every.pruned))


@pytest.mark.parametrize("spec, section", SPACES, ids=["gpt3", "llama-torchtitan"])
def test_the_best_plan_that_fits_is_the_same_as_predicting_every_plan(spec, section) -> None:
    space = narrow(load_space("full"), section)
    model, graph = AnalyticalPredictor(), graph_for(spec.model)
    every = enumerate_plans(spec, space).plans
    table = model.predict_table(spec, graph, every)
    kept = enumerate_plans(spec, space, RULES).plans
    kept_table = model.predict_table(spec, graph, kept)
    index = {p: i for i, p in enumerate(every)}
    for plan in set(every) - set(kept):  # each left out plan is no faster and no smaller than its twin
        rule = next(r for r in RULES if getattr(plan, r.field) == r.value)
        twin = index[plan.with_(**{rule.field: rule.by})]
        assert table.iter_time_s[index[plan]] >= table.iter_time_s[twin]
        assert table.peak_memory_gib[index[plan]] >= table.peak_memory_gib[twin]
    for limit in np.quantile(table.peak_memory_gib, [0.05, 0.3, 0.7]):
        def best(t, plans):
            ok = np.flatnonzero(t.peak_memory_gib <= limit)
            fastest = ok[t.iter_time_s[ok] == t.iter_time_s[ok].min()]
            return min((t.peak_memory_gib[i], str(plans[i])) for i in fastest)[1]
        assert best(table, every) == best(kept_table, kept)


def test_only_the_analytical_model_declares_dominated_values() -> None:
    assert dominated_values("analytical", "a100-80gb") == RULES
    assert dominated_values("auto", "a100-80gb") == RULES  # no ScaleDL checkpoint for it: analytical
    assert checkpoint_path("cpu").is_file() and dominated_values("auto", "cpu") == ()  # a learned model's: none
    assert dominated_values(str(checkpoint_path("cpu")), "cpu") == ()
