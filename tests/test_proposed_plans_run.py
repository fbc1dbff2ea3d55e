"""What the search proposes for a `cpu` cluster, the composed runner runs: plans drawn from the search's own space
(the framework's, enumerated by `search_spaces`) each train a tiny LLaMA for real (gloo, one process per rank)
and match the single process's loss.

The space's plans differ in their structure (degrees, ZeRO stage, schedule, virtual stages) and in options
(sequence parallelism, recomputation); one plan per structure is run, the options cycled over them, so every
structure and every option value runs at least once. Interleaved plans with v=3 on 4 blocks cut 6 chunks, the
first holding only the embeddings and the last only the head (Megatron's split counting each as a block): the
kind whose FSDP2 wrapping found no block list and failed.
"""

from __future__ import annotations

from itertools import cycle

import pytest

from predictor.graph.modelzoo import build_model
from predictor.measure.compose import unsupported
from predictor.measure.iteration import WorkerPool
from predictor.measure.modules import block_lists
from predictor.measure.parallelize import chunk_blocks, model_chunks
from predictor.plan import Plan
from predictor.spec.workload import WorkloadSpec, parse_spec
from search_spaces.enumerate import enumerate_plans
from search_spaces.space import resolve_space
from tests.composed_runs import assert_parity, run, tiny

# Two steps: the first step's loss checks the forward pass, the second (after Adam) the gradients.
STEPS = 2


def cpu_workload(ranks: int) -> WorkloadSpec:
    """`tests.composed_runs.tiny('llama')` on a `cpu` cluster of `ranks` processes (global batch 8, as `run`)."""
    return parse_spec({"model": tiny("llama").model_dump(mode="json", exclude_none=True),
                       "training": {"global_batch": 8, "precision": "fp32"},
                       "cluster": {"device": "cpu", "nodes": 1, "gpus_per_node": ranks}})


def proposed(ranks: int) -> list[Plan]:
    """Every plan the search's own space holds for the tiny LLaMA on `ranks` cpu processes."""
    spec = cpu_workload(ranks)
    return list(enumerate_plans(spec, resolve_space(spec)[1]).plans)


def one_per_structure(plans: list[Plan]) -> list[str]:
    """One plan of each (degrees, ZeRO stage, schedule, v), sequence parallelism and recomputation cycled over them
    (where a structure has a plan with the option values next in turn; its first plan otherwise)."""
    structures: dict[tuple, list[Plan]] = {}
    for p in plans:
        key = ((p.dp, p.tp, p.pp), p.zero if p.dp > 1 else 0, p.schedule if p.pp > 1 else "-", p.v)
        structures.setdefault(key, []).append(p)
    options = cycle([(sp, rc) for sp in (False, True) for rc in ("none", "selective", "full")])
    picked = []
    for key in sorted(structures, key=str):
        sp, rc = next(options)
        group = structures[key]
        picked.append(next((p for p in group if p.sp == sp and p.recompute == rc), group[0]))
    return [str(p) for p in picked]


def test_every_plan_the_cpu_search_proposes_is_one_the_runner_accepts() -> None:
    """The runner's refusals (`unsupported`) and the search's space agree: nothing proposed is refused."""
    for ranks in (2, 4):
        plans = proposed(ranks)
        assert len(plans) > 50
        refused = {str(p): unsupported(p, cpu_workload(ranks).model) for p in plans}
        assert not {p: why for p, why in refused.items() if why}


def test_chunks_without_a_whole_block_have_no_block_list() -> None:
    """v=3 over pp=2 on 4 blocks: 6 chunks, the embeddings alone, one block each, the head alone."""
    assert [len(idx) for _, idx, _ in chunk_blocks(4, 6)] == [0, 1, 1, 1, 1, 0]
    spec = tiny("llama")
    chunks, _ = model_chunks(build_model(spec, "cpu"), spec, 6)
    assert [len(block_lists(c)) for c in chunks] == [0, 1, 1, 1, 1, 0]


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(world=2, threads=1) as p:
        yield p


@pytest.fixture(scope="module")
def reference(pool) -> list[float]:
    return run(pool, tiny("llama"), "dp=1,mbs=8", steps=STEPS, warmup=0)[0]["losses"]


def test_an_interleaved_plan_with_chunks_without_a_block_runs(pool, reference) -> None:
    plan = "pp=2,mbs=2,schedule=interleaved,v=3,recompute=full"
    assert str(Plan.parse(plan)) in {str(p) for p in proposed(2)}
    assert_parity(run(pool, tiny("llama"), plan, steps=STEPS, warmup=0), reference)


@pytest.fixture(scope="module")
def pool4(pool):
    with WorkerPool(world=4, threads=1) as p:
        yield p


@pytest.mark.slow
@pytest.mark.parametrize("plan", one_per_structure(proposed(2)) + one_per_structure(proposed(4)))
def test_each_structure_the_cpu_search_proposes_runs_one_step(pool, pool4, reference, plan: str) -> None:
    ranks = Plan.parse(plan).gpus
    assert_parity(run(pool4 if ranks == 4 else pool, tiny("llama"), plan, steps=STEPS, warmup=0), reference)


@pytest.mark.slow
def test_the_issue_example_zero2_over_interleaved_chunks_with_dp_tp_pp_runs(pool, reference) -> None:
    """The plan kind `scaledl plan --validate 4` ranked on a 2x4 cpu cluster and could not measure (issue 44)."""
    plan = "dp=2,tp=2,pp=2,mbs=1,zero=2,schedule=interleaved,v=3"
    assert str(Plan.parse(plan)) in {str(p) for p in proposed(8)}
    with WorkerPool(world=8, threads=1) as pool8:
        assert_parity(run(pool8, tiny("llama"), plan, steps=STEPS, warmup=0), reference)
