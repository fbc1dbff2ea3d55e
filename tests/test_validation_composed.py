"""Composed plans validated for real on a 2-node `ray.cluster_utils.Cluster`: dp x tp x pp of a tiny LLaMA
with sequence parallelism, the interleaved schedule, selective recomputation and ZeRO-1, measured time and
memory per rank next to the analytical prediction.

The two raylets declare 4 CPUs each but share this machine's cores, so the 8 ranks time-share them: the
result says so (`core_sharing`) and its time error compares with the prediction scaled by ranks per core.
"""

from __future__ import annotations

import pytest

from orchestrator.validation.jobs import ValidationResult, jobs_for
from orchestrator.validation.trials import validate
from predictor.graph.cache import graph_for
from predictor.models.registry import load_predictor
from predictor.plan import Plan
from predictor.spec.workload import WorkloadSpec, parse_spec


def llama(ranks: int, global_batch: int) -> WorkloadSpec:
    return parse_spec({"model": {"family": "llama", "hidden": 64, "layers": 4, "heads": 4, "kv_heads": 2,
                                 "ffn_hidden": 128, "seq_len": 32, "vocab": 256},
                       "training": {"global_batch": global_batch, "precision": "fp32"},
                       "cluster": {"device": "cpu", "nodes": 2, "gpus_per_node": ranks // 2}})


@pytest.fixture(scope="module")
def cpus_per_node() -> int:
    return 4  # a raylet holds half the ranks of the 8-rank plan, one CPU each


def run(spec: WorkloadSpec, text: str) -> ValidationResult:
    """Validate one plan with its analytical prediction, and print both per rank (pytest -s shows them)."""
    predictor, _ = load_predictor("analytical", "cpu")
    plan = Plan.parse(text)
    (prediction,) = predictor.predict(spec, graph_for(spec.model), [plan])
    (result,) = validate(jobs_for(spec, [plan], [prediction], warmup=1, steps=2, timeout_s=300))
    assert result.status == "ok", result.detail
    print(f"\n{text}: predicted {result.predicted_time_s:.4g} s x{result.core_sharing:.3g} (ranks per core) = "
          f"{result.compared_time_s:.4g} s, measured {result.measured_time_s:.4g} s, error {result.time_error:+.1%}; "
          f"memory predicted {result.predicted_memory_gib:.3g} GiB (peak rank), measured per rank "
          f"{[round(m, 3) for m in result.memory_delta_gib]} GiB; {result.detail}")
    return result


def assert_placed_as_planned(result: ValidationResult, plan: Plan) -> None:
    assert len(result.peak_memory_gib) == len(result.nodes) == plan.gpus
    for rank in range(0, plan.gpus, plan.tp):  # tp groups (adjacent ranks) share a node
        assert len(set(result.nodes[rank:rank + plan.tp])) == 1
    assert len(set(result.nodes)) == -(-plan.gpus // 4)  # packed: a 4-CPU node holds 4 ranks
    assert result.core_sharing > 1 and "ranks share cores" in result.detail
    assert result.compared_time_s == pytest.approx(result.predicted_time_s * result.core_sharing)


@pytest.mark.slow
def test_tp_pp_with_sp_interleaving_and_selective_recomputation_on_4_ranks(two_nodes) -> None:
    text = "dp=1,tp=2,pp=2,mbs=1,sp=true,schedule=interleaved,v=2,recompute=selective"
    result = run(llama(4, 4), text)
    assert_placed_as_planned(result, Plan.parse(text))


@pytest.mark.slow
def test_dp_tp_pp_with_sp_interleaving_selective_recomputation_and_zero1_on_8_ranks(two_nodes) -> None:
    text = "dp=2,tp=2,pp=2,mbs=1,zero=1,sp=true,schedule=interleaved,v=2,recompute=selective"
    result = run(llama(8, 4), text)
    assert_placed_as_planned(result, Plan.parse(text))


@pytest.mark.slow
def test_revalidate_re_measures_a_composed_plan(two_nodes, tmp_path) -> None:
    from orchestrator.cli import main
    from orchestrator.revalidation.history import History

    spec, text = llama(4, 4), str(Plan.parse("dp=1,tp=2,pp=2,mbs=1,sp=true,schedule=interleaved,v=2,recompute=selective"))
    predictor, _ = load_predictor("analytical", "cpu")
    (prediction,) = predictor.predict(spec, graph_for(spec.model), [Plan.parse(text)])
    url = f"sqlite:///{tmp_path}/history.db"
    with History.open(url) as h:
        h.record_predictions(spec.model_dump(mode="json", exclude_none=True), "cpu", "analytical", "analytical",
                             [(text, prediction.iter_time_s, prediction.peak_memory_gib)])
    main(["revalidate", "--history", url, "--once", "--sample", "1", "--steps", "2", "--warmup", "1"])
    with History.open(url) as h:
        (row,) = h.measurements()
    assert row["status"] == "ok" and row["measured_time_s"] > 0, row["detail"]
    assert row["plan"] == text and "ranks share cores" in row["detail"]
    assert row["predicted_time_s"] == pytest.approx(prediction.iter_time_s * 2)  # 4 ranks on this machine's 2 cores
