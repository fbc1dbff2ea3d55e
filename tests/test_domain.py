"""The training domain: ranges and settings seen, what lies outside them, merging and round trip."""

from __future__ import annotations

from pathlib import Path

from predictor.models.domain import TrainingDomain
from predictor.plan import Plan
from predictor.spec.workload import parse_spec

PROFILE = Path("predictor/data/cpu/device.json")  # the CPU dataset's machine: no measuring of this one


def spec(hidden: int = 256, vocab: int = 4096, precision: str = "fp32", family: str = "gpt2", profile: Path = PROFILE):
    return parse_spec({"model": {"family": family, "hidden": hidden, "layers": 4, "heads": 4, "seq_len": 128,
                                 "vocab": vocab},
                       "training": {"global_batch": 8, "precision": precision},
                       "cluster": {"device": "cpu", "nodes": 1, "gpus_per_node": 2, "device_profile": str(profile)}})


TRAINED = TrainingDomain.of([(spec(128), Plan(mbs=8)), (spec(512), Plan(dp=2, mbs=4, zero=3))])


def test_inside_the_training_data_nothing_is_flagged() -> None:
    assert TRAINED.outside_workload(spec(256)) == []
    assert TRAINED.outside_plan(Plan(dp=2, mbs=4)) == []


def test_sizes_and_settings_outside_are_named_with_what_was_trained() -> None:
    assert TRAINED.outside_workload(spec(1024, vocab=30522, precision="bf16", family="llama")) == [
        "hidden 1024 (trained 128-512)", "vocab 30522 (trained 4096)", "precision=bf16 (trained fp32)",
        "family=llama (trained gpt2)"]
    assert TRAINED.outside_plan(Plan(dp=2, mbs=4, zero=1, recompute="full")) == [
        "zero=1 (trained 0, 3)", "recompute=full (trained none)"]
    assert TRAINED.outside_plan(Plan(tp=2, mbs=8, sp=True)) == ["tp 2 (trained 1)", "sp=true (trained false)"]


def test_merging_grows_the_domain_and_the_dict_round_trips() -> None:
    grown = TRAINED.merged([(spec(1024), Plan(dp=2, mbs=4, zero=1))])
    assert grown.outside_workload(spec(1024)) == [] and grown.outside_plan(Plan(dp=2, mbs=4, zero=1)) == []
    assert TRAINED.outside_plan(Plan(dp=2, mbs=4, zero=1)) != []  # the original is unchanged
    assert TrainingDomain.from_dict(grown.to_dict()) == grown
    assert TrainingDomain.from_dict(None) is None


def test_a_domain_from_before_families_flags_no_family() -> None:
    old = TrainingDomain.from_dict({"ranges": TRAINED.ranges, "seen": {k: v for k, v in TRAINED.seen.items() if k != "family"}})
    assert old.outside_workload(spec(256, family="bert")) == []


def test_a_measured_device_profiled_on_other_hardware_is_outside(tmp_path) -> None:
    """`cpu` is whatever machine runs the prediction: a checkpoint trained on one CPU model's profile says
    so when the machine (here a real profile re-labelled as taken on another CPU) is not that model."""
    import json

    record = json.loads(PROFILE.read_text())
    trained_on = record["fingerprint"]["cpu"]
    record["fingerprint"]["cpu"] = "AMD EPYC"
    other = tmp_path / "device.json"
    other.write_text(json.dumps(record))

    domain = TrainingDomain.of([(spec(), Plan(mbs=8))])
    assert domain.outside_workload(spec()) == []
    assert domain.outside_workload(spec(profile=other)) == [f"hardware=AMD EPYC (trained {trained_on})"]


def test_a_machine_under_the_same_cpu_name_is_told_apart_by_its_figures(tmp_path) -> None:
    """Cloud VMs often report a generic CPU name: the profile's measured FLOP/s and bandwidth tell two
    machines apart, beyond the few per cent that re-measuring one machine moves them."""
    import json

    from predictor.spec.resolver import get_device
    from predictor.spec.workload import ClusterSpec

    record = json.loads(PROFILE.read_text())
    trained = TrainingDomain.of([(spec(), Plan(mbs=8))])

    def relabelled(name: str, flops_scale: float, bandwidth_scale: float) -> Path:
        changed = json.loads(json.dumps(record))
        changed["peak_flops"] = {k: v * flops_scale for k, v in record["peak_flops"].items()}
        changed["mem_bandwidth"] = record["mem_bandwidth"] * bandwidth_scale
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(changed))
        return path

    remeasured = relabelled("remeasured", 0.9, 1.1)
    assert trained.outside_workload(spec(profile=remeasured)) == []
    other = relabelled("other", 0.5, 2.0)
    gflops, gbs = record["peak_flops"]["fp32"] / 1e9, record["mem_bandwidth"] / 1e9
    assert trained.outside_workload(spec(profile=other)) == [
        f"hardware fp32 GFLOP/s {gflops / 2:.0f} (trained {gflops:.0f})",
        f"hardware memory GB/s {2 * gbs:.0f} (trained {gbs:.0f})"]
    device = get_device("cpu", ClusterSpec(device="cpu", device_profile=str(other)))
    assert trained.outside_hardware(device) == trained.outside_workload(spec(profile=other))
    assert trained.outside_hardware(get_device("cpu", ClusterSpec(device="cpu", device_profile=str(PROFILE)))) == []


def test_advice_on_other_hardware_says_how_to_adapt() -> None:
    from predictor.models.domain import advice

    assert advice(["vocab 30522 (trained 4096)"]) == "expect larger errors than its measured accuracy"
    other = advice(["vocab 30522 (trained 4096)", "hardware=AMD EPYC (trained Intel(R) Xeon(R) Processor)"])
    assert other.startswith("expect larger errors") and "run `scaledl adapt`" in other
