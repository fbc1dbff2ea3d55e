"""Search spaces: enumeration against the structural rules, narrowing, reasons, and the Tune mapping."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from predictor.frameworks import FRAMEWORKS
from predictor.plan import Plan, plan_errors
from predictor.spec.workload import SpecError, load_spec, parse_spec
from search_spaces import (
    TuneSpace, candidate_count, enumerate_plans, explain, load_space, narrow, preset_names, rejected, resolve_space,
)
from search_spaces.enumerate import RULE_BLIND, all_errors, candidates

ROOT = Path(__file__).resolve().parents[1]
GPT3 = load_spec(ROOT / "examples/gpt3-175b-a100x1024.yaml")
BERT = load_spec(ROOT / "examples/bert-cpu2.yaml")


def test_presets_load() -> None:
    assert {"megatron-3d", "zero-dp", "full"} <= set(preset_names())
    for name in preset_names():
        load_space(name)


@pytest.mark.parametrize("spec, name", [
    pytest.param(GPT3, "megatron-3d", id="megatron-3d-gpt3"), pytest.param(BERT, "megatron-3d", id="megatron-3d-bert"),
    pytest.param(GPT3, "full", id="full-gpt3", marks=pytest.mark.slow),  # 20 s: checks 100,000s of candidates one by one
    pytest.param(BERT, "full", id="full-bert")])
def test_enumeration_is_exactly_the_valid_candidates(spec, name) -> None:
    space = load_space(name)
    if spec is GPT3 and name == "full":  # millions of candidates: one micro-batch and overlap choice keep it quick
        space = narrow(space, {"mbs": [1, 2], "overlap": ["auto"]}, name)
    result = enumerate_plans(spec, space)
    # The prototype pruning must not change the answer of checking every candidate one by one.
    brute = [p for p in candidates(spec, space) if not all_errors(p, spec, space)]
    assert result.plans == brute
    names = {f.name for f in fields(Plan)}
    assert all(names <= vars(p).keys() for p in result.plans)  # `Plan.trusted` got every field, none by default
    assert len(set(result.plans)) == len(result.plans) > 0
    assert result.checked == sum(1 for _ in candidates(spec, space)) == candidate_count(spec, space)
    assert result.rejected_count == sum(1 for _ in rejected(spec, space))
    m = spec.model
    for p in result.plans:
        assert p.gpus == spec.cluster.gpus
        assert m.heads % p.tp == 0 and m.hidden % p.tp == 0
        assert m.num_blocks % (p.pp * p.v) == 0 or (m.num_blocks + 2) % (p.pp * p.v) == 0
        assert spec.training.global_batch % (p.dp * p.mbs) == 0
        assert p.group_span("tp") <= spec.cluster.gpus_per_node


_READ: set[str] = set()
_FIELDS = frozenset(f.name for f in fields(Plan))


class _Watched(Plan):
    """A plan that notes in _READ each of its fields something reads."""

    def __getattribute__(self, name: str) -> Any:
        if name in _FIELDS:
            _READ.add(name)
        return super().__getattribute__(name)


MIXTRAL = parse_spec({"model": {"preset": "mixtral-8x7b"}, "training": {"global_batch": 32, "precision": "bf16"},
                      "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}})


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
@pytest.mark.parametrize("spec", [BERT, MIXTRAL], ids=["bert", "mixtral"])
def test_no_rule_reads_the_fields_the_enumerator_checks_once(spec, framework) -> None:
    # enumerate_plans checks one candidate of those that differ only in RULE_BLIND fields: no rule may read them.
    # a GPU framework on a GPU (a measured device runs ScaleDL's runner only: the resolver refuses the others there)
    cluster = spec.cluster if framework == "pytorch" else spec.cluster.model_copy(update={"device": "a100-80gb"})
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"framework": framework}),
                                   "cluster": cluster})
    space = narrow(load_space("full"), {"mbs": [1, 2]}, "full")
    checked = 0
    for plan in candidates(spec, space):
        watched = _Watched(**{name: getattr(plan, name) for name in _FIELDS})
        _READ.clear()
        plan_errors(watched, spec, True)
        plan_errors(watched, spec, False)
        FRAMEWORKS[framework].errors(watched, spec)
        # a framework refuses the option values its `never` lists, which runnable_space drops before enumerating
        blind = set(RULE_BLIND) - set(FRAMEWORKS[framework].never)
        assert not _READ & blind, f"a rule reads {_READ & blind} of {plan}"
        assert {"mbs", "sp", "overlap"} <= _READ  # the watch sees what the rules read
        checked += 1
    assert checked > 100


def test_megatron_space_contains_the_paper_plan_and_only_its_axes() -> None:
    plans = enumerate_plans(GPT3, load_space("megatron-3d")).plans
    paper = Plan(dp=8, tp=8, pp=16, mbs=1, zero=1, recompute="full", sp=True, schedule="interleaved", v=2)
    assert paper in plans
    assert {p.placement for p in plans} == {"tp-dp-pp"}
    assert {p.zero for p in plans} == {0, 1}
    assert max(p.tp for p in plans) == 8  # tensor parallel never leaves a node


def test_full_space_drops_placements_that_map_ranks_identically() -> None:
    plans = enumerate_plans(BERT, load_space("full")).plans
    # BERT on 2 GPUs: with one axis of degree 2 every placement is the same rank mapping.
    for p in plans:
        assert p.placement == "tp-dp-pp"


def test_empty_space_says_why() -> None:
    result = enumerate_plans(GPT3, load_space("zero-dp"))
    assert result.plans == []
    assert "does not divide global_batch=1536" in result.top_reasons(1)[0][0]


def _searching(spec: Any, section: dict[str, Any]) -> Any:
    return spec.model_copy(update={"search": section})


def test_narrowing_fixes_caps_and_forbids() -> None:
    name, space = resolve_space(_searching(GPT3, {"tp": 8, "max_pp": 8, "recompute": ["none", "selective"]}))
    assert name == "megatron"
    plans = enumerate_plans(GPT3, space).plans
    assert plans and {p.tp for p in plans} == {8}
    assert max(p.pp for p in plans) == 8
    assert "full" not in {p.recompute for p in plans}
    assert resolve_space(_searching(GPT3, {"space": "full"}), cli_space="zero-dp")[0] == "zero-dp"  # the command line wins


def _workload(model: dict[str, Any], framework: str, gpus: int = 64, global_batch: int = 512) -> Any:
    return parse_spec({"model": model, "training": {"global_batch": global_batch, "framework": framework},
                       "cluster": {"device": "h100", "nodes": gpus // 8, "gpus_per_node": 8}})


def _values(plans: list[Plan], field: str) -> set[Any]:
    return {getattr(p, field) for p in plans}


LLAMA70B = {"preset": "llama3-70b"}
LONG_LLAMA70B = {"preset": "llama3-70b", "seq_len": 32768}
MIXTRAL = {"preset": "mixtral-8x7b"}


@pytest.mark.parametrize("framework, model, zero, ep, cp", [
    ("megatron", LLAMA70B, {0, 1, 2, 3}, False, False),
    ("megatron", MIXTRAL, {0, 1, 2, 3}, True, False),
    ("megatron", LONG_LLAMA70B, {0, 1, 2, 3}, False, True),
    ("torchtitan", LLAMA70B, {0, 2, 3}, False, False),
    ("torchtitan", MIXTRAL, {0, 2, 3}, True, False),
    ("torchtitan", LONG_LLAMA70B, {0, 2, 3}, False, True),
    ("deepspeed", LLAMA70B, {0, 1, 2, 3}, False, False),
    ("deepspeed", MIXTRAL, {0, 1, 2}, False, False),  # its native MoE runs without ZeRO-3; no expert parallelism
    ("deepspeed", LONG_LLAMA70B, {0, 1, 2, 3}, False, False),  # no context parallelism
])
def test_default_space_is_the_frameworks_own_for_the_model(framework, model, zero, ep, cp) -> None:
    spec = _workload(model, framework)
    name, space = resolve_space(spec)
    assert name == framework
    plans = enumerate_plans(spec, space).plans
    assert _values(plans, "zero") == zero
    assert (max(_values(plans, "ep")) > 1) == ep
    assert (max(_values(plans, "cp")) > 1) == cp
    assert max(_values(plans, "tp")) > 1 and max(_values(plans, "pp")) > 1
    if framework == "torchtitan":  # FSDP2 with and without resharding beside tp and pp
        assert any(p.zero in (2, 3) and p.tp > 1 for p in plans) and any(p.zero == 0 and p.pp > 1 for p in plans)
    if framework == "deepspeed":
        assert _values(plans, "schedule") == {"1f1b"}


def test_megatron_3d_stays_available_by_name() -> None:
    spec = _workload(MIXTRAL, "megatron")
    name, space = resolve_space(spec, "megatron-3d")
    plans = enumerate_plans(spec, space).plans
    assert name == "megatron-3d" and _values(plans, "ep") == {1} and _values(plans, "zero") <= {0, 1}
    assert resolve_space(_searching(spec, {"space": "megatron-3d"}))[0] == "megatron-3d"


def test_every_framework_has_its_own_space() -> None:
    assert set(FRAMEWORKS) <= set(preset_names())
    assert resolve_space(BERT)[0] == "pytorch"  # a measured device trains with ScaleDL's runner
    # Context parallelism from 16,384 tokens on: the threshold itself is long.
    space = load_space("torchtitan")
    at = _workload({**LLAMA70B, "seq_len": space.cp_from_tokens}, "torchtitan")
    below = _workload({**LLAMA70B, "seq_len": space.cp_from_tokens // 2}, "torchtitan")
    assert resolve_space(at)[1].cp == "auto" and resolve_space(below)[1].cp == [1]


@pytest.mark.parametrize("section, field", [
    ({"zero": [3]}, "search.zero"),  # megatron-3d allows ZeRO 0/1 only: a spec may not widen it
    ({"tp": "eight"}, "search.tp"),
    ({"pipeline": 4}, "search.pipeline"),
    ({"placement": ["pp-first"]}, "search.placement"),
    ({"allow_cross_node_tp": True}, "search.allow_cross_node_tp"),
])
def test_bad_narrowing_names_the_field(section, field) -> None:
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        narrow(load_space("megatron-3d"), section, "megatron-3d")


def test_unknown_space_lists_the_known_ones(tmp_path) -> None:
    with pytest.raises(SpecError, match="known spaces: .*megatron-3d"):
        load_space("megatron3d")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tp: [0]\n")
    with pytest.raises(SpecError, match="space.tp"):
        load_space(str(bad))


def test_explain_gives_every_reason() -> None:
    space = load_space("megatron-3d")
    reasons = explain(Plan(dp=4, tp=16, pp=16, zero=3, placement="dp-tp-pp"), GPT3, space)
    text = "\n".join(reasons)
    assert "zero=3 is not in the space" in text
    assert "placement=dp-tp-pp is not in the space" in text
    assert "spans" in text  # tp=16 cannot stay inside an 8-GPU node
    assert explain(Plan(dp=8, tp=8, pp=16, mbs=1), GPT3, space) == []


def test_tune_space_addresses_only_valid_plans() -> None:
    plans = enumerate_plans(GPT3, load_space("full")).plans
    ts = TuneSpace(plans, batch_size=1000)
    covered = [i for b in range(ts.n_batches) for i in ts.batch(b)]
    assert covered == list(range(len(plans)))
    grouped = sorted(i for members in ts.groups.values() for i in members)
    assert grouped == list(range(len(plans)))

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(200):
        trial = study.ask()  # a real Optuna trial walks the define-by-run tree
        ts.suggest(trial)
        members = ts.members(trial.params)
        assert members, trial.params
        assert len({(plans[i].tp, plans[i].pp, plans[i].mbs, plans[i].zero) for i in members}) == 1
        assert ts.key(trial.params).startswith("group-gpus")
        study.tell(trial, float(len(members)))
    random_grid = ts.grid("random", seed=1)["group"]
    assert sorted(map(tuple, random_grid)) == sorted(ts.groups)
    assert ts.grid("exhaustive") == {"batch": list(range(ts.n_batches))}
