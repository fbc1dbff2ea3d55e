"""The one translation of vTrain's published A100 rows into workloads (training and both A100 benches)."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest

from predictor.data.evaluate import load_vtrain, megatron_vocab, vtrain_workload
from predictor.spec.resolver import resolve
from tests.vtrain_rows import SINGLE

MULTI = SINGLE.with_name("vtrain_ground_truth_multi.csv")


def test_megatron_pads_gpt2s_vocabulary_to_a_multiple_of_128_tp():
    assert [megatron_vocab(tp) for tp in (1, 2, 4, 8, 16)] == [50304, 50432, 50688, 51200, 51200]
    assert all(megatron_vocab(tp) % (128 * tp) == 0 for tp in (1, 2, 4, 8, 16))


def test_a_row_runs_in_vtrains_setting():
    row = {"# GPUs": 64, "global batch": 512, "micro batch": 4, "hidden size": 3072, "attention heads": 32,
           "# layers": 30, "sequence length": 2048, "tensor parallelism": 16, "data parallelism": 4,
           "pipeline parallelism": 1}
    spec, plan = vtrain_workload(row)
    assert (spec.cluster.nodes, spec.cluster.gpus_per_node) == (8, 8)
    assert spec.model.vocab == 51200 and spec.training.precision == "fp16"
    assert (plan.tp, plan.dp, plan.pp, plan.mbs, plan.recompute, plan.schedule) == (16, 4, 1, 4, "full", "1f1b")
    device = resolve(spec).device
    assert device.intra_node.bandwidth == pytest.approx(300e9)  # the catalogue's NVLink (evaluate.py says why)
    assert device.inter_node.bandwidth == pytest.approx(12.5e9)  # 800 Gb/s per 8-GPU node


@pytest.mark.parametrize("path", [SINGLE, MULTI], ids=["single", "multi"])
def test_every_published_row_loads_with_its_row_index(path):
    """Both files load whole, cross-node tensor parallelism included (vTrain ran tp=16 on 64 and 256 GPUs)."""
    if not path.is_file():
        pytest.skip(f"{path} not present")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a skipped row would warn
        samples = load_vtrain(path)
    frame = pd.read_csv(path, encoding="utf-8-sig")
    assert len(samples) == len(frame)
    index = [int(s.config_id.rsplit(":", 1)[1]) for s in samples]
    assert index == list(range(len(frame)))
    assert [s.iter_time_s * 1e3 for s in samples] == pytest.approx(frame["iteration time (ms)"].tolist())
