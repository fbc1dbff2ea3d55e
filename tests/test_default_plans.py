"""The examples' workloads end to end on their default spaces (issue 35): the framework's own space, enumerated and
predicted in this process as `scaledl plan` does, gives DeepSeek-V3 on 256 H100 and on 256 GB200 a plan that fits with
expert parallelism, Llama 3 70B under torchtitan an FSDP2 plan, and Mixtral under DeepSpeed a plan whose launch file
trains its experts. DeepSeek-V3's are slow (12,000-18,000 plans of a 671B model, ~10 s each); the others take 1 s."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from predictor.frameworks.launch import launch_files
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.spec.resolver import get_device
from predictor.spec.resolver import resolve
from predictor.spec.workload import load_spec
from search_spaces import enumerate_plans, resolve_space

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HEADROOM = 0.05  # scaledl plan's default: the limit a plan must fit


def _default_winner(name: str):
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    space_name, space = resolve_space(spec)
    plans = enumerate_plans(spec, space).plans
    table = AnalyticalPredictor().predict_table(spec, graph_for(spec.model), plans)
    limit = get_device(spec.cluster.device).mem_capacity / 2**30 * (1 - HEADROOM)
    fits = np.flatnonzero(table.peak_memory_gib <= limit)
    assert len(fits), f"no plan of the {space_name} space fits {name}"
    best = int(fits[np.argmin(table.iter_time_s[fits])])
    return spec, space_name, plans[best]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deepseek-v3-h100x256", "deepseek-v3-gb200x256"])
def test_deepseek_v3_gets_an_expert_parallel_plan_that_fits_by_default(name: str) -> None:
    spec, space, winner = _default_winner(name)
    assert space == "megatron" and winner.ep > 1


def test_torchtitan_llama_gets_an_fsdp_plan_by_default() -> None:
    spec, space, winner = _default_winner("llama3-70b-torchtitan-h100x64")
    assert space == "torchtitan" and winner.zero in (2, 3)


def test_mixtral_deepspeed_default_winner_launches_its_experts() -> None:
    spec, space, winner = _default_winner("mixtral-8x7b-deepspeed-a100x32")
    args = json.loads(launch_files(winner, resolve(spec))["deepspeed_config.json"])["megatron_deepspeed_args"]
    assert space == "deepspeed" and args[args.index("--num-experts") + 1] == "8" and "--topk" in args
