"""Per-layer precision (predictor.costs.bf16_layers): the first and last N layers of an FP8/FP4 run kept in BF16 cost
their BF16 time on the pipeline ranks that hold them, are written to Megatron-LM's arguments and torchtitan's
filter_fqns and read back, and what Megatron-Core refuses of them is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from predictor.frameworks import LaunchError
from predictor.frameworks.launch import launch_files, read_back, run_errors
from predictor.graph.cache import graph_for
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import SpecError, parse_spec


def _spec(first: int = 0, last: int = 0, precision: str = "fp8", framework: str = "megatron", **training: object):
    return parse_spec({"model": {"preset": "llama3-70b"},
                       "training": {"global_batch": 256, "precision": precision, "framework": framework,
                                    "bf16_first_layers": first, "bf16_last_layers": last, **training},
                       "cluster": {"device": "h100", "nodes": 8, "gpus_per_node": 8}})


def _times(spec, plans):
    return AnalyticalPredictor().predict_table(spec, graph_for(spec.model), plans).iter_time_s


def test_kept_layers_cost_their_bf16_time_where_they_sit() -> None:
    flat, piped = Plan(dp=8, tp=8, sp=True, zero=1), Plan(dp=2, tp=8, pp=4, sp=True, zero=1)
    fp8, bf16 = _times(_spec(), [flat]), _times(_spec(precision="bf16"), [flat])
    kept = _times(_spec(2, 2), [flat])
    # four of the 80 layers at BF16's cost: 4/80 of the way from the FP8 step to the BF16 one
    assert kept[0] - fp8[0] == pytest.approx((bf16[0] - fp8[0]) * 4 / 80, rel=0.02)
    # on a pipeline the last rank holds all four: the slowest stage carries them every micro-batch
    assert _times(_spec(0, 4), [piped])[0] > _times(_spec(2, 2), [piped])[0] > _times(_spec(), [piped])[0]


def test_megatron_and_torchtitan_write_and_read_them_back(tmp_path: Path) -> None:
    for framework, plan, text in (("megatron", Plan(dp=2, tp=8, pp=4, sp=True, zero=1),
                                   "--num-layers-at-start-in-bf16 1\n--num-layers-at-end-in-bf16 2"),
                                  ("torchtitan", Plan(dp=8, tp=8, sp=True, zero=2), '"layers.0.", "layers.78.", '
                                                                                    '"layers.79."')):
        spec = _spec(1, 2, framework=framework)
        files = launch_files(plan, resolve(spec))
        name, written = next(iter(files.items()))
        assert text in written
        path = tmp_path / name
        path.write_text(written)
        read_back(path, spec)
        with pytest.raises(LaunchError, match="bf16_first_layers"):
            read_back(path, _spec(1, 1, framework=framework))


def test_what_megatron_core_and_the_spec_refuse() -> None:
    piped = Plan(dp=2, tp=8, pp=4, sp=True, zero=1)
    assert any("num_layers // pp = 20" in e for e in run_errors(piped, resolve(_spec(30, 0))))
    assert any("delayed scaling" in e for e in run_errors(piped, resolve(_spec(1, 1, recipe="delayed"))))
    with pytest.raises(SpecError, match="training.precision 'bf16' runs every layer"):
        _spec(1, 1, precision="bf16")
    with pytest.raises(SpecError, match="exceeds the model's 80 layers"):
        _spec(50, 40)


def test_megatron_cores_own_checks_agree() -> None:
    """TransformerConfig built from the written arguments (tests/framework_checks.py) accepts what the rules accept
    and refuses what they refuse."""
    pytest.importorskip("megatron.core", reason="megatron-core is a test extra (pip install -e .[test])")
    from tests.framework_checks import megatron_refusals

    piped = Plan(dp=2, tp=8, pp=4, sp=True, zero=1)
    for spec in (_spec(1, 2), _spec(30, 0), _spec(1, 1, recipe="delayed")):
        own = megatron_refusals(launch_files(piped, resolve(spec), checked=True)["megatron_args.txt"], 64)
        assert bool(own) == bool(run_errors(piped, resolve(spec))), own
