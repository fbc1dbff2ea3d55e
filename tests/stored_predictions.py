"""Predictions of small models stored in a history database, for the revalidation tests to re-measure."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.revalidation.history import History
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.spec.resolver import get_device
from predictor.spec.workload import parse_spec


def small(family: str) -> dict:
    dims = {"hidden": 128, "layers": 2, "heads": 4, "seq_len": 64, "vocab": 512}
    return {"model": {"family": family, **dims}, "training": {"global_batch": 4, "precision": "fp32"},
            "cluster": {"device": "cpu", "nodes": 1, "gpus_per_node": 1}}


PLANS = ["dp=1,mbs=1", "dp=1,mbs=2"]


def store(history: History, family: str, speedup: float, version: str) -> None:
    """Predict PLANS of a small `family` model with the analytical predictor (device sped up by `speedup`)."""
    cpu = get_device("cpu")
    device = replace(cpu, peak_flops={k: v * speedup for k, v in cpu.peak_flops.items()},
                     mem_bandwidth=cpu.mem_bandwidth * speedup)
    spec = parse_spec(small(family))
    plans = [Plan.parse(p) for p in PLANS]
    preds = AnalyticalPredictor(device=device).predict(spec, graph_for(spec.model), plans)
    history.record_predictions(spec.model_dump(mode="json", exclude_none=True), "cpu", "analytical", version,
                               [(str(p), pr.iter_time_s, pr.peak_memory_gib) for p, pr in zip(plans, preds)])
