"""Memory per rank against the closed forms of Korthikanti et al. (activations) and ZeRO (model states)."""

import numpy as np
import pytest

from predictor.costs.parallel import apply_plan
from predictor.memory import activation_bytes, in_flight, model_state_bytes
from predictor.plan import Plan
from predictor.plan.share import RankShare
from predictor.spec.resolver import get_device
from predictor.spec.workload import parse_spec
from tests.gpt_graph import gpt_graph

A100 = get_device("a100-80gb")
S, H, A, V = 512, 1024, 16, 50304


def _spec(layers, gpus=8, batch=64, optimizer="adam", precision="bf16"):
    return parse_spec({
        "model": {"family": "gpt", "hidden": H, "layers": layers, "heads": A, "seq_len": S, "vocab": V},
        "training": {"global_batch": batch, "precision": precision, "optimizer": optimizer},
        "cluster": {"device": "a100-80gb", "nodes": 1, "gpus_per_node": gpus}})


def _per_layer(plan: Plan, layers=(2, 4)) -> float:
    """Activation bytes of one transformer layer on the first stage (difference of two depths)."""
    vals = [activation_bytes(apply_plan(_spec(n), gpt_graph(H, A, S, n, V), plan, A100))[0] for n in layers]
    return (vals[1] - vals[0]) / (layers[1] - layers[0])


@pytest.mark.parametrize("t, sp, recompute, closed_form", [
    (1, False, "none", lambda b, t: S * b * H * (34 + 5 * A * S / H)),
    (2, False, "none", lambda b, t: S * b * H * (10 + 24 / t + 5 * A * S / (H * t))),
    (4, False, "none", lambda b, t: S * b * H * (10 + 24 / t + 5 * A * S / (H * t))),
    (4, True, "none", lambda b, t: S * b * H * (34 / t + 5 * A * S / (H * t))),
    (4, True, "selective", lambda b, t: S * b * H * 34 / t),
])
def test_activations_per_layer_match_korthikanti(t, sp, recompute, closed_form):
    for b in (1, 2):
        plan = Plan(dp=8 // t, tp=t, mbs=b, sp=sp, recompute=recompute)
        assert _per_layer(plan) == pytest.approx(closed_form(b, t), rel=1e-9)


def test_full_recompute_keeps_only_layer_inputs():
    b, t = 2, 4
    plan = Plan(dp=2, tp=t, mbs=b, sp=True, recompute="full")
    assert _per_layer(plan) == pytest.approx(2 * S * b * H / t)


def test_logits_in_fp32_on_the_last_stage():
    t = 2
    lay = apply_plan(_spec(4), gpt_graph(H, A, S, 4, V), Plan(dp=2, tp=t, pp=2, mbs=1), A100)
    none_last = activation_bytes(lay)[-1]
    blocks = 2 * S * H * (10 + 24 / t + 5 * A * S / (H * t))
    post = 2 * S * H + 2 * S * H + 4 * S * V / t  # final layernorm input, output-layer input, fp32 logits
    assert none_last == pytest.approx(blocks + post)


def test_micro_batches_in_flight_per_schedule():
    spec, g = _spec(8, gpus=8, batch=64), gpt_graph(H, A, S, 8, V)
    assert in_flight(apply_plan(spec, g, Plan(dp=1, pp=8, mbs=1), A100)).tolist() == [8, 7, 6, 5, 4, 3, 2, 1]
    assert in_flight(apply_plan(spec, g, Plan(dp=1, pp=8, mbs=1, schedule="gpipe"), A100)).tolist() == [64] * 8
    spec16, g16 = _spec(16, gpus=4, batch=64), gpt_graph(H, A, S, 16, V)
    lay = apply_plan(spec16, g16, Plan(dp=1, pp=4, mbs=1, schedule="interleaved", v=2), A100)
    p, v = 4, 2
    assert in_flight(lay)[0] == pytest.approx(p * (1 + (p - 1) / (p * v)))  # Korthikanti's interleaving factor
    # 1F1B first stage: p micro-batches of l/p layers = l layers at micro-batch b whatever p is
    l1 = activation_bytes(apply_plan(_spec(8, gpus=2), g, Plan(dp=1, pp=2), A100))[0]
    l4 = activation_bytes(apply_plan(_spec(8, gpus=4), g, Plan(dp=1, pp=4), A100))[0]
    embed_free = abs(l1 - l4) / l1
    assert embed_free < 1e-9


def _states(plan: Plan, optimizer="adam", precision="bf16"):
    spec = _spec(4, optimizer=optimizer, precision=precision)
    g = gpt_graph(H, A, S, 4, V)
    parts = model_state_bytes(spec, apply_plan(spec, g, plan, A100))
    return g.params, dict(zip(("weights", "gradients", "optimizer"), (float(x[0]) for x in parts)))


@pytest.mark.parametrize("zero, expect", [
    (0, lambda p, d: (2 * p, 2 * p, 12 * p)),
    (1, lambda p, d: (2 * p, 2 * p, 12 * p / d)),
    (2, lambda p, d: (2 * p, 2 * p / d, 12 * p / d)),
    (3, lambda p, d: (2 * p / d, 2 * p / d, 12 * p / d)),
])
def test_zero_model_states_mixed_precision_adam(zero, expect):
    psi, states = _states(Plan(dp=8, zero=zero))
    assert (states["weights"], states["gradients"], states["optimizer"]) == pytest.approx(expect(psi, 8))


def test_optimizer_state_sgd_and_fp32():
    psi, states = _states(Plan(dp=8), optimizer="sgd")
    assert states["optimizer"] == pytest.approx(8 * psi)  # fp32 master + momentum
    psi, states = _states(Plan(dp=8), precision="fp32")
    assert sum(states.values()) == pytest.approx(16 * psi)  # weights 4 + grads 4 + Adam moments 8


def test_tp_and_pp_divide_model_states():
    spec, g = _spec(4), gpt_graph(H, A, S, 4, V)
    whole = model_state_bytes(spec, apply_plan(spec, g, Plan(dp=8), A100))[0][0]
    tp = model_state_bytes(spec, apply_plan(spec, g, Plan(dp=2, tp=4), A100))[0][0]
    assert tp == pytest.approx(whole / 4, rel=0.02)  # layernorm and position embedding stay replicated
    pp = model_state_bytes(spec, apply_plan(spec, g, Plan(dp=4, pp=2), A100))[0]
    assert np.sum(pp) == pytest.approx(whole)


def test_a_layers_saved_tensors_take_the_runs_activation_bytes():
    """Megatron-Core's tensor list in fp32 keeps 4-byte activations, twice bf16's; fp8 keeps bf16's outside its
    linears' own 1-byte input copies."""
    from predictor.frameworks import FRAMEWORKS
    from predictor.memory.saved import Dims, layer_tensors

    model, facts = _spec(4).model, FRAMEWORKS["megatron"].memory
    per_token = {p: sum(s.per_token for s in layer_tensors(Dims.of(model, RankShare(), p), facts, False)
                        if "(fp32)" not in s.name) for p in ("fp32", "bf16", "fp8")}  # fp32 statistics stay 4 bytes
    assert per_token["fp32"] == pytest.approx(2 * per_token["bf16"])
    assert per_token["fp8"] < per_token["bf16"]
