"""The report: ranking, the explanation derived from breakdowns, files written, launch settings (no Ray needed)."""

from __future__ import annotations

import dataclasses

import base64
import json
import re

import numpy as np
import pytest

from orchestrator.planning import sized_spec
from orchestrator.report import build_report, write_report
from orchestrator.report.explain import explain
from orchestrator.report.plots import pareto_front
from orchestrator.report.ranking import front, rank
from orchestrator.report.render_json import to_json
from orchestrator.search.levers import Repredictor
from orchestrator.search.types import Evaluated, SearchResult, infeasibility
from predictor.frameworks.launch import launch_settings
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.spec.hardware import GIB
from predictor.spec.resolver import get_device
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec
from search_spaces import enumerate_plans, load_space
from tests.gpt_graph import gpt_graph

SPEC = parse_spec({"model": {"preset": "gpt3-1.3b"}, "training": {"global_batch": 64},
                   "cluster": {"device": "a100-40gb", "nodes": 2, "gpus_per_node": 8}})
GRAPH = gpt_graph(2048, 32, 2048, 24, 51200)
DEVICE = get_device("a100-40gb")
CAPACITY = DEVICE.mem_capacity / GIB


def evaluated(headroom: float) -> tuple[list[Evaluated], float]:
    plans = enumerate_plans(SPEC, load_space("megatron-3d")).plans
    limit = CAPACITY * (1 - headroom)
    preds = AnalyticalPredictor().predict(SPEC, GRAPH, plans)
    return [Evaluated(p, pr, infeasible=infeasibility(pr, limit, CAPACITY)) for p, pr in zip(plans, preds)], limit


def result_of(evs: list[Evaluated], limit: float, **stats) -> SearchResult:
    return SearchResult.of(evs, stats, limit, CAPACITY)


def report_for(headroom: float = 0.6, evs: list[Evaluated] | None = None, **kw):
    fresh, limit = evaluated(headroom)
    evs = fresh if evs is None else evs
    stats = {"memory_limit_gib": limit, "headroom": headroom, "searcher": "exhaustive", "evaluated_plans": len(evs),
             "trials": 3, "trials_failed": 0, "search_s": 1.0, "plans_per_s": len(evs)}
    space = load_space("megatron-3d")
    return build_report(resolved=resolve(SPEC), spec_path="spec.yaml", predictor={"name": "analytical", "accuracy": None},
                        space_name="megatron-3d", space=space, enumeration=enumerate_plans(SPEC, space),
                        result=result_of(evs, limit, **stats), **kw), evs


def test_ranking_is_by_time_and_never_includes_infeasible_plans() -> None:
    evs, limit = evaluated(0.6)
    result = result_of(evs, limit)
    ranked = rank(result)
    assert len(ranked) and not result.infeasible[ranked].any()
    assert [str(e.plan) for e in result.evaluated if e.feasible] == [str(result.plans[i]) for i in sorted(ranked)]
    times = result.table.iter_time_s[ranked]
    assert np.all(np.diff(times) >= 0)
    assert any(e.infeasible and e.prediction.iter_time_s < times[0] for e in evs)  # faster plans exist but don't fit
    with pytest.raises(ValueError, match="price-per-gpu-hour"):
        rank(result, "cost")


def test_ties_are_named_only_where_a_report_reads_their_order() -> None:
    evs, limit = evaluated(0.6)
    result = result_of(evs, limit)
    full, first = rank(result), rank(result, named=5)
    assert sorted(full) == sorted(first) and list(full[:5]) == list(first[:5])
    times = result.table.iter_time_s[first]
    assert np.all(np.diff(times) >= 0)  # still ranked; ties beyond the first 5 in the order searched


@pytest.mark.parametrize("by", ["time", "cost"])
def test_ranking_from_columns_orders_as_sorting_the_plans_would(by: str) -> None:
    """Ties (many plans share a time and a peak) break on memory, then on the plan's text, as sorting Python tuples
    does; the Pareto front from columns is `plots.pareto_front`'s."""
    evs, limit = evaluated(0.6)
    rng = np.random.default_rng(0)
    for e in evs:  # few distinct values: long runs of ties on both keys
        e.prediction.iter_time_s, e.prediction.peak_memory_gib = float(rng.integers(1, 4)), float(rng.integers(2) * 40)
        e.infeasible = infeasibility(e.prediction, limit, CAPACITY)
    result = result_of(evs, limit)
    key = (lambda e: e.prediction.iter_time_s) if by == "time" else (lambda e: e.prediction.iter_time_s * e.plan.gpus)
    expected = sorted((e for e in evs if e.feasible), key=lambda e: (key(e), e.prediction.peak_memory_gib, str(e.plan)))
    assert [str(result.plans[i]) for i in rank(result, by, price=1.0)] == [str(e.plan) for e in expected]
    x, y = rng.integers(5, size=300).astype(float), rng.integers(5, size=300).astype(float)
    assert front(x, y).tolist() == pareto_front(list(zip(x.tolist(), y.tolist())))


def test_explanation_is_derived_from_the_breakdowns() -> None:
    built, evs = report_for()
    report = to_json(built)
    text = report["explanation"]
    win, runner = report["ranked"][0], report["ranked"][1]
    assert text.startswith(win["plan"])
    assert f"{win['iter_time_s']:.2f} s per iteration" in text
    gap = runner["iter_time_s"] - win["iter_time_s"]
    assert f"it is {gap:.2f} s" in text  # the runner-up comparison uses the real gap
    faster = sum(1 for e in evs if e.infeasible and e.prediction.iter_time_s < win["iter_time_s"])
    assert f"{faster} plans would be faster but do not fit" in text
    # A different workload gives a different paragraph (nothing canned).
    other, _ = report_for(headroom=0.1)
    assert other.explanation != text


def test_report_files_follow_the_schema(tmp_path) -> None:
    report, _ = report_for(by="cost", price=2.0, top_k=5)
    written = write_report(report, tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    for key in ("schema", "spec", "device", "predictor", "ranking", "space", "search", "ranked", "infeasible",
                "explanation", "launch"):
        assert key in data
    top = data["ranked"][0]
    for field in ("iter_time_s", "breakdown", "peak_memory_gib", "memory_breakdown", "mfu", "tokens_per_s"):
        assert field in top
    assert top["cost_usd_per_iteration"] == pytest.approx(2.0 * 16 * top["iter_time_s"] / 3600)
    assert all(r["reason"].startswith("predicted peak memory") for r in data["infeasible"])
    html = (tmp_path / "report.html").read_text()
    images = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == 2 and all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    # Self-contained: plotly's library inlined once, nothing fetched (no external script, style, image or font).
    assert html.count("* plotly.js v") == 1 and html.count("Plotly.newPlot(") == 2
    assert not re.search(r"""<(script|link|img|iframe|source)\b[^>]*\b(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "<link" not in html and "@import" not in html
    assert 'id="filter"' in html and "id='plans'" in html and top["plan"] in html
    md = (tmp_path / "report.md").read_text()
    assert top["plan"] in md and "--tensor-model-parallel-size" in md
    assert "--global-batch-size 64" in (tmp_path / "launch" / "megatron_args.txt").read_text()
    assert all(p.exists() for p in written)


def test_launch_settings_follow_the_plan() -> None:
    plan = Plan(dp=2, tp=4, pp=2, mbs=2, zero=1, recompute="full", sp=True, schedule="interleaved", v=3)
    settings = launch_settings(plan, resolve(SPEC))  # the spec's framework: Megatron-Core (tests/test_launch.py: all three)
    assert settings["framework"] == "megatron" and not settings["notes"]
    args = settings["files"]["megatron_args.txt"]
    assert "--tensor-model-parallel-size 4" in args and "--num-virtual-stages-per-pipeline-rank 3" in args
    assert "--use-distributed-optimizer" in args and "--recompute-granularity full" in args
    assert "torchrun --nnodes 2 --nproc-per-node 8" in settings["files"]["torchrun.sh"]
    refused = launch_settings(plan.with_(zero=2, schedule="gpipe", v=1), resolve(SPEC))
    assert not refused["files"] and "GPipe" in refused["notes"][0] and "zero=2" in refused["notes"][0]


def test_pareto_front() -> None:
    points = [(1, 5), (2, 3), (3, 4), (4, 1), (2, 6)]
    assert pareto_front(points) == [0, 1, 3]


def test_validation_and_accuracy_appear_in_every_report_file(tmp_path) -> None:
    """A validated report shows the measured runs in report.md and report.html; a measured accuracy is stated."""
    from orchestrator.validation.jobs import ValidationResult

    report, _ = report_for(top_k=3)
    best = to_json(report)["ranked"][0]
    ok = ValidationResult(best["plan"], "ok", measured_time_s=1.25, predicted_time_s=1.0, peak_memory_gib=[2.0],
                          predicted_memory_gib=2.2)
    oom = ValidationResult(str(report.ranked[1].plan), "oom", detail="CUDA out of memory\nmore")
    report = dataclasses.replace(report, validation={"k": 2, "steps": 3, "warmup": 1, "note": "the measured winner differs",
                                                     "plans": [ok.to_dict(), oom.to_dict()]})
    report.predictor["accuracy"] = {"mape_pct": 11.2, "rows": 109, "source": "vtrain multi"}
    write_report(report, tmp_path)
    html, md = (tmp_path / "report.html").read_text(), (tmp_path / "report.md").read_text()
    for text in (html, md):
        assert "Measured by real runs" in text and "-20.0%" in text and "oom: CUDA out of memory" in text
        assert "measured error 11.2% over 109 runs of vtrain multi" in text
    report.predictor["accuracy"] = None
    write_report(report, tmp_path)
    assert "accuracy never measured" in (tmp_path / "report.md").read_text()


def test_a_winner_outside_the_predictors_training_data_carries_a_caution(tmp_path) -> None:
    report, evs = report_for()
    assert report.caution == ""
    evs[int(rank(result_of(evs, report.device.memory_limit_gib))[0])].prediction.extra["outside_training"] = [
        "vocab 51200 (trained 4096)"]
    flagged, _ = report_for(evs=evs)
    assert "never trained on a workload or plan like the best one (vocab 51200 (trained 4096))" in flagged.caution
    write_report(flagged, tmp_path)
    for name in ("report.md", "report.html"):
        assert "vocab 51200 (trained 4096)" in (tmp_path / name).read_text()
    assert json.loads((tmp_path / "report.json").read_text())["caution"] == flagged.caution


def test_explanation_names_context_parallelism_and_what_the_framework_hides() -> None:
    """A cp winner is explained in the cp axis's words, with the communication Megatron-Core overlaps."""
    spec = parse_spec({"model": {"preset": "llama3-8b", "seq_len": 32768},
                       "training": {"global_batch": 16, "framework": "megatron"},
                       "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}})
    plans = [Plan.parse("dp=4,cp=2,mbs=1,zero=1"), Plan.parse("dp=8,mbs=1,zero=1")]
    preds = AnalyticalPredictor().predict(spec, graph_for(spec.model), plans)
    result = SearchResult.of([Evaluated(p, pr) for p, pr in zip(plans, preds)], {}, 1e9, 1e9)
    text = explain(result, np.array([0]), resolve(spec), 1e9)
    assert "cp=2 splits every sequence over 2 ranks" in text and "over dp*cp = 8 ranks" in text
    assert "Megatron-Core hides" in text and "gradient reduction" in text


def test_plot_points_read_as_tuples_with_their_labels() -> None:
    """The plots get (x, y, label) points whose labels are formatted when read, as the eager tuples were, and the
    memory-time front found on the columns is the one `plots.pareto_front` finds on the points."""
    report, evs = report_for()
    fastest = min((e for e in evs if e.infeasible), key=lambda e: e.prediction.iter_time_s)
    x, y, label = report.points.infeasible[0]
    p = fastest.prediction
    assert (x, y) == (p.peak_memory_gib, p.iter_time_s)
    assert label == (f"{fastest.plan}<br>{fastest.plan.gpus} GPUs: {p.iter_time_s:.3f} s, {p.peak_memory_gib:.1f} GiB"
                     f"<br>{fastest.infeasible}")
    (name, points), = report.points.by_size.items()
    top = to_json(report)["ranked"][0]
    assert name == f"{top['nodes']} nodes" and tuple(points[0])[:2] == (top["iter_time_s"], top["iter_time_s"] * 16 / 3600)
    assert points[0][2].startswith(f"{top['plan']}<br>2 nodes (16 GPUs): {top['iter_time_s']:.3f} s/iteration")
    feasible = report.points.feasible
    assert [tuple(p) for p in report.points.front] == [tuple(feasible[i]) for i in pareto_front(feasible)]


def test_when_nothing_fits_the_closest_plans_come_with_re_predicted_levers(tmp_path) -> None:
    """A limit no plan meets: the plans overflowing it least are listed, each with the single changes that make
    it fit, their times predicted by the same predictor (not guessed)."""
    evs, _ = evaluated(0.6)
    least = min(e.prediction.peak_memory_gib for e in evs)
    limit = least * 0.97
    for e in evs:
        e.infeasible = infeasibility(e.prediction, limit, CAPACITY)
    stats = {"memory_limit_gib": limit, "headroom": 1 - limit / CAPACITY, "searcher": "exhaustive",
             "evaluated_plans": len(evs), "trials": 1, "trials_failed": 0, "search_s": 1.0, "plans_per_s": 1.0}
    space = load_space("megatron-3d")
    report = build_report(resolved=resolve(SPEC), spec_path="spec.yaml", predictor={"name": "analytical", "accuracy": None},
                          space_name="megatron-3d", space=space, enumeration=enumerate_plans(SPEC, space),
                          result=result_of(evs, limit, **stats),
                          repredictor=Repredictor(AnalyticalPredictor(), GRAPH, sized_spec))
    assert not report.fits and report.launch is None and report.closest
    overflow = [c.overflow_gib for c in report.closest]
    assert overflow == sorted(overflow) and overflow[0] == pytest.approx(least - limit)
    levers = [lv for c in report.closest for lv in c.levers]
    assert any(lv.fits for lv in levers)
    for lv in levers[:5]:
        (pred,) = AnalyticalPredictor().predict(sized_spec(SPEC, lv.gpus // 8), GRAPH, [lv.plan])
        assert (lv.iter_time_s, lv.peak_memory_gib, lv.fits) == (pred.iter_time_s, pred.peak_memory_gib,
                                                                  pred.peak_memory_gib <= limit)
    write_report(report, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "## Nothing fits: the plans closest to fitting" in md and "it fits with" in md
    assert json.loads((tmp_path / "report.json").read_text())["fits"] is False


def test_html_has_every_markdown_section_rendered(tmp_path) -> None:
    report, _ = report_for(top_k=5)
    write_report(report, tmp_path)
    md, page = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    titles = re.findall(r"^## (.+)$", md, re.M)
    assert "Fastest plans that do not fit" in titles and "Why candidates were rejected" in titles
    for title in titles:
        assert f"<h2>{title}</h2>" in page
    text = re.sub(r"<(script|style|pre)\b.*?</\1>", "", page, flags=re.S)
    assert "`" not in re.sub(r"<[^>]+>", "", text) and "<code>" in page


def test_the_terminal_table_fits_80_columns_without_cutting_plans() -> None:
    import io

    from rich.console import Console

    from orchestrator.report import print_report
    from orchestrator.report.text import compact

    report, _ = report_for(top_k=5)
    buf = io.StringIO()
    print_report(report, Console(file=buf, width=80))
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out
    for r in report.shown:
        assert compact(r.plan) in out


def test_validation_names_the_runs_outside_the_predictors_own_interval() -> None:
    """Each measured time is judged by the interval the report quotes for the spec's (framework, device); a run on
    ranks sharing cores is compared with the prediction for the run as it ran (x ranks per core)."""
    from orchestrator.validation.jobs import ValidationResult
    from orchestrator.validation.report_section import interval_note
    from predictor.models.intervals import Interval

    interval = Interval(0.8, -0.126, 0.126, 406, "held-out configurations of predictor/data/cpu")
    inside = ValidationResult("dp=2", "ok", measured_time_s=1.1, predicted_time_s=1.0)
    slow = ValidationResult("dp=1,tp=2", "ok", measured_time_s=1.3, predicted_time_s=1.0)
    shared = ValidationResult("dp=4", "ok", measured_time_s=2.1, predicted_time_s=1.0, core_sharing=2.0)
    assert interval_note([inside, shared], interval) == "" and interval_note([slow], None) == ""
    note = interval_note([inside, slow, shared], interval)
    assert note.startswith("1 of 3 measured times lie outside the predictor's 80% interval (-12.6% to +12.6%")
    assert note.endswith("dp=1,tp=2,pp=1 +30.0%") and "predictor/data/cpu" in note


def test_the_measured_winner_differs_only_beyond_the_steps_noise() -> None:
    from orchestrator.validation.jobs import ValidationResult
    from orchestrator.validation.report_section import winner_note

    def run(plan: str, predicted: float, measured: float, spread: float) -> ValidationResult:
        return ValidationResult(plan, "ok", measured_time_s=measured, measured_time_min_s=measured - spread,
                                measured_time_max_s=measured + spread, predicted_time_s=predicted)

    # 1.2 % apart with steps spread 2 %: noise, no note.
    assert winner_note([run("dp=2", 1.0, 1.012, 0.02), run("dp=1,tp=2", 1.1, 1.0, 0.02)]) == ""
    note = winner_note([run("dp=2", 1.0, 1.3, 0.01), run("dp=1,tp=2", 1.1, 1.0, 0.01)])
    assert note.startswith("measured winner differs from the predicted one: dp=1,tp=2 ran in 1 s")
