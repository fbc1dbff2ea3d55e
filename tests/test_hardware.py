"""Hardware catalogue, link overrides from the spec, and the measured `cpu` device."""

import json
import shutil
from dataclasses import replace

import pytest

from predictor.measure import device as measure_device
from predictor.models.roofline import AnalyticalConfig, device_config, gemm_efficiency
from predictor.spec.hardware import DEVICES, GB, GENERATIONS, TFLOPS, device_facts, gemm_facts
from predictor.spec.resolver import get_device
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec


def test_catalogue_uses_dense_peaks():
    a100 = get_device("a100-80gb")
    assert a100.flops("bf16") == 312 * TFLOPS and a100.flops("fp16") == 312 * TFLOPS  # not the 624 sparsity figure
    assert get_device("h100").flops("bf16") == 989 * TFLOPS
    for name, dev in DEVICES.items():
        if dev is not None:
            assert dev.source and dev.intra_node.source and dev.mem_capacity > 0 and dev.extra["sms"] > 0


def test_cluster_link_overrides():
    spec = parse_spec({"model": {"preset": "gpt3-1.3b"}, "training": {"global_batch": 8},
                       "cluster": {"device": "a100-80gb", "nodes": 2, "gpus_per_node": 8,
                                   "inter_node": {"bandwidth_gbps": 12.5, "latency_us": 7}}})
    dev = get_device("a100-80gb", spec.cluster)
    assert dev.inter_node.bandwidth == 12.5 * GB and dev.inter_node.latency == pytest.approx(7e-6)
    assert dev.intra_node == get_device("a100-80gb").intra_node
    with pytest.raises(KeyError, match="unknown device 'tpu'"):
        get_device("tpu")


def test_cpu_is_measured_once_and_cached(measured_cpu_profile, tmp_path, monkeypatch):
    shutil.copy(measured_cpu_profile, tmp_path / measure_device.CACHE_FILE)  # the session's one measurement
    monkeypatch.setenv("SCALEDL_CACHE", str(tmp_path))
    monkeypatch.setattr(measure_device, "_MEMO", {})
    cpu = get_device("cpu")
    assert cpu.measured and cpu.flops("fp32") > 1e9 and cpu.mem_bandwidth > 1e8
    assert cpu.intra_node.bandwidth > 1e7 and 0 < cpu.intra_node.latency < 0.01
    record = json.loads((tmp_path / measure_device.CACHE_FILE).read_text())
    assert record["fingerprint"] == measure_device.fingerprint()
    ops = {op for op, *_ in record["collectives"]}
    assert ops == {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}
    # in-step costs: a collective between computing ranks costs more than the idle link's α-β time; a send/recv's
    # excess over the computation alone is a difference of two noisy means, 0 where it hides (seen on 2 cores)
    steps = record["step_costs"]
    assert steps["collective_s"] > cpu.intra_node.latency and steps["p2p_s"] >= 0 and steps["tp_linear_s"] > 0
    assert set(cpu.extra) == {"collective_call_s", "p2p_call_s", "tp_linear_s"}
    assert all(0 <= v < 0.1 for v in cpu.extra.values())
    # a fresh process (empty memo) reads the cache instead of measuring again: identical floats
    monkeypatch.setattr(measure_device, "_MEMO", {})
    again = get_device("cpu")
    assert again.peak_flops == cpu.peak_flops and again.intra_node == cpu.intra_node
    # a profile measured beside other work is still used, but says so whenever it is, naming the file to delete
    cores = int(record["fingerprint"]["cores"])
    (tmp_path / measure_device.CACHE_FILE).write_text(json.dumps({**record, "load_average": 1.0 + cores}))
    monkeypatch.setattr(measure_device, "_MEMO", {})
    with pytest.warns(UserWarning, match=r"cpu_device\.json\) was measured while other work ran"):
        busy = get_device("cpu")
    assert busy.peak_flops == cpu.peak_flops
    assert measure_device.busy_measurement({**record, "load_average": 1.0}) is None  # only the measuring process
    # a cache from another machine or torch version is not trusted
    record["fingerprint"]["torch"] = "0.0"
    (tmp_path / measure_device.CACHE_FILE).write_text(json.dumps(record))
    monkeypatch.setattr(measure_device, "_MEMO", {})
    monkeypatch.setattr(measure_device, "measure_cpu", lambda: pytest.fail("should re-measure") or {})
    with pytest.raises(pytest.fail.Exception, match="should re-measure"):
        get_device("cpu")


def test_measured_gpus_map_to_the_catalogue():
    from predictor.spec.hardware import catalogue_name

    assert catalogue_name("cpu:Intel(R) Xeon(R) Processor:2c") == "cpu"
    assert catalogue_name("cuda:NVIDIA H200") == "h200"
    assert catalogue_name("cuda:NVIDIA H20") == "h20"
    assert catalogue_name("cuda:NVIDIA A100-SXM4-80GB") == "a100-80gb"
    assert catalogue_name("cuda:NVIDIA H100 80GB HBM3") == "h100"
    with pytest.raises(KeyError, match="'cuda:NVIDIA L4' is not in the catalogue"):
        catalogue_name("cuda:NVIDIA L4")


DATASET_PROFILE = "predictor/data/cpu/device.json"


def _cpu_spec(**cluster):
    return parse_spec({"model": {"family": "bert", "hidden": 64, "layers": 2, "heads": 2, "seq_len": 32, "vocab": 1000},
                       "training": {"global_batch": 4, "precision": "fp32"},
                       "cluster": {"device": "cpu", "nodes": 1, "gpus_per_node": 2, **cluster}})


def test_a_device_profile_prices_the_spec_as_on_the_machine_that_measured_it(tmp_path):
    from predictor.graph.cache import graph_for
    from predictor.models.analytical import AnalyticalPredictor
    from predictor.plan import Plan
    from predictor.spec.resolver import resolve

    record = json.loads(open(DATASET_PROFILE).read())
    pinned = resolve(_cpu_spec(device_profile=DATASET_PROFILE)).device
    assert pinned.peak_flops == record["peak_flops"] and pinned.mem_bandwidth == record["mem_bandwidth"]
    assert pinned.extra["tp_linear_s"] == record["step_costs"]["tp_linear_s"]
    assert "device.json" in pinned.source and pinned.measured
    # twice the FLOP/s and no step costs: a different machine, priced from its own file
    faster = {**record, "peak_flops": {k: 2 * v for k, v in record["peak_flops"].items()}}
    del faster["step_costs"]
    (tmp_path / "device.json").write_text(json.dumps(faster))
    spec = _cpu_spec(device_profile=str(tmp_path / "device.json"))
    assert resolve(spec).device.flops("fp32") == 2 * pinned.flops("fp32") and resolve(spec).device.extra == {}
    plans = [Plan(tp=2)]
    graph = graph_for(spec.model)
    slow = AnalyticalPredictor().predict(_cpu_spec(device_profile=DATASET_PROFILE), graph, plans)[0]
    fast = AnalyticalPredictor().predict(spec, graph, plans)[0]
    assert fast.breakdown["compute"] < slow.breakdown["compute"] and fast.breakdown["tp_comm"] < slow.breakdown["tp_comm"]
    # the profile prices each collective on its own link, unless the spec gives the node's link itself
    assert set(pinned.op_links) == {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}
    link = {"bandwidth_gbps": 10, "latency_us": 5}
    overridden = resolve(_cpu_spec(device_profile=DATASET_PROFILE, intra_node=link)).device
    assert overridden.op_links == {} and overridden.intra_node.bandwidth == 10 * GB


def test_device_profile_errors_name_the_field_and_the_fix(tmp_path):
    from predictor.spec.resolver import resolve
    from predictor.spec.workload import SpecError

    with pytest.raises(SpecError, match=r"device_profile .*nope.json' does not exist.*scaledl profile"):
        _cpu_spec(device_profile=str(tmp_path / "nope.json"))
    with pytest.raises(SpecError, match=r"device_profile .* is not a kernel profile; a GPU \('a100-80gb'\).*--kernels"):
        parse_spec({"model": {"preset": "gpt3-1.3b"}, "training": {"global_batch": 8},
                    "cluster": {"device": "a100-80gb", "device_profile": DATASET_PROFILE}})
    (tmp_path / "gpu.json").write_text(json.dumps({"peak_flops": {}, "link": None, "collectives": []}))
    with pytest.raises(ValueError, match=r"cluster.device_profile .*gpu.json' is not a readable device profile"):
        resolve(_cpu_spec(device_profile=str(tmp_path / "gpu.json"))).device


def test_profile_dataset_is_priced_with_its_own_device_profile():
    from predictor.data.evaluate import load_profile_dataset
    from predictor.spec.resolver import resolve

    data = load_profile_dataset(families=("bert",), with_layers=False)
    record = json.loads(open(DATASET_PROFILE).read())
    assert {resolve(s.spec).device.peak_flops["fp32"] for s in data.samples} == {record["peak_flops"]["fp32"]}
    assert data.provenance["device_profile"].endswith("predictor/data/cpu/device.json")


def test_device_facts_are_sourced_and_describe_catalogue_devices():
    facts = device_facts()
    assert set(facts) == {"gemm", "low_precision_recipes", "memory_bound", "collectives", "collective_curves",
                          "moe_dispatch"}
    for section, entries in facts.items():
        for entry in entries:
            assert len(entry["source"]) > 20, (section, entry)  # a citation, not a placeholder
            if "generation" in entry:
                assert entry["generation"] in set(GENERATIONS.values())
                # a device outside the catalogue names its data-sheet bandwidth, or the link it was measured on
                if "datasheet_gbps" not in entry and "link_gbps" not in entry:
                    assert entry["device"] in DEVICES and GENERATIONS[entry["device"]] == entry["generation"]
    # a GEMM table's achieved rate never exceeds the device's dense peak at that precision
    for entry in facts["gemm"]:
        peak = DEVICES[entry["device"]].flops(entry["precision"])
        assert all(0 < t * TFLOPS < peak for *_, t in entry.get("points", ())) and entry.get("best_tflops", 1) * TFLOPS < peak
    assert gemm_facts("blackwell", "fp8")[0].points and not gemm_facts("ampere", "bf16")


def test_first_principles_take_gemm_efficiency_from_the_generations_public_tables():
    # the saturating curve with the fitted maximum follows the large points of each table (every one within 30 %,
    # 12 % on average): the analytical model's GEMMs run at what the device reaches, not at a constant fitted on runs
    errors = []
    for gen in ("hopper", "blackwell"):
        cfg = device_config(gen)
        for precision, scale in (("bf16", 1.0), ("fp8", cfg.fp8_gemm_eff)):
            for fact in gemm_facts(gen, precision):
                device = DEVICES[fact.device]
                for b, m, n, k, achieved in fact.points:
                    if min(m, n, k) >= 1024:
                        eff = gemm_efficiency(m, n, k, b, cfg, device.extra["sms"]) * scale
                        errors.append(abs(eff * device.flops(precision) / achieved - 1))
    assert len(errors) > 20 and max(errors) < 0.3 and sum(errors) / len(errors) < 0.12
    # Blackwell's BF16 GEMMs reach a smaller share of their peak than Hopper's (XLA's tables: 63 % vs 79 % at 4096³)
    assert device_config("blackwell").gemm_eff_max < device_config("hopper").gemm_eff_max < 0.95
    # no public GEMM table in the catalogue: the default GEMM constants (its bandwidth share is the device facts')
    assert replace(device_config("ampere"), bw_eff=0.9) == AnalyticalConfig()
