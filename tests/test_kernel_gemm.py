"""A GEMM's rate from a device profile's measured grid (predictor.kernels.gemm): the grid's own points come back,
larger GEMMs run as more tiles, smaller ones keep the smallest's time, devices without a grid take their generation's
by peak, and the analytical model prices a layer's GEMMs with it."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.costs.parallel import shard_nodes
from predictor.graph.cache import graph_for
from predictor.kernels.gemm import GemmGrid, gemm_grid, measured_gemm
from predictor.kernels.profile import shipped_profile
from predictor.models.roofline import AnalyticalConfig, gemm_efficiency, layer_times
from predictor.plan.share import RankShare
from predictor.spec.resolver import get_device, resolve
from predictor.spec.workload import parse_spec

H100 = gemm_grid(shipped_profile("h100"), "bf16")


def test_the_grid_gives_back_its_measured_points():
    points = shipped_profile("h100").gemm_grid("bf16")
    b, m, n, k, rate = points.T
    assert np.allclose(H100.rate(m, n, k, b), rate, rtol=1e-9)


def test_larger_gemms_are_more_tiles_and_smaller_ones_keep_the_smallest_time():
    assert H100.rate(8192, 4096, 4096) == pytest.approx(H100.rate(4096, 4096, 4096, 2))
    assert H100.rate(4096, 8192, 4096, 2) == pytest.approx(H100.rate(4096, 4096, 4096, 4))
    assert H100.rate(65536, 4096, 4096) == pytest.approx(H100.rate(4096, 4096, 4096, 4))  # the device is full
    assert H100.rate(4096, 4096, 16384) == pytest.approx(H100.rate(4096, 4096, 4096))
    small, floor = H100.rate(64, 256, 256), H100.rate(256, 256, 256)
    assert 64 / small == pytest.approx(256 / floor)  # the same time for a quarter of the work
    # between points: log-rate between its neighbours'
    mid = H100.rate(3000, 4096, 4096)
    assert H100.rate(2048, 4096, 4096) < mid < H100.rate(4096, 4096, 4096)


def test_the_measured_table_is_below_the_saturating_curve_for_mid_sized_gemms():
    """What the profile adds: a (4096, 1024, 1024) BF16 GEMM runs at 49 % of H100's peak where the wave-quantised
    curve fitted to the same table's large GEMMs gives 65 %; at 4,096^3 both are near 78-79 %."""
    cfg = AnalyticalConfig(gemm_eff_max=0.878)
    peak = get_device("h100").flops("bf16")
    assert H100.rate(4096, 1024, 1024) / peak == pytest.approx(0.493, abs=0.005)
    assert gemm_efficiency(4096, 1024, 1024, 1, cfg, 132) == pytest.approx(0.652, abs=0.005)
    assert H100.rate(4096, 4096, 4096) / peak == pytest.approx(0.792, abs=0.005)


def test_devices_without_a_grid_take_their_generations_by_peak():
    gb200, b200 = get_device("gb200"), get_device("b200")
    grid, scale = measured_gemm(gb200, "fp8")
    assert grid is measured_gemm(b200, "fp8")[0] and scale == pytest.approx(5000 / 4500)
    assert measured_gemm(get_device("h200"), "bf16")[1] == 1.0  # its own (H100's measured) grid
    assert measured_gemm(get_device("a100-80gb"), "bf16") is None  # no Ampere grid: the curve prices it
    assert measured_gemm(get_device("h100"), "fp8") is None  # only a best figure
    assert gemm_grid(None, "bf16") is None


def test_an_incomplete_grid_is_refused():
    points = shipped_profile("h100").gemm_grid("bf16")
    with pytest.raises(ValueError, match="full grid"):
        GemmGrid.of(points[1:])


def test_a_linear_is_priced_at_the_grid_rate_unless_the_framework_fitted_its_own():
    """torchtitan on H100 (no constant fitted on Hopper) prices a linear at the grid's rate for its shape;
    Megatron-Core, whose gemm_eff_max was fitted on Hopper, keeps the curve it was fitted with."""
    def spec(framework):
        return parse_spec({"model": {"preset": "llama3-8b"},
                           "training": {"global_batch": 64, "precision": "bf16", "framework": framework},
                           "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}})

    h100 = get_device("h100")
    titan = spec("torchtitan")
    graph = graph_for(titan.model)
    cfg = AnalyticalConfig()
    fwd, _ = layer_times(resolve(titan, h100), graph, RankShare(), 1, cfg)
    nodes = shard_nodes(graph, RankShare(), titan.model.heads)
    i = int(np.flatnonzero((nodes.kind == "linear") & nodes.repeated)[0])
    rate = H100.rate(nodes.gemm_m[i], nodes.gemm_n[i], nodes.gemm_k[i], nodes.gemm_batch[i])
    assert fwd[i] == pytest.approx(nodes.fwd_flops[i] / rate + cfg.launch_s, rel=1e-6)
    megatron, _ = layer_times(resolve(spec("megatron"), h100), graph, RankShare(), 1, cfg)
    curve = h100.flops("bf16") * gemm_efficiency(nodes.gemm_m[i], nodes.gemm_n[i], nodes.gemm_k[i], 1, cfg, 132)
    assert megatron[i] == pytest.approx(nodes.fwd_flops[i] / curve + cfg.launch_s, rel=1e-6)
