"""Launch files that launch: every winner and top-10 plan of the examples and of today's mixtures of experts writes a
file its framework's own checks accept (tests/framework_checks.py: Megatron-Core 0.16.1's TransformerConfig and
parallel_state, DeepSpeed 0.19.8's DeepSpeedConfig and engine refusals), and the frameworks' rules agree with those
checks on plans sampled around the spaces: every plan the checks refuse, the rules refuse first (so the search never
prices it), and a plan the checks accept is refused only by a rule of what those checks do not see (Megatron-LM's
arguments.py `validate_args`, `VALIDATE_ARGS` below). The default suite samples 120 plans; `-m slow` 1,000."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from predictor.frameworks import FRAMEWORKS
from predictor.frameworks.base import LaunchError
from predictor.frameworks.launch import launch_files, run_errors
from predictor.graph.cache import graph_for
from predictor.memory.facts import HEADROOM
from predictor.models.analytical import AnalyticalPredictor
from predictor.plan import Plan, PlanError, plan_errors
from predictor.spec.resolver import resolve
from predictor.spec.workload import SpecError, WorkloadSpec, load_spec, parse_spec
from search_spaces import enumerate_plans, resolve_space

pytest.importorskip("megatron.core", reason="megatron-core is a test extra (pip install -e .[test])")
pytest.importorskip("deepspeed", reason="DeepSpeed is a test extra (pip install -e .[test])")
from tests.framework_checks import deepspeed_refusals, megatron_refusals, torchtitan_module  # noqa: E402
from tests.framework_checks import torchtitan_refusals  # noqa: E402

if torchtitan_module("torchtitan.distributed.parallel_dims") is None:
    pytest.skip("torchtitan 0.2.2 is installed by make setup (pip install --no-deps torchtitan==0.2.2)",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]


def _spec(preset: str, device: str, nodes: int, global_batch: int, framework: str = "megatron") -> WorkloadSpec:
    return parse_spec({"model": {"preset": preset}, "training": {"global_batch": global_batch, "framework": framework},
                       "cluster": {"device": device, "nodes": nodes, "gpus_per_node": 8}})


EXAMPLES = [p.stem for p in sorted((ROOT / "examples").glob("*.yaml"))
            if resolve(load_spec(p)).framework.name in ("megatron", "deepspeed", "torchtitan")]
MOE = {"qwen3-235b-h100x256": _spec("qwen3-235b-a22b", "h100", 32, 2048),
       "gpt-oss-120b-h100x64": _spec("gpt-oss-120b", "h100", 8, 1024),
       "mixtral-8x7b-a100x32": _spec("mixtral-8x7b", "a100-80gb", 4, 256),
       "mixtral-8x22b-h100x128": _spec("mixtral-8x22b", "h100", 16, 1024),
       "qwen3-30b-a3b-torchtitan-h100x16": _spec("qwen3-30b-a3b", "h100", 2, 256, "torchtitan")}


def _specs() -> dict[str, WorkloadSpec]:
    return {**{name: load_spec(ROOT / "examples" / f"{name}.yaml") for name in EXAMPLES}, **MOE}


def refusals(plan: Plan, spec: WorkloadSpec, tmp_path: Path) -> list[str]:
    """The spec's framework's own refusals of the file written for `plan` (written whatever the rules say; where no file
    can spell the plan, nothing for the framework to check)."""
    try:
        files = launch_files(plan, resolve(spec), checked=True)
    except LaunchError:
        return []
    if "megatron_args.txt" in files:
        return megatron_refusals(files["megatron_args.txt"], spec.cluster.gpus)
    if "torchtitan.toml" in files:
        path = tmp_path / "torchtitan.toml"
        path.write_text(files["torchtitan.toml"])
        return torchtitan_refusals(str(path), spec.cluster.gpus)
    path = tmp_path / "deepspeed_config.json"
    path.write_text(files["deepspeed_config.json"])
    return deepspeed_refusals(path.read_text(), plan.dp, str(path))


def top_plans(spec: WorkloadSpec, k: int = 10) -> list[Plan]:
    """The winner and the next k - 1 plans that fit, fastest first, as `scaledl plan` ranks them (analytical)."""
    _, space = resolve_space(spec)
    plans = list(enumerate_plans(spec, space).plans)
    table = AnalyticalPredictor().predict_table(spec, graph_for(spec.model), plans)
    limit = resolve(spec).device.mem_capacity / 2**30 * (1 - HEADROOM)
    fits = [i for i in table.iter_time_s.argsort() if table.peak_memory_gib[i] <= limit]
    return [plans[i] for i in fits[:k]]


@pytest.mark.parametrize("name", [*EXAMPLES, *MOE])
def test_the_top_plans_write_files_their_framework_accepts(name: str, tmp_path: Path) -> None:
    spec = _specs()[name]
    plans = top_plans(spec)
    assert plans, f"{name}: no plan fits"
    refused = {str(p): r for p in plans if (r := refusals(p, spec, tmp_path))}
    assert not refused, refused


# Megatron-LM's megatron/training/arguments.py (`validate_args`, core_r0.16) refuses these, which no Megatron-Core config
# class holds; the rules carry them (predictor/frameworks/megatron.py `_rules`), so the checks here cannot refuse them.
VALIDATE_ARGS = ("GPipe schedule", "schedule=interleaved with v=1", "Megatron-FSDP, which does not run beside pipeline",
                 "--overlap-param-gather) only beside", "--tp-comm-overlap) only with sp", "overlaps pipeline send/recv",
                 "without p2p overlap only with pp > 2", "always overlaps", "beside tensor parallelism only with sequence")
# DeepSpeed's rules of what DeepSpeedConfig and the mirrored engine refusals do not see (its 1F1B-only pipeline, no
# context or expert parallelism here, its ZeRO overlap switches).
DEEPSPEED_OWN = ("one pipeline schedule", "context parallelism", "expert parallelism", "overlaps the gradient reduction",
                 "cannot overlap param", "switches ZeRO-3", "offloads", "orders ranks", "communication (it overlaps")
# torchtitan's rules of what its loader and ParallelDims do not see: the mesh order, the overlaps it always or never
# runs, its FSDP2/DDP choices and the interleaved schedule's stages per rank, which its parallelize and pipeline
# builders hold. ParallelDims refuses only degrees that do not multiply to the world size, which no structurally valid
# plan has, so no sampled torchtitan plan is refused by both.
TORCHTITAN_OWN = ("orders ranks", "always overlaps", "cannot overlap", "has no ZeRO-1", "runs DDP (zero=0) only",
                  "stages per rank")
OWN = {"megatron": VALIDATE_ARGS, "deepspeed": DEEPSPEED_OWN, "torchtitan": TORCHTITAN_OWN}

# Values each sampled plan's fields are drawn from around a valid plan of the space.
VARIED = {"recompute": ("none", "selective", "full"), "overlap": ("auto", "dp", "dp+param", "dp+param+tp+ep",
                                                                  "dp+param+tp+pp+ep"),
          "placement": ("tp-dp-pp", "tp-pp-dp"), "zero": (0, 1, 2, 3), "schedule": ("1f1b", "interleaved")}


def sampled_plans(spec: WorkloadSpec, n: int, seed: int) -> list[Plan]:
    """`n` structurally valid plans (`plan_errors` empty) around the framework's space: valid plans with fields
    redrawn and ep moved among the values the space gives, whether the framework's rules accept them or not."""
    _, space = resolve_space(spec)
    valid = list(enumerate_plans(spec, space).plans)
    eps = sorted({p.ep for p in valid})
    rng = random.Random(seed)
    out: list[Plan] = []
    while len(out) < n:
        base = rng.choice(valid)
        fields = {k: rng.choice(v) for k, v in VARIED.items() if rng.random() < 0.5}
        if rng.random() < 0.5:
            fields["ep"] = rng.choice(eps)
        try:
            plan = base.with_(**fields)
        except PlanError:  # a combination no plan can hold (v > 1 under 1F1B)
            continue
        if not plan_errors(plan, spec, allow_cross_node_tp=True):
            out.append(plan)
    return out


def agreement(specs: dict[str, WorkloadSpec], per_spec: int, tmp_path: Path) -> dict[str, dict[str, int]]:
    """Counts of sampled plans by framework and (rules, checks) verdict; asserts what must hold of each."""
    verdicts = ("both accept", "both refuse", "rules refuse what the checks cannot see")
    by_framework: dict[str, dict[str, int]] = {}
    for i, (name, spec) in enumerate(specs.items()):
        framework = resolve(spec).framework.name
        counts = by_framework.setdefault(framework, dict.fromkeys(verdicts, 0))
        own = OWN[framework]
        for plan in sampled_plans(spec, per_spec, seed=i):
            rules = run_errors(plan, resolve(spec), allow_cross_node_tp=True)
            checks = refusals(plan, spec, tmp_path)
            assert rules or not checks, f"{name} {plan}: the framework refuses it ({checks}), the rules let it through"
            if rules and not checks:
                unseen = [r for r in rules if not any(words in r for words in own)]
                assert not unseen, f"{name} {plan}: the rules refuse it ({unseen}), its framework accepts it"
                counts["rules refuse what the checks cannot see"] += 1
            else:
                counts["both refuse" if rules else "both accept"] += 1
    return by_framework


AGREEMENT_SPECS = ("deepseek-v3-h100x256", "deepseek-v3-gb200x256", "qwen3-235b-h100x256", "mixtral-8x7b-a100x32",
                   "mixtral-8x7b-deepspeed-a100x32", "gpt-oss-120b-h100x64", "llama3-70b-torchtitan-h100x64",
                   "qwen3-30b-a3b-torchtitan-h100x16")


def test_rules_agree_with_the_frameworks_checks_on_sampled_plans(tmp_path: Path) -> None:
    specs = _specs()
    counts = agreement({name: specs[name] for name in AGREEMENT_SPECS}, 20, tmp_path)
    assert all(c["both accept"] and (c["both refuse"] or f == "torchtitan") for f, c in counts.items()), counts


@pytest.mark.slow
def test_rules_agree_with_the_frameworks_checks_on_1000_plans(tmp_path: Path) -> None:
    specs = _specs()
    counts = agreement({name: specs[name] for name in AGREEMENT_SPECS}, 1000 // len(AGREEMENT_SPECS) + 1, tmp_path)
    print(counts)
    assert sum(sum(c.values()) for c in counts.values()) >= 1000
    assert all(c["both accept"] and (c["both refuse"] or f == "torchtitan") for f, c in counts.items()), counts


def test_the_named_versions_are_the_checked_ones() -> None:
    """The modules name the releases their files are written for; the checks above run those releases."""
    from importlib.metadata import version

    assert FRAMEWORKS["megatron"].version == version("megatron-core") == "0.16.1"
    assert FRAMEWORKS["deepspeed"].version == version("deepspeed") == "0.19.8"
    assert FRAMEWORKS["torchtitan"].version == "0.2.2"


def test_an_older_release_is_refused_what_it_lacks() -> None:
    """training.framework_version 0.14.0: Megatron-Core's TransformerConfig of that release has no
    fine_grained_activation_offloading (0.16.1 added it), so module offloading is refused, layer offloading not; a
    release no module names is refused with the ones it does."""
    spec = parse_spec({"model": {"preset": "llama3-8b"}, "training": {"global_batch": 64, "framework_version": "0.14.0"},
                       "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}})
    (error,) = run_errors(Plan.parse("dp=8,mbs=1,zero=1,offload=core_attn"), resolve(spec))
    assert "0.14.0 has no fine-grained activation offloading" in error and "0.16.1" in error
    assert run_errors(Plan.parse("dp=8,mbs=1,zero=1,offload=layers:2"), resolve(spec)) == []
    newest = spec.model_copy(update={"training": spec.training.model_copy(update={"framework_version": None})})
    assert run_errors(Plan.parse("dp=8,mbs=1,zero=1,offload=core_attn"), resolve(newest)) == []
    with pytest.raises(SpecError, match="written for 0.16.1, 0.14.0"):
        resolve(parse_spec({"model": {"preset": "llama3-8b"}, "training": {"global_batch": 64, "framework_version": "0.9"},
                            "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}}))


def test_torchtitans_checks_refuse_a_file_it_would_not_run(tmp_path: Path) -> None:
    """The torchtitan checks are real: degrees that do not multiply to the world size are refused by ParallelDims, an
    unknown key by the loader."""
    spec = _specs()["llama3-70b-torchtitan-h100x64"]
    path = tmp_path / "torchtitan.toml"
    text = launch_files(top_plans(spec, 1)[0], resolve(spec))["torchtitan.toml"]
    path.write_text(text)
    assert torchtitan_refusals(str(path), spec.cluster.gpus) == []
    assert any("ParallelDims: Invalid parallel dims" in r for r in torchtitan_refusals(str(path), spec.cluster.gpus + 8))
    path.write_text(text.replace("[parallelism]", "[parallelism]\nno_such_degree = 2"))
    assert any(r.startswith("ConfigManager") for r in torchtitan_refusals(str(path), spec.cluster.gpus))
