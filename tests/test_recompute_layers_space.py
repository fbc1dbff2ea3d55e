"""Full recomputation of some layers per model chunk (`recompute_layers`) in the spaces of the frameworks that run it:
Megatron-Core's --recompute-method block --recompute-num-layers N, torchtitan's every-k-th-block checkpointing."""

from __future__ import annotations

from pathlib import Path

from predictor.plan import Plan
from predictor.spec.workload import load_spec, parse_spec
from search_spaces import enumerate_plans, explain, load_space, narrow, resolve_space
from search_spaces.enumerate import all_errors, candidates

ROOT = Path(__file__).resolve().parents[1]
TORCHTITAN = load_spec(ROOT / "examples/llama3-70b-torchtitan-h100x64.yaml")
# SimuMax's search of Llama 3 70B on 64 GPUs picks a plan recomputing one layer per pipeline stage.
MEGATRON = parse_spec({"model": {"preset": "llama3-70b"}, "training": {"global_batch": 128, "precision": "bf16"},
                       "cluster": {"device": "h100", "nodes": 8, "gpus_per_node": 8}})


def test_megatron_space_proposes_one_layer_recomputed_per_stage() -> None:
    plans = enumerate_plans(MEGATRON, resolve_space(MEGATRON)[1]).plans
    one = {(p.pp, p.v) for p in plans if p.recompute == "full" and p.recompute_layers == 1}
    assert {(2, 1), (4, 1), (8, 1)} <= one
    assert Plan(dp=4, tp=4, pp=4, mbs=1, zero=1, recompute="full", recompute_layers=1, sp=True) in list(plans)
    for p in plans:  # a count is fewer than a chunk's blocks (all of them is recompute_layers=0) and a power of two
        if p.recompute_layers:
            blocks = MEGATRON.model.num_blocks // (p.pp * p.v)
            assert p.recompute == "full" and p.recompute_layers < blocks and blocks % p.recompute_layers == 0
            assert p.recompute_layers & (p.recompute_layers - 1) == 0


def test_torchtitan_space_counts_are_every_k_th_block_and_exactly_the_valid_candidates() -> None:
    space = narrow(resolve_space(TORCHTITAN)[1], {"mbs": [1]})
    result = enumerate_plans(TORCHTITAN, space)
    assert result.plans == [p for p in candidates(TORCHTITAN, space) if not all_errors(p, TORCHTITAN, space)]
    counts = {(p.pp, p.v, p.recompute_layers) for p in result.plans if p.recompute_layers}
    assert counts and all((80 // (pp * v)) % n == 0 for pp, v, n in counts)


def test_a_listed_count_of_every_layer_is_the_plan_without_a_count() -> None:
    space = narrow(load_space("megatron"), {"recompute_layers": [0, 1, 80], "mbs": [1], "pp": [1, 2]})
    result = enumerate_plans(MEGATRON, space)
    assert {p.recompute_layers for p in result.plans} == {0, 1}
    reasons = [r for r in result.pruned if r.startswith("recompute_layers=80")]
    assert reasons and all(result.pruned[r] > 0 for r in reasons)
    plan = Plan(dp=8, tp=8, mbs=1, zero=1, recompute="full", recompute_layers=80, sp=True)
    assert any("searched as recompute_layers=0" in r for r in explain(plan, MEGATRON, space))
    off_grid = Plan(dp=8, tp=8, mbs=1, zero=1, recompute="full", recompute_layers=3, sp=True)
    assert any("not in the space's counts" in r for r in explain(off_grid, MEGATRON, load_space("megatron")))


def test_a_framework_recomputing_every_layer_or_none_gets_no_counts() -> None:
    spec = MEGATRON.model_copy(update={"training": MEGATRON.training.model_copy(update={"framework": "deepspeed"})})
    space = narrow(load_space("full"), {"mbs": [1]})
    assert not any(p.recompute_layers for p in enumerate_plans(spec, space).plans)
