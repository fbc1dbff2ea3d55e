"""The axis registry: plan strings old and new, cp's rules, rank orders and groups generated from the axes."""

import pandas as pd
import pytest

from predictor.costs.parallel import apply_plan, group_of
from predictor.frameworks import FRAMEWORKS
from predictor.measure.design import ProfileConfig
from predictor.plan import AXES, AXIS_NAMES, complete_order, placements
from predictor.plan import PLACEMENTS, Plan, PlanError, placement_warnings, plan_errors
from predictor.spec.resolver import get_device, resolve
from predictor.spec.workload import ModelSpec, parse_spec
from tests.gpt_graph import gpt_graph

H100 = get_device("h100")
DATA = "predictor/data/cpu/iterations/part-snapshot.parquet"


def _spec(family="llama", nodes=2, seq=4096, heads=32, kv=8):
    model = {"family": family, "hidden": 4096, "layers": 8, "heads": heads, "seq_len": seq, "vocab": 32000}
    if family == "llama":
        model["kv_heads"] = kv
    return parse_spec({"model": model, "training": {"global_batch": 64, "precision": "bf16"},
                       "cluster": {"device": "h100", "nodes": nodes, "gpus_per_node": 8}})


def test_every_axis_is_a_plan_field_and_the_legacy_placements_are_generated():
    assert set(AXIS_NAMES) <= set(Plan.__dataclass_fields__)
    assert PLACEMENTS == placements(("tp", "dp", "pp")) and len(PLACEMENTS) == 6
    assert all(FRAMEWORKS["megatron"].axes.get(a.name) or a.name == "dp" for a in AXES)  # Megatron launches each
    assert set(FRAMEWORKS["deepspeed"].axes) == {"tp", "dp", "pp"}  # no cp; DeepSpeed-MoE is not modelled
    assert "cp" not in FRAMEWORKS["pytorch"].axes  # the runner has no CPU ring attention (compose.CP_REFUSAL)


def test_plans_written_before_cp_keep_their_strings_and_dataset_ids():
    """Every plan string of the shipped CPU dataset parses and prints back unchanged, so its config ids hold."""
    frame = pd.read_parquet(DATA, columns=["plan", "spec_json", "batch"])
    for text in frame["plan"].unique():
        assert str(Plan.parse(text)) == text
    row = frame.iloc[0]
    model = ModelSpec.model_validate_json(row["spec_json"])
    plan = Plan.parse(row["plan"])
    assert ProfileConfig(model, int(row["batch"]), plan).config_id == ProfileConfig(model, int(row["batch"]),
                                                                                   Plan.parse(str(plan))).config_id
    assert "cp=" not in str(Plan(dp=2)) and "cp=2" in str(Plan(dp=2, cp=2))
    assert Plan.parse("dp=2,cp=2,overlap=dp+param,cp_comm=allgather").overlap == "dp+param"


@pytest.mark.parametrize("text, message", [
    ("cp=0", "'cp' must be a positive integer"),
    ("placement=tp-xx-pp", "must name axes"),
    ("placement=tp-tp-pp", "names an axis twice"),
    ("overlap=dp+warp", "'overlap' must be auto, none or kinds"),
    ("cp_comm=a2a", "'cp_comm' must be one of ring, allgather"),
])
def test_new_fields_refuse_bad_values_by_name(text, message):
    with pytest.raises(PlanError, match=message):
        Plan.parse(text)


def test_placements_leave_out_axes_at_their_default_position():
    assert complete_order("tp-dp-pp") == ("tp", "cp", "dp", "pp")
    assert complete_order("dp-tp-pp") == ("dp", "tp", "cp", "pp")
    assert complete_order("pp-dp-tp") == ("pp", "dp", "tp", "cp")
    plan = Plan(dp=4, tp=2, pp=2, cp=2)
    assert (plan.stride("tp"), plan.stride("cp"), plan.stride("dp"), plan.stride("pp")) == (1, 2, 4, 16)
    assert plan.group_ranks(("dp", "cp")) == [0, 2, 4, 6, 8, 10, 12, 14]


def test_cp_rules_name_the_reason():
    spec = _spec()
    assert plan_errors(Plan(dp=4, tp=2, cp=2), spec) == []
    assert any("2*cp = 16 chunks" in e for e in plan_errors(Plan(dp=2, cp=8), _spec(seq=4088)))
    bert = _spec(family="bert", heads=32)
    assert any("not a decoder" in e for e in plan_errors(Plan(dp=8, cp=2), bert))
    assert any("tp*cp*dp*pp" in e for e in plan_errors(Plan(dp=2, cp=2), spec))


def test_groups_come_from_the_rank_order_and_the_nvlink_domain():
    """tp=8 fills a node; cp=2 then spans two nodes; dp (with cp) strides over the rest."""
    plan = Plan(dp=2, tp=8, cp=2, pp=1)
    assert (group_of(plan, "tp", 8, H100).n_intra, group_of(plan, "tp", 8, H100).n_inter) == (8, 1)
    cp = group_of(plan, "cp", 8, H100)
    assert (cp.n_intra, cp.n_inter) == (1, 2)
    sync = group_of(plan, ("dp", "cp"), 8, H100)
    assert sync.size == 4 and sync.n_inter == 4
    assert group_of(plan, ("dp", "cp"), 72, H100).n_inter == 1  # an NVL72 domain holds all 32 GPUs


def test_cross_node_tp_is_predicted_with_a_warning_and_refused_by_the_search_rules():
    spec = _spec(nodes=2)
    plan = Plan(dp=1, tp=16)
    assert any("spans 16 consecutive GPUs" in e for e in plan_errors(plan, _spec(nodes=2, heads=32, kv=16)))
    assert plan_errors(plan, _spec(nodes=2, heads=32, kv=16), allow_cross_node_tp=True) == []
    (warning,) = placement_warnings(plan, spec)
    assert "inter-node network" in warning
    assert placement_warnings(Plan(dp=1, tp=8, cp=2), spec) == []  # cp's ring crosses nodes in the recipes


def test_module_models_refuse_axes_they_cannot_split():
    spec = parse_spec({"model": {"module": "tests.gpt_graph:gpt_graph", "inputs": [{"shape": [4]}]},
                       "training": {"global_batch": 8}, "cluster": {"device": "h100", "nodes": 1}})
    errors = plan_errors(Plan(dp=2, tp=2, pp=2), spec)
    assert any("tp=2 splits attention heads" in e and "model.heads" in e for e in errors)
    assert any("pp=2 splits the transformer layers" in e for e in errors)
    assert plan_errors(Plan(dp=8), spec) == []


def test_cp_divides_tokens_activations_and_the_pipeline_message():
    g = gpt_graph(1024, 16, 4096, 4, 32000)
    spec = _spec()
    one, two = (apply_plan(spec, g, Plan(dp=16 // cp, cp=cp), H100) for cp in (1, 2))
    assert two.nodes.fwd_flops.sum() == pytest.approx(one.nodes.fwd_flops.sum() / 2)
    assert two.nodes.act_elems.sum() == pytest.approx(one.nodes.act_elems.sum() / 2)
    assert two.nodes.params.sum() == one.nodes.params.sum()
    assert two.groups["dp"].size == 16 and two.groups["cp"].size == 2


def test_the_lists_of_parts_and_kinds_are_the_registrys():
    from predictor.plan import COMM_PARTS, HIDDEN_KINDS, OVERLAP_KINDS, PRICING_ORDER, STAGE_AXES, TERM_OF_PART, TIME_PARTS

    assert TIME_PARTS == ("compute", *(p.name for a in PRICING_ORDER for p in a.parts), "optimizer")
    assert set(COMM_PARTS) == {p.name for a in AXES for p in a.parts if p.comm} and "ep_comm" in COMM_PARTS
    assert HIDDEN_KINDS == tuple(k.name for a in PRICING_ORDER for k in a.hidden)
    # axes may share a kind (etp's exchanges hide where ep's do): each kind once, in pricing order
    assert OVERLAP_KINDS == tuple(dict.fromkeys(k for a in PRICING_ORDER for k in a.overlap))
    assert set(TERM_OF_PART) == set(TIME_PARTS)
    assert {a.name for a in STAGE_AXES} == {"tp", "cp", "ep", "etp"}


def test_the_pricing_core_finds_the_replicas_and_the_pipelines_parts_by_role_not_by_position():
    """The gradient sync, the bubble and the send/recv (parts and hidden kinds) are found by their roles: reordering
    the registry's entries finds the same ones, and a role no entry takes or two entries take is refused."""
    from dataclasses import replace

    from predictor.plan.axes import HIDDEN_ROLES, PART_ROLES, by_role, hidden_named, part_named

    parts = tuple(p for a in AXES for p in a.parts)
    kinds = tuple(k for a in AXES for k in a.hidden)
    assert {r: p.name for r, p in by_role(parts[::-1], PART_ROLES, "part").items()} == {
        "sync": "dp_comm", "bubble": "pp_bubble", "send": "pp_p2p"} == {r: part_named(r) for r in PART_ROLES}
    assert {r: (k.name, k.overlap) for r, k in by_role(kinds[::-1], HIDDEN_ROLES, "kind").items()} == {
        "grad_sync": ("dp_grad", "dp"), "param_gather": ("dp_param", "param"), "send": ("pp_p2p", "pp")} == {
        r: (hidden_named(r).name, hidden_named(r).overlap) for r in HIDDEN_ROLES}
    with pytest.raises(ValueError, match=r"no part takes the roles \['bubble'\]"):
        by_role(tuple(p for p in parts if p.role != "bubble"), PART_ROLES, "part")
    with pytest.raises(ValueError, match="'pp_p2p' and 'tp_comm' both take role 'send'"):
        by_role((*parts, replace(parts[0], role="send")), PART_ROLES, "part")
    with pytest.raises(ValueError, match="takes role 'sink'"):
        by_role((replace(parts[0], role="sink"),), PART_ROLES, "part")
    with pytest.raises(KeyError, match="unknown time part role 'gather'"):
        part_named("gather")


@pytest.mark.parametrize("text, part", [("dp=2,tp=8,sp=true", "tp_comm"), ("dp=8,cp=2,cp_comm=allgather", "cp_comm"),
                                        ("dp=16,ep=8", "ep_comm")])
def test_each_stage_axis_is_priced_by_the_cost_its_entry_names(text, part):
    """The analytical batch prices a stage axis through the stage cost registered onto it and books it under
    `Axis.parts`."""
    from predictor.graph.cache import graph_for
    from predictor.models.analytical import AnalyticalPredictor
    from predictor.models.plan_batch import stage_cost
    from predictor.models.roofline import AnalyticalConfig
    from predictor.plan import AXIS

    preset = "mixtral-8x7b" if "ep" in text else "llama3-8b"
    spec = parse_spec({"model": {"preset": preset, "seq_len": 4096},
                       "training": {"global_batch": 64, "precision": "bf16", "framework": "megatron"},
                       "cluster": {"device": "h100", "nodes": 2, "gpus_per_node": 8}})
    plan = Plan.parse(text + ",overlap=none")
    graph = graph_for(spec.model)
    (pred,) = AnalyticalPredictor().predict(spec, graph, [plan])
    axis = AXIS[part.split("_")[0]]
    lay = apply_plan(spec, graph, plan, H100)
    per_stage = stage_cost(axis)(resolve(spec, H100), lay, AnalyticalConfig().for_device(H100))
    m = plan.microbatches(spec.training.global_batch)
    assert pred.breakdown[part] == pytest.approx(m * float(per_stage.max()), rel=1e-9) and pred.breakdown[part] > 0


def test_each_axis_function_is_registered_onto_its_axis_by_reference():
    """An axis's functions are real references its defining module registers (no "module:function" string): every
    axis priced per stage has its cost, and a second function of one kind for one axis is refused."""
    import predictor.models.stage_costs as stage_costs
    from predictor.plan import AXIS, explained, rules
    from predictor.plan.axes import axis_function

    assert [a.name for a in AXES if a.stage_cost] == ["tp", "cp", "ep", "etp"]
    assert AXIS["tp"].function("stage_cost") is stage_costs.tp_stage_time
    assert AXIS["ep"].function("rules") is rules.ep_rules and AXIS["ep"].function("choices") is rules.expert_degrees
    assert AXIS["dp"].function("rules") is None and AXIS["tp"].function("choices") is None
    assert all(a.function("facts") is getattr(explained, f"{a.name}_explained") for a in AXES)
    with pytest.raises(ValueError, match="has a rules function already"):
        axis_function("tp", "rules")(lambda plan, spec: [])
    with pytest.raises(ValueError, match="unknown axis function kind 'cost'"):
        axis_function("tp", "cost")
    assert AXIS["tp"].function("rules") is rules.tp_rules


def test_the_search_the_plan_and_the_pricing_core_ask_for_an_axis_by_role_not_by_name():
    """plan/plan.py, search_spaces and the pricing (parallel.py, plan_batch.py, memory/, the roofline, the overlap
    windows, the MoE costs and dispatcher, the stage costs, the kept BF16 layers, CUDA graphs, FSDP2) read axes from the registry (its roles: `REPLICA_AXIS`,
    `PIPELINE_AXIS`, `SEQUENCE_SPLIT_AXIS`; the dimensions each axis splits, `RankShare`; the windows it hides
    beside) and name none in code (messages and docstrings may), but in an axis's own functions: those registered
    onto it (`axis_function`) and the helpers named for it. An axis added to the registry needs no edit there."""
    import ast
    import io
    import re
    import tokenize
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    named = re.compile(r"(tp|cp|dp|pp|ep|edp|etp|vpp)(_\w*)?")
    packages = [*sorted((root / "search_spaces").glob("*.py")), *sorted((root / "predictor/memory").glob("*.py"))]
    for path in ("predictor/plan/plan.py", "predictor/plan/share.py", "predictor/costs/parallel.py",
                 "predictor/costs/moe_dispatch.py", "predictor/costs/bf16_layers.py", "predictor/costs/moe.py",
                 "predictor/models/plan_batch.py",
                 "predictor/models/roofline.py", "predictor/models/overlap.py", "predictor/models/stage_costs.py",
                 "predictor/models/cuda_graphs.py", "predictor/models/fsdp2.py",
                 *(str(p.relative_to(root)) for p in packages)):
        source = (root / path).read_text()
        owned = [range(min(d.lineno for d in [f, *f.decorator_list]), f.end_lineno + 1)
                 for f in ast.parse(source).body if isinstance(f, ast.FunctionDef)
                 and (named.fullmatch(f.name.lstrip("_"))
                      or any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "axis_function"
                             for d in f.decorator_list))]
        names = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
                 if (t.type == tokenize.NAME and named.fullmatch(t.string)
                     or t.type == tokenize.STRING and named.fullmatch(t.string.strip("'\""))
                     ) and not any(t.start[0] in lines for lines in owned)]
        assert names == [], f"{path} names {names}"


def test_a_rank_share_divides_each_dimension_by_the_degrees_of_the_axes_that_split_it():
    from predictor.graph.cache import graph_for
    from predictor.plan.axes import DIMENSIONS
    from predictor.plan.share import RankShare

    plan = Plan(dp=2, tp=4, sp=True, cp=2, pp=2, ep=2, etp=2)
    assert RankShare.of(plan) == RankShare(width=4, tokens=4, sequence=2, experts=2, expert_width=2, layers=2,
                                           seq_shard=4)
    assert RankShare.of(plan.with_(sp=False)).seq_shard == 1  # what a width split leaves whole stays whole
    assert RankShare.split({}) == RankShare()
    assert {d for a in AXES for d in a.splits} == set(DIMENSIONS)  # every dimension is some axis's
    with pytest.raises(ValueError, match="unknown axes"):
        RankShare.split({"xp": 2})
    spec = parse_spec({"model": {"family": "llama", "hidden": 512, "layers": 4, "heads": 8, "kv_heads": 4,
                                 "seq_len": 256, "vocab": 1000, "experts": 8, "top_k": 2},
                       "training": {"global_batch": 16}, "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}})
    lay = apply_plan(spec, graph_for(spec.model), Plan(dp=8, ep=4), get_device("h100"))
    assert lay.split_group("experts").size == 4  # the ranks that exchange the experts' tokens: ep's group
    with pytest.raises(ValueError, match="no one axis with a group splits 'layers'"):
        lay.split_group("layers")
