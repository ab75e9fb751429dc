"""Checks for chapter 05: occupancy and its limit, a kernel's bytes / FLOPs / exps and its floors,
and its place on the roofline, against ``mambalearn.machine`` and ``mambalearn.roofline``.

Every check draws fresh shapes, dtypes and *invented machines* (random limits and peak rates), so
an answer that hard-codes the H200's numbers fails; edge cases sit on each boundary (a tie between
two limits, the register partitions, the 1 KB of shared memory the driver reserves).
"""

import math
from dataclasses import replace

import torch

from mambalearn import machine as M
from mambalearn import roofline as R
from mambalearn.check import _core

# The oracles, bound now: the grader hides the library functions a student rebuilds while grading.
_occupancy, _scan_cost, _ssd_cost = M.occupancy, R.selective_scan_cost, R.ssd_cost
_floor, _placement = R.floor, R.placement

__all__ = ["occupancy", "scan_floors", "ssd_floors", "roofline_point"]

# the library functions each exercise rebuilds (blocked while the exercise is graded)
REBUILDS = {
    "occupancy": ["mambalearn.machine.occupancy"],
    "scan_floors": ["mambalearn.roofline.selective_scan_cost", "mambalearn.roofline.floor"],
    "ssd_floors": ["mambalearn.roofline.ssd_cost", "mambalearn.roofline.floor"],
    "roofline_point": ["mambalearn.roofline.placement"],
}

HINTS = {
    "occupancy": [
        "use the gpu you are given (the check invents machines): every limit is a number of "
        "programs; blocks = their minimum, warps = blocks · num_warps",
        "registers: r_w = ceil(32 r / 256) · 256 per warp; a partition of registers_per_sm / 4 "
        "holds floor((registers_per_sm / 4) / r_w) warps; 4 partitions, divided by num_warps",
        "shared: floor(shared_per_sm / s'), s' = max(shared_bytes + shared_reserved, 1) rounded "
        "up to a multiple of 128; limited_by lists every resource equal to the minimum, sorted",
    ],
    "scan_floors": [
        "bytes: (4 tensors (b, d, l) — u, Δ, z, out — and B, C (b, n, l)) · in_bytes, plus A (d, "
        "n), D, delta_bias (d,) in 4 bytes each",
        "exps = N + 4M and flops = 6N + 8M with N = b·d·l·n, M = b·d·l; each time in ms is count / "
        "rate · 1e3, the floor the largest, bound its name",
    ],
    "ssd_floors": [
        "bytes: x and y (b, l, h, p), Δ (b, l, h), B and C (b, l, g, n) in in_bytes, A (h,) in 4",
        "matmul_flops = 2·b·g·l·q·n + 2·b·h·l·q·p + 2 · 2·b·h·l·p·n; exps = b·h·l·q; flops = "
        "4·b·l·h·q; times in ms, bound one of bytes, flops, matmul, exps",
    ],
    "roofline_point": [
        "T_b = bytes / bandwidth; T_c is the largest of flops / machine.flops, matmul_flops / "
        "machine.matmul_flops, exps / machine.exps, and unit names that one",
        "x = T_c / T_b, y = T_c / t and pct_of_floor = 100 · max(T_b, T_c) / t, with t the "
        "measured time in seconds (ms / 1e3)",
    ],
}


def _int(g, lo, hi):
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def _pick(g, options):
    return options[_int(g, 0, len(options) - 1)]


def _random_gpu(g):
    """An invented GPU: other warp/program slots and shared memory than any real one."""
    shared = _int(g, 48, 256) * 1024
    return M.GPU("an invented GPU", (9, 9), sms=_int(g, 20, 200),
                 warps_per_sm=_pick(g, [32, 40, 48, 56, 64]),
                 blocks_per_sm=_pick(g, [8, 16, 24, 32]),
                 shared_per_sm=shared, shared_per_block=shared - 1024,
                 shared_reserved=_pick(g, [0, 1024]))


def _random_machine(g):
    u = lambda lo, hi: lo * (hi / lo) ** float(torch.rand((), generator=g))  # log-uniform
    return R.Machine("an invented machine", bandwidth=u(1e11, 1e13), flops=u(1e12, 1e14),
                     matmul_flops=u(1e13, 2e15), exps=u(1e11, 1e13))


def _describe_gpu(gpu):
    return (f"{gpu.name} (warps_per_sm={gpu.warps_per_sm}, blocks_per_sm={gpu.blocks_per_sm}, "
            f"registers_per_sm={gpu.registers_per_sm}, shared_per_sm={gpu.shared_per_sm}, "
            f"shared_reserved={gpu.shared_reserved})")


_OCC_HINT = {
    "warps": "⌊warps_per_sm / num_warps⌋",
    "blocks": "the gpu's blocks_per_sm",
    "registers": "registers are given per warp in units of 256 (⌈32·r / 256⌉·256), and each warp "
                 "must fit in one of 4 partitions of registers_per_sm / 4",
    "shared": "⌊shared_per_sm / (shared_bytes + shared_reserved rounded up to 128)⌋",
}


def _occupancy_cases(g):
    H = M.H200
    cases = [("255 registers, 4 warps (chapter 09's forward)", H, 4, 255, 0),
             ("96 registers, 1 warp (the register partitions decide)", H, 1, 96, 0),
             ("a tie between registers and warps", H, 8, 32, 0),
             ("few registers: the program slots limit", H, 1, 16, 0),
             ("100 registers: allocated to a warp in units of 256", H, 1, 100, 0),
             ("76 KB shared: the reserved 1 KB decides", H, 1, 32, 76 * 1024),
             ("45 626 B shared: rounded up to 128 bytes", H, 1, 32, 45626),
             ("32 warps a program", H, 32, 64, 0),
             ("RTX 4090, 1 warp", M.RTX4090, 1, 24, 0),
             ("A100, 100 KB shared", M.A100, 4, 40, 100 * 1024)]
    for i in range(12):
        gpu = _random_gpu(g) if i % 2 else _pick(g, list(M.GPUS.values()))
        w = _pick(g, [1, 2, 4, 8, 16, 32])
        w = min(w, gpu.warps_per_sm)
        shared = _pick(g, [0, _int(g, 0, gpu.shared_per_block)])
        cases.append((f"random launch {i}", gpu, w, _int(g, 1, 255), shared))
    return cases


def occupancy(fn):
    """Check ``fn(gpu, num_warps, registers, shared_bytes)`` → dict(blocks, warps, limits,
    limited_by): programs and warps resident per SM, the programs each of "warps", "blocks",
    "registers", "shared" allows, and the names of those that reach the minimum."""
    g = _core.generator()
    n = 0
    for desc, gpu, w, r, s in _occupancy_cases(g):
        want = _occupancy(gpu, w, r, s)
        case = f"{desc}: {_describe_gpu(gpu)}, num_warps={w}, registers={r}, shared_bytes={s}"
        got = _core.call(fn, gpu, w, r, s, case=case)
        if not isinstance(got, dict):
            raise AssertionError(f"occupancy must return a dict, got {_core.kind(got)} "
                                 f"on {case}")
        limits = got.get("limits")
        if not isinstance(limits, dict):
            raise AssertionError(f"occupancy: got no dict under 'limits' on {case}")
        for key in ("warps", "blocks", "registers", "shared"):
            if limits.get(key) != want["limits"][key]:
                raise AssertionError(
                    f"occupancy: limits[{key!r}] is {limits.get(key)!r} on {case}, expected "
                    f"{want['limits'][key]} ({_OCC_HINT[key]})")
        for key in ("blocks", "warps"):
            if got.get(key) != want[key]:
                raise AssertionError(f"occupancy: {key!r} is {got.get(key)!r} on {case}, expected "
                                     f"{want[key]} (the smallest limit, in programs; warps = "
                                     f"programs × num_warps)")
        named = got.get("limited_by")
        if not isinstance(named, (list, tuple, set)) or sorted(named) != want["limited_by"]:
            raise AssertionError(f"occupancy: limited_by is {named!r} on {case}, expected "
                                 f"{want['limited_by']} (every resource that reaches the minimum)")
        n += 1
    _core.passed("occupancy", n)


def _number(v):
    """A plain float from an int, float, numpy or 0-d torch number; None for anything else."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _compare_floors(got, want, keys, what, case):
    if not isinstance(got, dict):
        raise AssertionError(f"{what} must return a dict, got {_core.kind(got)} on {case}")
    for key in keys:
        v = _number(got.get(key))
        if v is None or not math.isclose(v, want[key], rel_tol=1e-9, abs_tol=1e-12):
            raise AssertionError(f"{what}: {key!r} is {v!r} on {case}, expected {want[key]!r}")
    if got.get("bound") != want["bound"]:
        raise AssertionError(f"{what}: bound is {got.get('bound')!r} on {case}, expected "
                             f"{want['bound']!r} (the unit whose time is the floor)")


def _floors(cost, m, units):
    f = _floor(cost, m)
    out = {"bytes": cost.bytes, "flops": cost.flops, "exps": cost.exps,
           "matmul_flops": cost.matmul_flops, "floor_ms": f["floor_ms"], "bound": f["bound"]}
    out.update({f"{u}_ms": f[f"{u}_ms"] for u in units})
    return out


def _machines(g):
    return [R.H200, _random_machine(g), _random_machine(g),
            replace(R.H200, name="an H200 with a 4× slower SFU", exps=R.H200.exps / 4)]


def scan_floors(fn):
    """Check ``fn(b, d, l, n, in_bytes, machine)`` → dict(bytes, flops, exps, bytes_ms, flops_ms,
    exps_ms, floor_ms, bound) of the fused Mamba-1 forward with z, D, delta_bias and softplus."""
    g = _core.generator()
    shapes = [(8, 2048, 2048, 16), (1, 1, 1, 1), (3, 5, 7, 2)]
    shapes += [(_int(g, 1, 16), _int(g, 1, 4096), _int(g, 1, 9000), _int(g, 1, 128))
               for _ in range(4)]
    keys = ("bytes", "flops", "exps", "bytes_ms", "flops_ms", "exps_ms", "floor_ms")
    n = 0
    for shape in shapes:
        for m in _machines(g):
            s_in = _pick(g, [2, 4])
            case = f"b, d, l, n = {shape}, in_bytes={s_in}, {m.name}"
            want = _floors(_scan_cost(*shape, in_bytes=s_in), m, ("bytes", "flops", "exps"))
            got = _core.call(fn, *shape, s_in, m, case=case)
            _compare_floors(got, want, keys, "scan_floors", case)
            n += 1
    _core.passed("scan_floors", n)


def ssd_floors(fn):
    """Check ``fn(b, l, h, p, n, chunk, g, in_bytes, machine)`` → dict(bytes, flops,
    matmul_flops, exps, bytes_ms, flops_ms, matmul_ms, exps_ms, floor_ms, bound) of the chunked
    SSD forward (x, dt, B, C in, y out; matmuls on full chunk × chunk tiles)."""
    gen = _core.generator()
    shapes = [(4, 4096, 80, 64, 128, 256, 1), (1, 1, 1, 1, 1, 1, 1), (2, 100, 6, 3, 5, 16, 3)]
    for _ in range(4):
        groups = _pick(gen, [1, 2, 4, 8])
        shapes.append((_int(gen, 1, 16), _int(gen, 1, 16384), groups * _int(gen, 1, 12),
                       _pick(gen, [16, 32, 64, 128]), _pick(gen, [16, 64, 128, 256]),
                       _pick(gen, [64, 128, 256]), groups))
    keys = ("bytes", "flops", "matmul_flops", "exps", "bytes_ms", "flops_ms", "matmul_ms",
            "exps_ms", "floor_ms")
    n = 0
    for shape in shapes:
        for m in _machines(gen):
            s_in = _pick(gen, [2, 4])
            case = f"b, l, h, p, n, chunk, g = {shape}, in_bytes={s_in}, {m.name}"
            b, l, h, p, nn, q, groups = shape
            want = _floors(_ssd_cost(b, l, h, p, nn, q, groups, in_bytes=s_in), m,
                           ("bytes", "flops", "matmul", "exps"))
            got = _core.call(fn, *shape, s_in, m, case=case)
            _compare_floors(got, want, keys, "ssd_floors", case)
            n += 1
    _core.passed("ssd_floors", n)


def roofline_point(fn):
    """Check ``fn(cost, ms, machine)`` → dict(x, y, unit, pct_of_floor): a kernel of ``cost``
    that ran ``ms`` on the roofline of its busiest compute unit."""
    g = _core.generator()
    costs = [_scan_cost(8, 2048, 2048, 16), _ssd_cost(4, 4096, 80, 64, 128, 256),
             R.decode_cost(64, 80, 64, 128), R.Cost(bytes=1e9, flops=2e12),
             R.Cost(bytes=1.0, exps=1.0, matmul_flops=3.0, flops=2.0)]
    costs += [R.Cost(bytes=float(torch.rand((), generator=g)) * 1e10 + 1,
                     flops=float(torch.rand((), generator=g)) * 1e12,
                     exps=float(torch.rand((), generator=g)) * 1e10,
                     matmul_flops=float(torch.rand((), generator=g)) * 1e13) for _ in range(4)]
    n = 0
    for i, cost in enumerate(costs):
        for m in _machines(g)[:3]:
            ms = _floor(cost, m)["floor_ms"] * (1 + 30 * float(torch.rand((), generator=g)))
            case = (f"cost {i} (bytes={cost.bytes:.4g}, flops={cost.flops:.4g}, "
                    f"matmul_flops={cost.matmul_flops:.4g}, exps={cost.exps:.4g}), ms={ms:.4g}, "
                    f"{m.name}")
            want = _placement(cost, ms, m)
            got = _core.call(fn, cost, ms, m, case=case)
            if not isinstance(got, dict):
                raise AssertionError(f"roofline_point must return a dict, got "
                                     f"{_core.kind(got)} on {case}")
            if got.get("unit") != want["unit"]:
                raise AssertionError(f"roofline_point: unit is {got.get('unit')!r} on {case}, "
                                     f"expected {want['unit']!r} (the compute unit with the "
                                     f"largest time: flops, matmul or exps)")
            for key, hint in (("x", "T_compute / T_bytes"), ("y", "T_compute / measured time"),
                              ("pct_of_floor", "100 · floor / measured time")):
                v = _number(got.get(key))
                if v is None or not math.isclose(v, want[key], rel_tol=1e-9):
                    raise AssertionError(f"roofline_point: {key!r} is {v!r} on {case}, expected "
                                         f"{want[key]!r} ({hint})")
            n += 1
    _core.passed("roofline_point", n)
