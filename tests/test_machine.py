"""Chapter 05's execution model: occupancy vs Nsight Compute, coalescing, banks, tf32."""

import glob
import os
import random

import pytest
import torch

from mambalearn import machine, ncu, results
from mambalearn.testing import assert_close

PROFILES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "docs", "profiles",
                                         "*.csv")))


def test_register_limit_matches_every_profiled_kernel():
    """ncu's launch__occupancy_limit_registers of all ~40 kernels profiled on the H200."""
    rows = [r for p in PROFILES for r in ncu.load(p)]
    assert len(rows) > 30
    for r in rows:
        occ = machine.occupancy(machine.H200, r["block"] // 32, r["registers"])
        assert occ["limits"]["registers"] == r["reg_limit"], r
        # achieved occupancy can only fall short of the theoretical one
        assert r["warps_pct"] <= 100 * occ["occupancy"] + 0.5, r


def test_hand_checked_cases():
    H = machine.H200
    o = machine.occupancy(H, 4, 255)  # the Mamba-1 forward: 8 warps, 12.5 %
    assert (o["blocks"], o["warps"], o["limited_by"]) == (2, 8, ["registers"])
    o = machine.occupancy(H, 1, 96)  # the state-outer backward: 20 warps, not 21
    assert (o["blocks"], o["limited_by"]) == (20, ["registers"])
    assert machine.occupancy(H, 1, 16)["limited_by"] == ["blocks"]  # 32 programs per SM at most
    assert machine.occupancy(H, 8, 32)["limited_by"] == ["registers", "warps"]  # both allow 8
    o = machine.occupancy(H, 4, 32, shared_bytes=100 * 1024)  # 2 × (100 KB + 1 KB) ≤ 228 KB
    assert (o["blocks"], o["limited_by"]) == (2, ["shared"])
    # the 1 KB the driver reserves per program: 76 KB would fit 3 times (3 × 76 = 228), 3 × 77 not
    assert machine.occupancy(H, 1, 32, shared_bytes=75 * 1024)["limits"]["shared"] == 3
    assert machine.occupancy(H, 1, 32, shared_bytes=76 * 1024)["limits"]["shared"] == 2
    assert machine.occupancy(machine.RTX4090, 1, 16)["warps"] == 24  # 24 programs per SM there


def _occupancy_by_enumeration(gpu, w, r, s):
    """The slow way: add programs to an SM one at a time, warps dealt to the 4 partitions."""
    regs = [gpu.registers_per_sm // 4] * 4
    warps, shared, blocks = 0, gpu.shared_per_sm, 0
    per_warp = -(-r * 32 // 256) * 256
    per_block = -(-(s + gpu.shared_reserved) // 128) * 128
    while True:
        trial, ok = list(regs), True
        for _ in range(w):  # each warp to the partition with the most registers left
            i = max(range(4), key=lambda j: trial[j])
            if trial[i] < per_warp:
                ok = False
                break
            trial[i] -= per_warp
        if not ok or warps + w > gpu.warps_per_sm or blocks + 1 > gpu.blocks_per_sm \
                or shared < per_block:
            return blocks
        regs, warps, shared, blocks = trial, warps + w, shared - per_block, blocks + 1


@pytest.mark.parametrize("gpu", list(machine.GPUS.values()), ids=list(machine.GPUS))
def test_formula_equals_enumeration_on_random_launches(gpu):
    rng = random.Random()
    for _ in range(300):
        w = rng.choice([1, 2, 4, 8, 16, 32])
        r = rng.randint(1, 255)
        s = rng.choice([0, rng.randint(0, gpu.shared_per_block)])
        assert machine.occupancy(gpu, w, r, s)["blocks"] == _occupancy_by_enumeration(gpu, w, r, s)


def test_max_registers_is_the_boundary():
    H = machine.H200
    assert [machine.max_registers(H, w) for w in (8, 16, 20, 24, 32, 64)] == [255, 128, 96, 80,
                                                                              64, 32]
    for warps in range(1, 65):
        r = machine.max_registers(H, warps)
        w = 1  # 1-warp programs: the register limit is exactly the resident warp count
        assert machine.occupancy(H, w, r)["limits"]["registers"] >= warps
        if r < H.max_registers:
            assert machine.occupancy(H, w, r + 1)["limits"]["registers"] < warps


@pytest.mark.parametrize("bad", [dict(num_warps=0), dict(num_warps=64), dict(registers=256),
                                 dict(registers=0), dict(shared_bytes=228 * 1024),
                                 dict(shared_bytes=-1)])
def test_bad_launches_raise(bad):
    kw = dict(num_warps=4, registers=64, shared_bytes=0) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        machine.occupancy(machine.H200, **kw)
    with pytest.raises(TypeError):
        machine.occupancy("H200", 4, 64)
    with pytest.raises(TypeError):
        machine.occupancy(machine.H200, 4.0, 64)


def test_sectors_and_bank_conflicts():
    lanes = torch.arange(32)
    assert machine.sectors(4 * lanes) == 4  # consecutive fp32: 128 B in 4 sectors
    assert machine.sectors(4 * 32 * lanes) == 32  # stride 32 elements: a sector per lane
    assert machine.sectors(2 * lanes) == 2  # bf16: 64 B
    assert machine.bank_conflict(4 * lanes) == 1
    assert machine.bank_conflict(4 * 32 * lanes) == 32  # a column of a 32 × 32 fp32 tile
    assert machine.bank_conflict(4 * 33 * lanes) == 1  # rows padded to 33 words
    assert machine.bank_conflict(torch.zeros(32, dtype=torch.int64)) == 1  # one word: broadcast
    assert machine.bank_conflict(4 * 2 * lanes) == 2
    with pytest.raises(ValueError):
        machine.sectors([])


def test_round_to_tf32_against_frexp():
    x = torch.randn(10000) * torch.logspace(-20, 20, 10000)
    x[:4] = torch.tensor([1.0 + 0.75 * 2**-10, 1.0 + 0.501 * 2**-10, -(1.0 + 0.75 * 2**-10),
                          1.0 + 2**-10])
    m, e = torch.frexp(x.double())  # x = m · 2^e, |m| in [0.5, 1)
    want = torch.ldexp(torch.trunc(m * 2**11) / 2**11, e).float()  # 11 significant bits, cut
    got = machine.round_to_tf32(x)
    assert_close(got, want, rtol=0, atol=0)
    assert ((x - got).abs() < x.abs() * 2**-10).all() and (got.abs() <= x.abs()).all()
    assert (torch.sign(got) == torch.sign(x)).all()
    assert got[:4].tolist() == [1.0, 1.0, -1.0, 1.0 + 2**-10]  # truncation, not to nearest
    edge = torch.tensor([float("inf"), -float("inf"), 0.0, -0.0])
    assert torch.equal(machine.round_to_tf32(edge), edge)
    with pytest.raises(TypeError):
        machine.round_to_tf32(x.double())


def test_round_to_tf32_is_what_the_h200_measured():
    """The model against the stored measurement of tl.dot(x, I, input_precision="tf32")."""
    rows = results.load("tf32")["rows"]
    x = torch.tensor([r["input"] for r in rows])
    assert machine.round_to_tf32(x).tolist() == [r["output"] for r in rows]
    assert (x != 1.0).all()  # the inputs were not 1 already: rounding to nearest would differ


def test_ncu_rows_match_the_documented_table():
    """bench/NOTES_runs.md ("Where the time goes") quotes these of docs/profiles/m1_16.csv."""
    fwd, bwd = ncu.load(os.path.join(os.path.dirname(PROFILES[0]), "m1_16.csv"))
    assert fwd["kernel"] == "_fwd_kernel" and abs(fwd["ms"] - 0.427) < 1e-3
    assert fwd["registers"] == 255 and round(fwd["issue_pct"], 1) == 51.7
    assert round(fwd["warps_pct"], 1) == 12.1
    assert ncu.top(fwd, "pipes", 1)[0][0] == "xu" and round(fwd["pipes"]["xu"]) == 36
    assert ncu.top(fwd, "stalls", 1)[0][0] == "long_scoreboard"
    assert ncu.top(bwd, "pipes", 1)[0][0] == "lsu"
    ref = ncu.load(os.path.join(os.path.dirname(PROFILES[0]), "ssdref.csv"))
    assert all(r["ms"] < 1.0 for r in ref)  # that file is in microseconds: converted
    with pytest.raises(ValueError):
        ncu.top(fwd, "nope")
