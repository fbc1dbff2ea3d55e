"""torchao's row-wise float8 (`training.recipe: rowwise`): torchtitan writes and reads it back as its float8
converter's recipe_name, without float8 FSDP all-gathers (Float8LinearConverter refuses a recipe beside them), so its
FSDP2 ranks gather BF16 weights; Megatron-Core, whose Transformer Engine has no such recipe, refuses it."""

from __future__ import annotations

from pathlib import Path

from predictor.frameworks.launch import launch_files, read_back, run_errors
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec

PLAN = Plan(dp=8, sp=False, zero=2)


def _spec(recipe: str, framework: str = "torchtitan"):
    return parse_spec({"model": {"preset": "llama3-8b"}, "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8},
                       "training": {"global_batch": 64, "precision": "fp8", "recipe": recipe, "framework": framework}})


def test_torchtitan_runs_rowwise_float8_and_reads_it_back(tmp_path: Path) -> None:
    spec = _spec("rowwise")
    text = launch_files(PLAN, resolve(spec))["torchtitan.toml"]
    assert 'recipe_name = "rowwise"' in text and "enable_fsdp_float8_all_gather" not in text
    path = tmp_path / "torchtitan.toml"
    path.write_text(text)
    assert read_back(path, spec).zero == 2
    memory = {r: AnalyticalPredictor().predict_table(s, graph_for(s.model), [PLAN]).peak_memory_gib[0]
              for r, s in (("rowwise", spec), ("current", _spec("current")))}
    assert memory["rowwise"] > memory["current"]  # tensorwise gathers its weights in float8


def test_megatron_refuses_a_recipe_transformer_engine_lacks() -> None:
    errors = run_errors(Plan(dp=8, zero=1), resolve(_spec("rowwise", "megatron")))
    assert any("torchao's training.recipe 'rowwise'" in e for e in errors)
