"""Launches past 2³¹ elements: the last rows of a huge launch equal a small launch of those rows.

How the rows become comparable: at step t0 (a chunk edge) the decay is made exactly zero (SSD:
Δ ≈ 200, so exp(ΔA) underflows to 0; Mamba-3: ADT = −10⁴, and λ = σ(100) = 1, so step t0 owes
nothing to step t0 − 1). The state entering t0 is then forgotten exactly, and the outputs from t0
on — and, with dout zero before t0, every gradient — are those of a launch that starts at t0.
A 32-bit offset that wraps, or a grid axis past its limit, reads or writes other rows: the tail
no longer matches (and the gradients before t0 are no longer exactly zero).

On a CPU the same construction runs at tiny sizes (the check of the check); the ``gpu`` tests
run the sizes past 2³¹: SSD b1 l2¹⁹ h80 p64 (x: 2.7·10⁹ elements), Mamba-3 b1 l 1 081 344 h32 p64
(V: 2.2·10⁹).
"""

import pytest
import torch

from course.bench import mamba3 as bench_m3
from course.bench.ssd import make_inputs
from mambalearn.mamba2 import mamba_chunk_scan_combined
from mambalearn.mamba2.config import default_config
from mambalearn.mamba2.fused import outputs
from mambalearn.mamba3 import mamba3_siso_combined
from mambalearn.mamba3.config import DEFAULT as M3_DEFAULT
from mambalearn.testing import assert_close, rel_error

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
SSD_GRADS = ("x", "dt", "A", "B", "C", "D", "dt_bias", "z")
M3_ROWS = ("Q", "K", "V", "Z", "Angles")  # (b, l, ·, ·): compared from t0 on
M3_STEPS = ("ADT", "DT", "Trap")  # (b, h, l)
M3_SUMS = ("Q_bias", "K_bias", "D")  # sums over every step


def _same(got, want, what):
    """The tail of the huge launch against the small launch: elementwise at the dtype's
    tolerance and as a whole within 1e-3 (the same kernels with the same settings on the same
    rows; only the forward's split of a long walk may associate the carries differently)."""
    assert_close(got, want, msg=what)
    assert rel_error(got, want) < 1e-3, (what, rel_error(got, want))


def _zero(t, what, scale=None):
    """Gradients before t0: exactly zero (``scale`` None), or, for the angles, whose window sums
    to zero only up to rounding (Σ_t dθ_t = 0 by rotation invariance), at most 5 % of ``scale``
    (the largest gradient in the window)."""
    worst = t.abs().max().item()
    bound = 0 if scale is None else 5e-2 * scale.abs().max().item()
    assert worst <= bound, f"{what}: {worst:.3g} before t0 (a write landed off its row?)"


def ssd_inputs(b, l, window, h, p, g, n, dtype, seed=0):
    """SSD inputs (with a gate z) whose state is forgotten at t0 = l − window, and t0."""
    args, kw = make_inputs(b, l, h, p, g, n, dtype=dtype, device=DEV, seed=seed)
    kw["z"] = torch.randn_like(args[0])
    t0 = l - window
    args[1][:, t0] = 200.0  # Δ ≈ 200, A ≤ −1: exp(ΔA) = 0 exactly in float32
    return args, kw, t0


def check_ssd_tail(b, l, window, h, p, g, n, chunk, dtype, fused, grads):
    args, kw, t0 = ssd_inputs(b, l, window, h, p, g, n, dtype)
    # one config for both launches (the huge one's): the same head splits in the backward, so
    # its sums over heads are added in the same order
    kw["config"] = default_config((b, l, h, p, g, n, chunk), DEV)
    tail = lambda t: t[:, t0:]
    small = [tail(t) for t in args[:1]] + [tail(args[1]), args[2]] + [tail(t) for t in args[3:]]
    if not grads:
        with torch.no_grad():
            big, fin = mamba_chunk_scan_combined(*args, chunk, fused=fused,
                                                 return_final_states=True, **kw)
            want, want_fin = mamba_chunk_scan_combined(*small, chunk, fused=fused,
                                                       return_final_states=True,
                                                       **dict(kw, z=tail(kw["z"])))
        _same(tail(big), want, "out")
        _same(fin, want_fin, "final state")
        return
    leaves = lambda ts: [t.detach().requires_grad_() for t in ts]
    extras = lambda z: {k: (v.detach().requires_grad_() if k in ("D", "dt_bias") else v)
                        for k, v in dict(kw, z=z.detach().requires_grad_()).items()}
    g_big, g_small = leaves(args), leaves(small)
    kw_big, kw_small = extras(kw["z"]), extras(tail(kw["z"]))
    wrt = lambda leaves, k: leaves + [k["D"], k["dt_bias"], k["z"]]
    out_big = mamba_chunk_scan_combined(*g_big, chunk, fused=fused, **kw_big)
    dout = torch.zeros_like(out_big)
    dout[:, t0:] = torch.randn_like(dout[:, t0:])
    big = torch.autograd.grad(out_big, wrt(g_big, kw_big), dout)
    del out_big
    out_small = mamba_chunk_scan_combined(*g_small, chunk, fused=fused, **kw_small)
    want = torch.autograd.grad(out_small, wrt(g_small, kw_small), dout[:, t0:])
    for name, gb, gs in zip(SSD_GRADS, big, want, strict=True):
        if gb.dim() > 1:  # (b, l, ...): the rows from t0 on, and zeros before
            _same(tail(gb), gs, f"d{name}")
            _zero(gb[:, :t0], f"d{name}")
        else:  # A, D, dt_bias: sums over every step (the steps before t0 add zeros)
            _same(gb, gs, f"d{name}")


def m3_inputs(b, l, window, h, g, n, p, na, dtype, grad, seed=0):
    kw = bench_m3.inputs(b, l, h, g, n, p, na, dtype=dtype, device=DEV, seed=seed)
    t0 = l - window
    kw["ADT"][:, :, t0] = -1e4  # e^{c} = 0 from t0 on: the entering state is forgotten
    kw["Trap"][:, :, t0] = 100.0  # λ = 1: step t0 owes nothing to step t0 − 1's input
    return {k: v.requires_grad_(grad) for k, v in kw.items()}, t0


def _m3_tail(kw, t0):
    rows = {k: kw[k][:, t0:] for k in M3_ROWS}
    steps = {k: kw[k][:, :, t0:] for k in M3_STEPS}
    return {**kw, **rows, **steps}


def check_mamba3_tail(b, l, window, h, g, n, p, na, chunk, dtype, grads):
    kw, t0 = m3_inputs(b, l, window, h, g, n, p, na, dtype, grads)
    # the same dq/dk head blocks in both launches (however many programs each has): the same
    # order of the sums over heads
    cfg = M3_DEFAULT.replace(min_programs=1)
    if not grads:
        with torch.no_grad():
            big = mamba3_siso_combined(**kw, chunk_size=chunk, config=cfg)
            want = mamba3_siso_combined(**_m3_tail(kw, t0), chunk_size=chunk, config=cfg)
        _same(big[:, t0:], want, "out")
        return
    names = list(kw)
    out = mamba3_siso_combined(**kw, chunk_size=chunk, config=cfg)
    dout = torch.zeros_like(out)
    dout[:, t0:] = torch.randn_like(dout[:, t0:])
    big = dict(zip(names, torch.autograd.grad(out, [kw[k] for k in names], dout), strict=True))
    del out
    small_kw = {k: v.detach().requires_grad_() for k, v in _m3_tail(kw, t0).items()}
    out = mamba3_siso_combined(**small_kw, chunk_size=chunk, config=cfg)
    want = dict(zip(names, torch.autograd.grad(out, [small_kw[k] for k in names],
                                               dout[:, t0:]), strict=True))
    for k in M3_ROWS:
        _same(big[k][:, t0:], want[k], f"d{k}")
        _zero(big[k][:, :t0], f"d{k}", want[k] if k == "Angles" else None)
    for k in M3_STEPS:
        _same(big[k][:, :, t0:], want[k], f"d{k}")
        _zero(big[k][:, :, :t0], f"d{k}", want[k] if k == "DT" else None)
    for k in M3_SUMS:
        _same(big[k], want[k], f"d{k}")


# (the backward is the same after either forward: its gradients once)
SSD_CASES = [(True, False), (False, False), (True, True)]  # (fused, grads)


# --- the construction itself, at sizes the interpreter runs --------------------------------------
@pytest.mark.parametrize("fused,grads", SSD_CASES)
def test_ssd_tail_equals_a_launch_from_t0(fused, grads):
    check_ssd_tail(1, 96, 32, 2, 8, 1, 8, 16, torch.float32, fused, grads)


@pytest.mark.parametrize("grads", [False, True])
def test_mamba3_tail_equals_a_launch_from_t0(grads):
    check_mamba3_tail(1, 96, 32, 2, 1, 8, 8, 4, 16, torch.float32, grads)


def test_outputs_kernel_in_slabs_of_the_grid_limit(monkeypatch):
    """More (batch, chunk) pairs than one launch's grid axis takes: launched in slabs."""
    monkeypatch.setattr(outputs, "GRID_Z", 2)
    check_ssd_tail(2, 80, 32, 2, 8, 1, 8, 16, torch.float32, True, False)


def test_mamba3_backward_names_its_grid_limit(monkeypatch):
    """The dq/dk launch keeps a 3-D grid (a chunk offset argument costs it spills): more chunks
    than grid axis 1 takes is a clear error, not a failed launch."""
    from mambalearn.mamba3 import backward

    monkeypatch.setattr(backward, "GRID_Y", 2)
    kw, _ = m3_inputs(1, 64, 16, 2, 1, 8, 8, 4, torch.float32, True)
    out = mamba3_siso_combined(**kw, chunk_size=16)
    with pytest.raises(ValueError, match="at most 2 chunks"):
        out.sum().backward()


# --- past 2³¹ on the GPU --------------------------------------------------------------------
SSD_HUGE = dict(b=1, l=2**19, window=1024, h=80, p=64, g=1, n=128, chunk=256)  # x: 2.7e9
M3_HUGE = dict(b=1, l=2**20 + 2**15, window=1024, h=32, g=1, n=128, p=64, na=32, chunk=64)


@pytest.mark.gpu
@pytest.mark.parametrize("fused,grads", SSD_CASES)
def test_gpu_ssd_past_2_31(fused, grads):
    assert SSD_HUGE["l"] * SSD_HUGE["h"] * SSD_HUGE["p"] > 2**31
    check_ssd_tail(**SSD_HUGE, dtype=torch.bfloat16, fused=fused, grads=grads)
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("grads", [False, True])
def test_gpu_mamba3_past_2_31(grads):
    assert M3_HUGE["l"] * M3_HUGE["h"] * M3_HUGE["p"] > 2**31
    check_mamba3_tail(**M3_HUGE, dtype=torch.bfloat16, grads=grads)
    torch.cuda.empty_cache()
