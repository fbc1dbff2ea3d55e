"""D-optimal design: Fedorov exchange beats random, never decreases, is reproducible, rejects bad k."""

import numpy as np
import pytest

from predictor.measure.design import (
    STRATA_SHARE, DesignError, candidates, choose, fedorov, log_det, quadratic_features, random_design,
    strata_proportions,
)


@pytest.fixture(scope="module")
def bert_features():
    pool = [c for c in candidates("bert") if c.stratum == "single"]
    return quadratic_features(np.array([c.design_vars() for c in pool]))


def test_doptimal_logdet_beats_random_sets(bert_features):
    chosen, _ = fedorov(bert_features, 60, seed=0)
    best = log_det(bert_features, chosen)
    randoms = [log_det(bert_features, random_design(len(bert_features), 60, seed)) for seed in range(20)]
    assert best >= max(randoms)
    assert len(set(chosen.tolist())) == 60


def test_exchange_never_decreases_logdet(bert_features):
    _, history = fedorov(bert_features, 40, seed=3)
    assert len(history) > 1, "the random start should be improvable"
    assert all(b > a for a, b in zip(history, history[1:]))


def test_reproducible_with_seed(bert_features):
    a, _ = fedorov(bert_features, 30, seed=7)
    b, _ = fedorov(bert_features, 30, seed=7)
    assert np.array_equal(a, b)


def test_k_larger_than_candidates_is_a_clear_error():
    with pytest.raises(DesignError, match="k=11 .* only 10 candidates"):
        fedorov(np.random.default_rng(0).normal(size=(10, 3)), 11)
    with pytest.raises(DesignError, match="at most"):
        choose(candidates("gpt2")[:5], 6)


def test_choose_splits_budget_over_plan_kinds_and_ids_are_unique():
    pool = candidates("vit")
    picked = choose(pool, 100, "doptimal")
    assert len(picked) == 100 and len({c.config_id for c in picked}) == 100
    kinds = {c.stratum for c in picked}
    assert {"single", "dp", "tp", "pp-1f1b"} <= kinds
    assert all(c.estimated_flops() <= 3e9 for c in picked)
    assert all(c.plan.gpus <= 2 for c in picked)



def test_choose_can_split_the_budget_in_given_proportions():
    """Default shares put half the budget on single-process runs; a pool's own proportions reproduce its mix."""
    bert = candidates("bert")
    pool = [c for c in bert if c.stratum == "single"][:300] + [c for c in bert if c.stratum == "dp"][:100]
    mix = strata_proportions(pool)
    assert mix == {"single": 0.75, "dp": 0.25}
    own = choose(pool, 40, "doptimal", shares=mix)
    assert sum(c.stratum == "dp" for c in own) == 10 and sum(c.stratum == "single" for c in own) == 30
    default = choose(pool, 40, "doptimal")
    share = STRATA_SHARE["dp"] / (STRATA_SHARE["dp"] + STRATA_SHARE["single"])
    assert sum(c.stratum == "dp" for c in default) == round(40 * share)

def test_gpu_grid_is_realistic_and_bounded():
    pool = candidates("gpt2", max_procs=1, grid="gpu")
    assert pool and all(c.plan.gpus == 1 for c in pool)
    assert all(c.estimated_flops() <= 1e13 for c in pool)
    assert min(c.model.hidden for c in pool) >= 512 and max(c.model.seq_len for c in pool) == 1024
    assert all(c.model.hidden // c.model.heads >= 64 for c in pool)
    assert {c.config_id for c in pool}.isdisjoint(c.config_id for c in candidates("gpt2", max_procs=1))
    with pytest.raises(DesignError, match="unknown candidate grid 'tpu'; use cpu or gpu"):
        candidates("gpt2", grid="tpu")
