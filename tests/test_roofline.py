"""The byte/op model of chapter 05: hand-checked counts, floors, plausible measurements."""

import math

import pytest
import torch

from mambalearn import roofline
from mambalearn.scan.sequential import selective_scan_sequential
from mambalearn.testing import assert_close


def test_fused_bytes_by_hand():
    b, d, l, n = 8, 2048, 2048, 16
    M, S = b * d * l, b * n * l
    want = 2 * (3 * M + 2 * S) + 4 * (d * n + 2 * d) + 2 * M  # u, Δ, z, B, C, A, D, bias; y
    cost = roofline.selective_scan_cost(b, d, l, n)
    assert cost.bytes == want
    assert cost.exps == b * d * l * n + 4 * M


def test_materializing_costs_grow_with_n():
    """Fusion saves a factor that grows with the state size n, not a constant."""
    ratios = []
    for n in (4, 16, 64):
        fused = roofline.selective_scan_cost(2, 64, 256, n).bytes
        ratios.append(roofline.selective_scan_cost(2, 64, 256, n, impl="naive").bytes / fused)
        store = roofline.selective_scan_cost(2, 64, 256, n, impl="store_states").bytes
        assert fused < store < ratios[-1] * fused
    assert ratios[0] < ratios[1] < ratios[2] and ratios[2] > 3 * ratios[0]


def test_floor_is_the_largest_term():
    m = roofline.H200
    cost = roofline.Cost(bytes=m.bandwidth * 1e-3, flops=0.0, exps=m.exps * 2e-3)  # 1 ms, 2 ms
    f = roofline.floor(cost)
    assert f["bound"] == "exps"
    assert math.isclose(f["bytes_ms"], 1.0, rel_tol=1e-9)
    assert math.isclose(f["floor_ms"], f["exps_ms"]) and f["floor_ms"] > 1.9


def test_benchmark_floors_match_design_anchors():
    """DESIGN §6: the Mamba-1 forward is exp-bound with a byte term ≈ 0.06 ms; decode ≈ 0.079 ms."""
    rows = {r["shape"]: r for r in roofline.benchmark_floors()}
    fwd = rows["mamba1 fwd b8 d2048 n16 l2048"]
    assert fwd["bound"] == "exps" and 0.05 < fwd["bytes_ms"] < 0.07
    assert 0.075 < rows["decode b64 h80 p64 n128 fp32 state"]["floor_ms"] < 0.085
    assert 0.07 < rows["ssd fwd b4 l4096 h80 p64 n128 q256"]["bytes_ms"] < 0.09
    p = roofline.percent_of_floor(2 * fwd["floor_ms"], "mamba1 fwd b8 d2048 n16 l2048")
    assert math.isclose(p, 50.0)


@pytest.mark.parametrize("bad", [dict(impl="magic"), dict(impl="naive", backward=True)])
def test_bad_arguments(bad):
    with pytest.raises(ValueError):
        roofline.selective_scan_cost(1, 2, 3, 4, **bad)
    with pytest.raises(ValueError):
        roofline.percent_of_floor(1.0, "no such shape")


def test_naive_scan_is_the_selective_scan():
    g = torch.Generator().manual_seed(3)
    u, delta = torch.randn(2, 5, 11, generator=g), torch.rand(2, 5, 11, generator=g)
    A = -torch.rand(5, 3, generator=g) - 0.1
    B, C = torch.randn(2, 3, 11, generator=g), torch.randn(2, 3, 11, generator=g)
    assert_close(roofline.naive_selective_scan(u, delta, A, B, C),
                 selective_scan_sequential(u, delta, A, B, C))


def test_measurements_are_plausible_on_this_machine():
    bw = roofline.measure_copy_bandwidth(nbytes=2**22, repeats=3)
    assert 1e8 < bw < 1e14  # between 0.1 GB/s and 100 TB/s
    assert 0 < roofline.measure_launch_overhead(launches=100) < 1e-2
    row = roofline.measure_naive(1, 4, 16, 2)
    assert row["ms"] > 0 and row["x_floor"] > 1 and row["launches"] == 4 * 16 + 4


def test_placement_by_hand():
    m = roofline.H200
    cost = roofline.Cost(bytes=m.bandwidth * 1e-3, exps=m.exps * 2e-3)  # 1 ms bytes, 2 ms exps
    p = roofline.placement(cost, 4.0)  # ran 4 ms
    assert p["unit"] == "exps" and p["bound"] == "exps"
    assert math.isclose(p["x"], 2.0) and math.isclose(p["y"], 0.5)
    assert math.isclose(p["pct_of_floor"], 50.0)
    mem = roofline.placement(roofline.Cost(bytes=m.bandwidth * 1e-3, flops=m.flops * 0.25e-3),
                             2.0)
    assert mem["bound"] == "bytes" and math.isclose(mem["x"], 0.25)
    assert math.isclose(mem["pct_of_floor"], 50.0) and math.isclose(mem["y"], 0.125)
    with pytest.raises(ValueError):
        roofline.placement(cost, 0.0)


def test_measured_kernels_sit_under_the_roof():
    """No recorded time may beat the model's floor: y ≤ min(1, x) for every measured kernel."""
    rows = roofline.measured_placements()
    assert len(rows) == len(roofline.MEASURED) >= 10
    for r in rows:
        assert 0 < r["y"] <= min(1.0, r["x"]) + 1e-9, r
        assert 0 < r["pct_of_floor"] <= 100, r
        assert r["source"].startswith("NVIDIA H200, 2026-") and "docs/results/h200_" in r["source"]
    by = {r["name"]: r for r in rows}
    assert by["Mamba-1 fwd l2048, ours (ch09)"]["unit"] == "exps"
    assert by["SSD fwd, ours unfused (ch10)"]["unit"] == "matmul"
    assert by["decode step b64, ours (ch12)"]["bound"] == "bytes"
