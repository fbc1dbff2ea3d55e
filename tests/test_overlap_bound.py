"""Overlap as a mechanism (`predictor.models.overlap`), over every example's whole search space: no plan hides more
communication than the computation beside it, and no iteration is shorter than any one kind of its communication."""

from pathlib import Path

import numpy as np
import pytest

from predictor.resolver import resolve
from predictor.graph_cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.overlap import slowdown
from predictor.plan import HIDDEN_KINDS
from predictor.prediction import TIME_PARTS
from predictor.workload import load_spec
from search_spaces import load_space
from search_spaces.enumerate import sample_plans
from search_spaces.space import default_space_name

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.yaml"))
# Plans sampled from each example's space (the largest spaces hold millions; a sample covers every prototype alike).
SAMPLE = 3000
# Each hidden kind and the part of the breakdown its exposed rest lands in.
EXPOSED_IN = {"tp_comm": "tp_comm", "cp_comm": "cp_comm", "ep_comm": "ep_comm", "dp_grad": "dp_comm",
              "dp_param": "dp_comm", "pp_p2p": "pp_p2p"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_no_plan_hides_more_communication_than_its_computation(path):
    spec = load_spec(path)
    plans = sample_plans(spec, load_space(default_space_name(spec)), SAMPLE, seed=1).plans
    assert plans, path
    table = AnalyticalPredictor().predict_table(spec, graph_for(spec.model), plans)
    parts = dict(zip(TIME_PARTS, table.breakdown.T))
    hidden = table.hidden.sum(axis=1)
    computation = parts["compute"] - slowdown(resolve(spec).device) * hidden  # before the SMs lost to communication
    assert np.all(hidden <= computation * (1 + 1e-9)), path.stem
    assert set(EXPOSED_IN) == set(HIDDEN_KINDS)
    for part in set(EXPOSED_IN.values()):  # the busiest link: every kind's whole communication fits the iteration
        whole = parts[part] + sum(table.hidden[:, HIDDEN_KINDS.index(k)] for k, p in EXPOSED_IN.items() if p == part)
        assert np.all(table.iter_time_s >= whole * (1 - 1e-9)), (path.stem, part)
