"""The shipped device profiles (predictor/data/profiles) and their loader: every catalogue device has one, every
section with data names its source and every absent one says why, the format round-trips, bad files are refused
naming the field, and the GEMM sections are XLA's measured tables as bench/device_profiles.py builds them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import device_profiles
from predictor.spec.hardware import DEVICES, GENERATIONS, TFLOPS, gemm_facts
from predictor.kernels.profile import (PROFILES_DIR, ProfileError, parse_profile, profile_json, read_profile,
                                       shipped_profile, write_profile)


@pytest.mark.parametrize("device", sorted(GENERATIONS))
def test_every_catalogue_device_has_a_profile_that_accounts_for_each_section(device):
    profile = shipped_profile(device)
    assert profile is not None and profile.device == device and profile.generation == GENERATIONS[device]
    for section in ("gemm", "launch_s", "host_op_s", "collectives", "grouped_gemm"):
        held = {"gemm": bool(profile.gemm), "launch_s": profile.launch_s is not None,
                "host_op_s": profile.host_op_s is not None, "collectives": bool(profile.collectives),
                "grouped_gemm": bool(profile.grouped_gemm)}[section]
        assert held or section in profile.missing, f"{device}: {section} neither held nor explained"


def test_measured_gemm_grids_are_xla_tables_on_the_devices_they_were_measured_on():
    h100, b200 = shipped_profile("h100"), shipped_profile("b200")
    assert h100.gemm_grid("bf16").shape == (375, 5) and h100.gemm_grid("fp32").shape == (375, 5)
    assert b200.gemm_grid("fp8").shape == (375, 5)
    assert shipped_profile("a100-80gb").gemm_grid("bf16") is None
    # the catalogue's selected points are entries of the tables
    for gen, profile in (("hopper", h100), ("blackwell", b200)):
        for precision in ("bf16", "fp8"):
            for fact in gemm_facts(gen, precision):
                grid = {tuple(r[:4]): r[4] for r in (profile.gemm_grid(precision) if fact.points else [])}
                for b, m, n, k, rate in fact.points:
                    assert grid[(b, m, n, k)] == pytest.approx(rate, rel=1e-3)
    # 4096^3 BF16 on H100: 783 TFLOPS, 79 % of the data sheet
    big = h100.gemm_grid("bf16")
    assert big[(big[:, 1:4] == 4096).all(axis=1) & (big[:, 0] == 1), 4][0] / TFLOPS == pytest.approx(783.3, abs=0.1)


def test_the_builder_reproduces_the_shipped_gemm_sections():
    for device, (key, why) in device_profiles.TABLES.items():
        shipped = shipped_profile(device)
        rebuilt = device_profiles.with_gemm(shipped, key, device_profiles.read_extract(key), why)
        assert profile_json(rebuilt) == profile_json(shipped)


def test_the_builder_reads_the_header_format(tmp_path):
    header = tmp_path / "matmul_interpolator_data.h"
    header.write_text('constexpr char kDefaultMatmulPTable[] = R"pb(\n entries {\n  key: "sm_90"\n  value {\n'
                      '   entries {\n    b: 1\n    m: 256\n    n: 512\n    k: 1024\n'
                      '    flops { key: "bf16xbf16->bf16" value: 39107729603729 }\n'
                      '    flops { key: "f32xf32->f32" value: 21902370757180 }\n   }\n  }\n }\n)pb";\n')
    tables = device_profiles.read_header(header, "sm_90")
    assert tables["bf16"].tolist() == [[1, 256, 512, 1024, 39107729603729]]
    extract = device_profiles.read_extract("sm_90")["bf16"]
    assert (1, 256, 512, 1024, 39107729603729) in set(map(tuple, extract))


def test_round_trip(tmp_path):
    profile = shipped_profile("h100")
    write_profile(profile, tmp_path / "h100.json")
    again = read_profile(tmp_path / "h100.json")
    assert profile_json(again) == profile_json(profile)
    assert not list(tmp_path.glob(".*tmp"))


def _raw(**changes):
    raw = json.loads((PROFILES_DIR / "h100.json").read_text())
    raw.update(changes)
    return raw


@pytest.mark.parametrize("raw, names", [
    (lambda: {**_raw(), "sources": {}}, "sources: no source for attention.cudnn"),
    (lambda: _raw(gemm={"bf16": {"points": [[1, 256, 256, 1e12]]}}), "gemm.bf16.points"),
    (lambda: _raw(gemm={"bf16": {"points": [[1, 256, 256, 256, -1]]}}), "finite and positive"),
    (lambda: _raw(gemm={"bf16": {}}), "gemm.bf16: give points or best"),
    (lambda: _raw(launch_s="4us"), "launch_s"),
    (lambda: _raw(attention={"cudnn": {"forward": []}}), "attention.cudnn: unknown keys"),
    (lambda: _raw(speed=1), "unknown keys ['speed']"),
    (lambda: _raw(device=""), "device"),
])
def test_bad_files_are_refused_naming_the_field(raw, names):
    with pytest.raises(ProfileError, match=names.replace("[", r"\[").replace("]", r"\]")):
        parse_profile(raw(), "h100.json")


def test_a_missing_or_broken_file_names_the_path(tmp_path):
    with pytest.raises(ProfileError, match="no such device profile"):
        read_profile(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ProfileError, match="bad.json: not JSON"):
        read_profile(tmp_path / "bad.json")
    assert np.isfinite(shipped_profile("b200").gemm_grid("bf16")).all()


@pytest.mark.parametrize("device", sorted(GENERATIONS))
def test_no_measured_rate_exceeds_the_devices_peak(device):
    """A profile's GEMM and attention rates stay under the data-sheet dense peak of their precision (attention: BF16)."""
    profile, catalogue = shipped_profile(device), DEVICES[device]
    for precision, table in profile.gemm.items():
        peak = catalogue.flops(precision)
        assert (table.points[:, 4] < peak).all() and table.best < peak, (device, precision)
    for backend, table in profile.attention.items():
        assert all((rows[:, 2] < catalogue.flops("bf16")).all() for rows in table.passes.values()), backend
        assert table.best_fwd < catalogue.flops("bf16")
