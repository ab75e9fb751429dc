"""Chapter 05's checks pass the library and reject plausible wrong occupancy and floor counts."""

import pytest

from mambalearn import check, machine, roofline
from mambalearn.check import ch05_machine

# ---- occupancy -------------------------------------------------------------------------------

def occ(gpu, num_warps, registers, shared_bytes, *, partitions=True, unit=256, reserved=True,
        cap=True, ties=True, shared_unit=128):
    """The right formula, with one switch per mistake a student makes."""
    up = lambda x, u: -(-x // u) * u
    per_warp = up(32 * registers, unit) if unit else 32 * registers
    if partitions:
        regs = 4 * (gpu.registers_per_sm // 4 // per_warp) // num_warps
    else:
        regs = gpu.registers_per_sm // per_warp // num_warps
    need = shared_bytes + (gpu.shared_reserved if reserved else 0)
    limits = {"warps": gpu.warps_per_sm // num_warps,
              "blocks": gpu.blocks_per_sm if cap else 10**9, "registers": regs,
              "shared": gpu.shared_per_sm // up(max(need, 1), shared_unit)}
    blocks = min(limits.values())
    named = sorted(k for k, v in limits.items() if v == blocks)
    return {"blocks": blocks, "warps": blocks * num_warps, "limits": limits,
            "limited_by": named if ties else named[:1]}


def _wrong(**flaw):
    return lambda gpu, w, r, s: occ(gpu, w, r, s, **flaw)


def test_occupancy_passes_the_library_and_the_right_formula(capsys):
    check.occupancy(machine.occupancy)
    check.occupancy(lambda *a: occ(*a))
    assert capsys.readouterr().out.count("✓ occupancy") == 2


@pytest.mark.parametrize("flaw, message", [
    (dict(partitions=False), "4 partitions"),           # 21 warps at 96 registers instead of 20
    (dict(unit=0), "units of 256"),                     # no allocation granularity
    (dict(reserved=False), "shared_reserved"),          # the driver's 1 KB forgotten
    (dict(cap=False), "blocks_per_sm"),                 # no program-slot limit
    (dict(ties=False), "every resource"),               # only one name when two limits tie
    (dict(shared_unit=1), "shared"),                    # no 128-byte rounding
])
def test_occupancy_rejects(flaw, message):
    with pytest.raises(AssertionError, match=message):
        check.occupancy(_wrong(**flaw))


def test_occupancy_rejects_h200_constants_and_bad_returns():
    def h200_only(gpu, w, r, s):  # ignores the gpu it is given
        return machine.occupancy(machine.H200, w, r, min(s, machine.H200.shared_per_block))

    with pytest.raises(AssertionError, match="invented GPU|RTX|A100"):
        check.occupancy(h200_only)
    with pytest.raises(AssertionError, match="must return a dict"):
        check.occupancy(lambda *a: machine.occupancy(*a)["blocks"])


def test_stub_raises_not_implemented():
    def stub(*args):
        raise NotImplementedError

    for name in ch05_machine.__all__:
        with pytest.raises(NotImplementedError):
            getattr(check, name)(stub)


# ---- floors ----------------------------------------------------------------------------------

def scan_right(b, d, l, n, s, m, *, output=True, act_exps=4, param_bytes=4, flops_per=6):
    N, M, S = b * d * l * n, b * d * l, b * n * l
    out = {"bytes": s * (3 * M + 2 * S + M * output) + param_bytes * (d * n + 2 * d),
           "flops": flops_per * N + 8 * M, "exps": N + act_exps * M}
    rate = {"bytes": m.bandwidth, "flops": m.flops, "exps": m.exps}
    t = {f"{k}_ms": out[k] / rate[k] * 1e3 for k in rate}
    bound = max(rate, key=lambda k: t[f"{k}_ms"])
    return {**out, **t, "floor_ms": t[f"{bound}_ms"], "bound": bound}


def test_scan_floors_passes(capsys):
    check.scan_floors(scan_right)
    assert "✓ scan_floors" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, message", [
    (lambda *a: scan_right(*a, output=False), "'bytes'"),          # out never written
    (lambda *a: scan_right(*a, act_exps=0), "'exps'"),             # softplus and SiLU forgotten
    (lambda *a: scan_right(*a, param_bytes=2), "'bytes'"),         # A, D, bias in in_bytes
    (lambda *a: scan_right(*a, flops_per=2), "'flops'"),
    (lambda *a: scan_right(*a[:-1], roofline.H200), "'bytes_ms'|'flops_ms'|'exps_ms'"),
    (lambda *a: {**scan_right(*a), "bound": "exps"}, "bound"),     # "it is always exp-bound"
    (lambda *a: {k: v for k, v in scan_right(*a).items() if k != "floor_ms"}, "'floor_ms'"),
])
def test_scan_floors_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check.scan_floors(wrong)


def ssd_right(b, l, h, p, n, q, g, s, m, *, groups=True, cb=True):
    gb = g if groups else h
    out = {"bytes": s * (2 * b * l * h * p + 2 * b * l * gb * n + b * l * h) + 4 * h,
           "flops": 4 * b * l * h * q,
           "matmul_flops": (2 * b * g * l * q * n * cb + 2 * b * h * l * q * p
                            + 4 * b * h * l * p * n),
           "exps": b * h * l * q}
    rate = {"bytes": (m.bandwidth, "bytes"), "flops": (m.flops, "flops"),
            "matmul": (m.matmul_flops, "matmul_flops"), "exps": (m.exps, "exps")}
    t = {f"{k}_ms": out[key] / r * 1e3 for k, (r, key) in rate.items()}
    bound = max(rate, key=lambda k: t[f"{k}_ms"])
    return {**out, **t, "floor_ms": t[f"{bound}_ms"], "bound": bound}


def test_ssd_floors_passes(capsys):
    check.ssd_floors(ssd_right)
    assert "✓ ssd_floors" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, message", [
    (lambda *a: ssd_right(*a, groups=False), "'bytes'"),            # B, C read per head
    (lambda *a: ssd_right(*a, cb=False), "'matmul_flops'"),          # C Bᵀ forgotten
    (lambda *a: {**ssd_right(*a), "bound": "bytes"}, "bound"),
])
def test_ssd_floors_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check.ssd_floors(wrong)


# ---- the roofline ----------------------------------------------------------------------------

def test_roofline_point_passes(capsys):
    check.roofline_point(roofline.placement)
    assert "✓ roofline_point" in capsys.readouterr().out


def _swap(cost, ms, m):
    p = roofline.placement(cost, ms, m)
    return {**p, "x": p["y"], "y": p["x"]}


def _floor_not_unit(cost, ms, m):  # y from the floor, not from the compute unit
    p = roofline.placement(cost, ms, m)
    return {**p, "y": p["pct_of_floor"] / 100}


def _exps_always(cost, ms, m):
    f = roofline.floor(cost, m)
    return {"x": f["exps_ms"] / f["bytes_ms"], "y": f["exps_ms"] / ms, "unit": "exps",
            "pct_of_floor": 100 * f["floor_ms"] / ms}


@pytest.mark.parametrize("wrong, message", [(_swap, "'x'"), (_floor_not_unit, "'y'"),
                                            (_exps_always, "unit")])
def test_roofline_point_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check.roofline_point(wrong)


def test_rebuilds_name_real_library_functions():
    import importlib

    assert set(ch05_machine.REBUILDS) == set(ch05_machine.__all__)
    for names in ch05_machine.REBUILDS.values():
        for dotted in names:
            module, _, attr = dotted.rpartition(".")
            assert callable(getattr(importlib.import_module(module), attr)), dotted


def test_checks_keep_their_oracle_when_the_library_is_hidden(monkeypatch):
    """The grader hides the rebuilt functions while grading; the checks bound them at import."""
    for names in ch05_machine.REBUILDS.values():
        for dotted in names:
            module, _, attr = dotted.rpartition(".")
            monkeypatch.setattr(f"{module}.{attr}", _hidden)
    check.occupancy(lambda *a: occ(*a))
    check.scan_floors(scan_right)
    check.ssd_floors(ssd_right)
    check.roofline_point(point_right)


def point_right(cost, ms, m):
    """A student's roofline_point, written without the library."""
    t_b = cost.bytes / m.bandwidth * 1e3
    t = {"flops": cost.flops / m.flops * 1e3, "matmul": cost.matmul_flops / m.matmul_flops * 1e3,
         "exps": cost.exps / m.exps * 1e3}
    unit = max(t, key=t.get)
    return {"x": t[unit] / t_b, "y": t[unit] / ms, "unit": unit,
            "pct_of_floor": 100 * max(t_b, t[unit]) / ms}


def _hidden(*args, **kwargs):
    raise RuntimeError("hidden while grading: write it yourself")
