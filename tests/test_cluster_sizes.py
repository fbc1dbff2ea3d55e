"""Cluster size as a search dimension: plans of several sizes in one report, days and cost to train, the
deadline and budget filters, the time-cost Pareto front, `--nodes` parsing, and the prediction intervals with
the plans they cannot tell apart (no Ray needed)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from pydantic import ValidationError

from orchestrator.commands.plan import parse_nodes
from orchestrator.planning import sized_spec
from orchestrator.report import TrainingGoal
from orchestrator.report.render_json import to_json
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.intervals import Interval, residual_quantiles
from predictor.models.registry import measured_accuracy
from tests.gpt3_search import SPEC, TOKENS, sized_build


def sized_report(accuracy: dict | None = None, **kw) -> dict:
    """The report as report.json holds it."""
    return to_json(sized_build(accuracy, **kw))


def test_nodes_option_takes_a_list_or_the_powers_of_two_of_a_range() -> None:
    assert parse_nodes("32,64,128") == [32, 64, 128]
    assert parse_nodes("16-128") == [16, 32, 64, 128]
    assert parse_nodes("3-9") == [4, 8]
    with pytest.raises(argparse.ArgumentTypeError):
        parse_nodes("many")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_nodes("5-7")
    assert sized_spec(SPEC, 4).cluster.gpus == 32 and sized_spec(SPEC, 2) is SPEC
    with pytest.raises(ValidationError, match="less than or equal"):
        sized_spec(SPEC, 10**9)  # the spec's own limits hold at every size


def test_every_size_is_ranked_with_days_and_cost_to_train() -> None:
    report = sized_report(goal=TrainingGoal(train_tokens=TOKENS), by="cost")
    assert [z["nodes"] for z in report["sizes"]] == [1, 2, 4] and all(z["valid"] for z in report["sizes"])
    ranked = report["ranked"]
    assert {r["nodes"] for r in ranked} == {1, 2, 4}
    for r in ranked:
        assert r["gpus"] == 8 * r["nodes"] == r["fields"]["dp"] * r["fields"]["tp"] * r["fields"]["pp"] * r["fields"]["cp"]
        assert r["days_to_train"] == pytest.approx(TOKENS / r["tokens_per_s"] / 86400)
        assert r["cost_usd_to_train"] == pytest.approx(2.0 * r["gpus"] * r["days_to_train"] * 24)
    costs = [r["cost_usd_to_train"] for r in ranked]
    assert costs == sorted(costs)
    by_time = sized_report(goal=TrainingGoal(train_tokens=TOKENS), by="time")["ranked"]
    assert [r["days_to_train"] for r in by_time] == sorted(r["days_to_train"] for r in by_time)
    by_throughput = sized_report(by="throughput")["ranked"]
    per_gpu = [r["tokens_per_s_per_gpu"] for r in by_throughput]
    assert per_gpu == sorted(per_gpu, reverse=True) and by_throughput[0]["days_to_train"] is None


def test_pareto_front_holds_the_plans_nothing_beats_on_days_and_cost() -> None:
    report = sized_report(goal=TrainingGoal(train_tokens=TOKENS))
    front = report["pareto"]
    assert len(front) >= 2 and len({f["nodes"] for f in front}) >= 2  # the cheapest and the fastest differ in size
    days = [f["days_to_train"] for f in front]
    assert days == sorted(days) and [f["cost_usd_to_train"] for f in front] == sorted(
        (f["cost_usd_to_train"] for f in front), reverse=True)
    everyone = [(r["days_to_train"], r["cost_usd_to_train"]) for r in report["ranked"]]
    for f in front:
        assert not any(d < f["days_to_train"] and c < f["cost_usd_to_train"] for d, c in everyone)


def test_deadline_and_budget_filter_the_ranking() -> None:
    free = sized_report(goal=TrainingGoal(train_tokens=TOKENS))
    days = sorted(r["days_to_train"] for r in free["ranked"])
    deadline = days[len(days) // 2]
    report = sized_report(goal=TrainingGoal(train_tokens=TOKENS, deadline_days=deadline))
    assert report["ranked"] and all(r["days_to_train"] <= deadline for r in report["ranked"])
    assert report["over_goal_total"] > 0 and report["ranked_total"] + report["over_goal_total"] == free["ranked_total"]
    budget = min(r["cost_usd_to_train"] for r in free["ranked"]) * 1.01
    cheap = sized_report(goal=TrainingGoal(train_tokens=TOKENS, budget_usd=budget))
    assert cheap["ranked"] and all(r["cost_usd_to_train"] <= budget for r in cheap["ranked"])
    assert sized_report(goal=TrainingGoal(train_tokens=TOKENS, deadline_days=1e-9))["ranked"] == []


def test_residual_quantiles_hold_the_stated_share_of_runs() -> None:
    rng = np.random.default_rng(0)
    predicted = rng.uniform(1, 10, 1000)
    measured = predicted * (1 + rng.normal(0.05, 0.1, 1000))
    q = residual_quantiles(measured, predicted)
    inside = (measured >= predicted * (1 + q["low"])) & (measured <= predicted * (1 + q["high"]))
    assert q["coverage"] == 0.8 and inside.mean() == pytest.approx(0.8, abs=0.01)
    assert q["low"] < 0.05 < q["high"]
    # A record with a MAPE only: a normal error of that mean absolute size, said so.
    fallback = Interval.of({"mape_pct": 10.0, "rows": 50, "source": "runs"})
    assert fallback.high == pytest.approx(0.1606, abs=1e-3) == -fallback.low and "normal" in fallback.basis
    assert Interval.of(None) is None
    recorded = Interval.of(measured_accuracy(AnalyticalPredictor(), "a100-80gb", "deepspeed"))
    assert recorded.low < 0 < recorded.high and recorded.rows == 109
    assert recorded.contains(1.0, 1.0) and not recorded.contains(2.0, 1.0)
    # vTrain measured Megatron-DeepSpeed: a Megatron-Core plan on A100 gets a wider interval, said to be unmeasured.
    lent = Interval.of(measured_accuracy(AnalyticalPredictor(), "a100-80gb", "megatron"))
    assert lent.rows == 0 and "no megatron runs measured on a100-80gb" in lent.basis
    assert lent.high - lent.low > recorded.high - recorded.low


def test_each_plan_carries_an_interval_and_the_indistinguishable_ones_are_marked() -> None:
    accuracy = {"mape_pct": 9.6, "rows": 109, "source": "vTrain",
                "residual_quantiles": {"coverage": 0.8, "low": -0.07, "high": 0.24, "rows": 109}}
    report = sized_report(accuracy=accuracy, by="time")
    ranked = report["ranked"]
    best = ranked[0]
    for r in ranked:
        low, high = r["iter_time_interval_s"]
        assert low == pytest.approx(0.93 * r["iter_time_s"]) and high == pytest.approx(1.24 * r["iter_time_s"])
        assert r["indistinguishable_from_best"] == (r["rank"] > 1 and low <= best["iter_time_interval_s"][1])
    n = report["intervals"]["indistinguishable_total"]
    assert 0 < n < report["ranked_total"] - 1
    assert all(r["indistinguishable_from_best"] for r in ranked[1:n + 1])  # a prefix of the ranking
    assert f"The top {n + 1} plans cannot be told apart" in report["explanation"]
    assert sized_report()["ranked"][0]["iter_time_interval_s"] is None  # never measured: no interval
