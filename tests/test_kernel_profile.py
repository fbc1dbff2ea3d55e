"""`scaledl profile --kernels` on this machine's CPU: real Ray actors (one per node of a two-raylet cluster), real
torch kernels and gloo collectives, the profile file and the prices a spec naming it gets."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from predictor.measure import kernel_profile as kp
from predictor.measure.design import log_det, quadratic_features
from predictor.measure.kernel_shapes import GRIDS, d_optimal, gemm_candidates

GEMM_SHAPES, GROUPED_SHAPES = 16, 6


@pytest.fixture(scope="module")
def measured(two_nodes, tmp_path_factory):
    from orchestrator.kernel_profile import profile_cluster

    path = tmp_path_factory.mktemp("kernels") / "cluster.json"
    seen: list[str] = []
    profile = profile_cluster("cpu", path, gemm_shapes=GEMM_SHAPES, grouped_shapes=GROUPED_SHAPES,
                              on_section=lambda key, done, total: seen.append(key))
    return path, profile, seen


def test_gemm_shapes_are_d_optimal():
    candidates = gemm_candidates(GRIDS["cpu"])
    chosen = d_optimal(candidates, GEMM_SHAPES, seed=0)
    features = quadratic_features(np.array(candidates, dtype=float))
    index = {c: i for i, c in enumerate(candidates)}
    best = log_det(features, [index[c] for c in chosen])
    rng = np.random.default_rng(1)
    randoms = [log_det(features, rng.choice(len(candidates), GEMM_SHAPES, replace=False)) for _ in range(20)]
    assert best > max(randoms)
    section = kp.sections("cpu", GEMM_SHAPES, GROUPED_SHAPES)[0]
    assert section.key == "gemm.fp32" and [tuple(s) for s in section.args["shapes"]] == chosen


def test_profile_has_every_section_with_sane_figures(measured):
    path, profile, seen = measured
    assert seen[-2:] == ["collectives.intra_node", "collectives.inter_node"] and len(seen) == len(set(seen))
    assert profile["missing"] == {}, profile["missing"]
    assert len(kp.machine(profile)["nodes"]) == 2 and profile["device"] == "cpu"
    for precision in ("fp32", "bf16"):
        points = np.array(profile["gemm"][precision]["points"])
        assert points.shape == (GEMM_SHAPES, 5) and (points[:, 4] > 0).all()
        flops = 2 * points[:, :4].prod(axis=1)
        # the largest products run faster than the smallest: the launch floor and blocking overhead fade
        assert points[np.argmax(flops), 4] > 2 * points[np.argmin(flops), 4]
    assert np.array(profile["grouped_gemm"]["fp32"]["points"]).shape == (GROUPED_SHAPES, 5)
    attention = profile["attention"]["sdpa-cpu"]
    assert len(attention["fwd"]) == len(GRIDS["cpu"].attention_seqs) and all(r[2] > 0 for r in attention["bwd"])
    copy = np.array(profile["memory_bound"]["points"])
    assert copy[:, 0].tolist() == sorted(copy[:, 0]) and copy[1:, 1].max() > 3 * copy[0, 1]  # small copies are slow
    assert 0 < profile["launch_s"] < 1e-3 and 0 < profile["host_op_s"] < 1e-3
    for link in ("intra_node", "inter_node"):
        curve = np.array(profile["collectives"][link]["all_reduce"])
        assert curve[-1, 1] > curve[0, 1]  # bus bandwidth grows with the message
    assert "2 nodes" in profile["sources"]["gemm.fp32"] and "2 node(s)" in profile["sources"]["provenance"]
    assert kp.read(path) == kp.read(path) and kp.read(path)["gemm"] == json.loads(json.dumps(profile["gemm"]))


def test_a_spec_naming_the_profile_is_priced_with_it(measured, tmp_path):
    from predictor.graph.cache import graph_for
    from predictor.models.analytical import AnalyticalPredictor
    from predictor.plan import Plan
    from predictor.spec.resolver import resolve
    from predictor.spec.workload import parse_spec

    path, profile, _ = measured
    model = {"family": "gpt2", "layers": 2, "hidden": 128, "heads": 4, "seq_len": 64, "vocab": 1000}

    def spec(cluster: dict):
        return parse_spec({"model": model, "training": {"global_batch": 4, "precision": "fp32"},
                           "cluster": {"nodes": 1, "gpus_per_node": 2, **cluster}})

    cpu = resolve(spec({"device": "cpu", "device_profile": str(path)})).device
    assert cpu.peak_flops["fp32"] == max(p[4] for p in profile["gemm"]["fp32"]["points"])
    assert cpu.mem_bandwidth == max(p[1] for p in profile["memory_bound"]["points"])
    assert set(cpu.op_links) == {"all_gather", "all_reduce", "reduce_scatter", "send_recv"}
    gpu_profile = tmp_path / "h100.json"
    gpu_profile.write_text(json.dumps({**profile, "device": "h100"}))
    gpus = spec({"device": "h100", "device_profile": str(gpu_profile)})
    h100 = resolve(gpus).device
    assert h100.extra["host_op_s"] == profile["host_op_s"] and h100.intra_node.generation == ""
    graph = graph_for(gpus.model)
    measured_link = AnalyticalPredictor().predict(gpus, graph, [Plan(dp=2, mbs=2)])[0]
    catalogue = spec({"device": "h100"})
    data_sheet = AnalyticalPredictor().predict(catalogue, graph, [Plan(dp=2, mbs=2)])[0]
    # gloo between two processes over loopback is several times slower than NVLink's data sheet (6x to 1000x on the
    # machines this ran on): the measured link, not the catalogue's, prices the gradient all-reduce
    assert measured_link.breakdown["dp_comm"] > 2 * max(data_sheet.breakdown["dp_comm"], 1e-6)
    from predictor.kernels.profile import PROFILES_DIR  # a shipped profile of published figures keeps the catalogue links

    shipped = resolve(spec({"device": "h100", "device_profile": str(PROFILES_DIR / "h100.json")})).device
    assert shipped.intra_node == resolve(catalogue).device.intra_node


def test_the_bench_script_compares_a_measured_profile_with_a_shipped_one(measured):
    from bench.cuda_profile import compare, nearest_ratios

    _, profile, _ = measured
    lines = compare(profile, "h200")
    assert any(line.startswith("gemm.fp32: measured / shipped median") for line in lines), lines
    assert any(line.startswith("gemm.bf16: measured / shipped median") for line in lines), lines
    ratio, exact = nearest_ratios(np.array([[1, 256, 256, 256, 2.0], [1, 300, 256, 256, 4.0]]),
                                  np.array([[1, 256, 256, 256, 1.0], [1, 4096, 4096, 4096, 8.0]]))
    assert ratio.tolist() == [2.0, 4.0] and exact == 1
    assert compare(profile) == ["no shipped profile for device 'cpu': nothing to compare with (--against DEVICE "
                                "names one)"]


def test_resume_measures_only_what_is_missing(measured, tmp_path):
    from orchestrator.kernel_profile import profile_cluster

    path, profile, _ = measured
    partial = tmp_path / "partial.json"
    shutil.copy(path, partial)
    cut = kp.read(partial)
    del cut["sources"]["memory_bound"], cut["memory_bound"]
    kp.write(cut, partial)
    with pytest.raises(kp.KernelProfileError, match="--resume"):
        profile_cluster("cpu", partial, gemm_shapes=GEMM_SHAPES, grouped_shapes=GROUPED_SHAPES)
    again = profile_cluster("cpu", partial, resume=True, gemm_shapes=GEMM_SHAPES, grouped_shapes=GROUPED_SHAPES)
    assert again["gemm"] == profile["gemm"]  # kept, not re-measured
    assert len(again["memory_bound"]["points"]) == len(GRIDS["cpu"].copy_bytes)


def test_cuda_without_a_gpu_exits_2(scaledl, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = scaledl.run("profile", "--device", "cuda", "--kernels", str(tmp_path / "k.json"))
    assert result.returncode == 2 and "no CUDA GPU" in result.stderr


def test_revalidate_compares_the_profile_with_fresh_measurements(measured, tmp_path):
    from orchestrator.kernel_profile import recheck_cluster

    path, profile, _ = measured
    rechecks, changed, kind = recheck_cluster(path, per_section=2)
    assert kind == "cpu" and changed == []
    sections = {r.section for r in rechecks}
    assert {"gemm.fp32", "gemm.bf16", "grouped_gemm.fp32", "attention.sdpa-cpu", "memory_bound", "launch_s"} <= sections
    assert all(len(r.ratios) == (2 if r.section != "launch_s" else 2) and min(r.ratios) > 0 for r in rechecks)
    slower = tmp_path / "slower.json"  # a profile whose figures are 3x what this machine does: it has drifted
    tripled = kp.read(path)
    for table in tripled["gemm"].values():
        table["points"] = [[*p[:-1], 3 * p[-1]] for p in table["points"]]
    kp.write(tripled, slower)
    moved, _, _ = recheck_cluster(slower, per_section=2)
    assert {r.section for r in moved if r.deviation > 0.5} >= {"gemm.fp32", "gemm.bf16"}
