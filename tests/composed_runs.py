"""A tiny model of a family trained for real by the composed runner (gloo, one process per rank), and the loss
parity every plan's ranks must keep with a single process: shared by tests/test_compose.py and
tests/test_proposed_plans_run.py."""

from __future__ import annotations

import pytest

from predictor.measure.iteration import WorkerPool
from predictor.plan import Plan
from predictor.spec.workload import ModelSpec

# Relative tolerance on each step's loss: float32 sums in another order (measured: <= 4e-7 over all kinds)
PARITY_RTOL = 2e-6
NO_DROPOUT = {"gpt2": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
              "bert": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
              "t5": {"dropout_rate": 0.0}}


def tiny(family: str) -> ModelSpec:
    if family in ("vit", "deit"):
        return ModelSpec(family=family, hidden=64, layers=4, heads=4, image_size=32, patch_size=8)
    extra = {"kv_heads": 2, "ffn_hidden": 128} if family == "llama" else {}
    return ModelSpec(family=family, hidden=64, layers=4, heads=4, seq_len=32, vocab=256,
                     kwargs=NO_DROPOUT.get(family, {}), **extra)


def run(pool: WorkerPool, spec: ModelSpec, plan: str, batch: int = 8, steps: int = 2, warmup: int = 1) -> list[dict]:
    job = {"kind": "iteration", "spec_json": spec.model_dump_json(), "plan": plan, "batch": batch, "warmup": warmup,
           "steps": steps, "optimizer": "adam", "lr": 0.01}
    answers = pool.run(job, Plan.parse(plan).gpus, timeout=240)
    assert all(a["status"] == "ok" for a in answers), [a.get("traceback", a.get("error")) for a in answers]
    return answers


def assert_parity(answers: list[dict], reference: list[float]) -> None:
    for a in answers:
        assert a["losses"] == pytest.approx(reference, rel=PARITY_RTOL), (a["losses"], reference)
