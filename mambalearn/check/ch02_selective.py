"""Checks for chapter 02: ``selective_scan_sequential`` against the library oracle, in float64."""

import torch

from mambalearn.check import _core
from mambalearn.scan import sequential

__all__ = ["selective_scan_sequential"]
# Switched off while grading: the function itself and every library scan that computes the same
# thing with the same arguments (a drop-in would be the answer imported under another name).
REBUILDS = {
    "selective_scan_sequential": ["@mamba1 scans"],
}

HINTS = {
    "selective_scan_sequential": [
        "start simple: make B and C broadcast to (b, d, n, l) (fixed (d, n) → [None, :, :, None]; "
        "(b, n, l) → [:, None]; grouped (b, g, n, l) → repeat_interleave(d // g, dim=1)), then one "
        "loop over t: h = exp(Δ_t A) h + Δ_t B_t x_t, y_t = Σ_n C_t h",
        "Δ = delta + delta_bias (bias first), then softplus only if delta_softplus; D adds D·u "
        "to y; z multiplies by silu(z) last; the output has u's dtype",
        "a masked step keeps h (torch.where(mask_t, h_new, h)) and outputs 0; initial_state is "
        "h before step 0; last_state is h after the last step, in the compute dtype (float64 "
        "if any of u, delta, A, B, C is)",
    ],
}

f64 = torch.float64


def _inputs(g, b, d, n, l, B_kind, C_kind, groups, delta_scale=1.0):
    r = lambda *s: torch.randn(*s, generator=g, dtype=f64)
    shapes = {"fixed (d, n)": (d, n), "(b, n, l)": (b, n, l),
              "grouped (b, g, n, l)": (b, groups, n, l)}
    return dict(u=r(b, d, l), delta=torch.rand(b, d, l, generator=g, dtype=f64) * delta_scale,
                A=-(torch.rand(d, n, generator=g, dtype=f64) * 2 + 0.05), B=r(*shapes[B_kind]),
                C=r(*shapes[C_kind]))


def _cases(g):
    """(description, kwargs): simplest first, so the first failure names the missing feature."""
    ri = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
    bnl, grp, fixed = "(b, n, l)", "grouped (b, g, n, l)", "fixed (d, n)"
    cases = []

    def add(desc, B_kind=bnl, C_kind=bnl, l=None, d=4, groups=2, scale=1.0, **options):
        b, n, l = ri(1, 3), ri(1, 5), ri(2, 40) if l is None else l
        kw = _inputs(g, b, d, n, l, B_kind, C_kind, groups, scale)
        for name in options:  # the optional arguments, drawn fresh
            if name == "D":
                options[name] = torch.randn(d, generator=g, dtype=f64)
            elif name == "z":
                options[name] = torch.randn(b, d, l, generator=g, dtype=f64)
            elif name == "delta_bias":
                options[name] = torch.randn(d, generator=g, dtype=f64)
            elif name == "mask":
                options[name] = torch.rand(b, l, generator=g) > 0.3
            elif name == "initial_state":
                options[name] = torch.randn(b, d, n, generator=g, dtype=f64)
        cases.append((f"{desc} [b={b}, d={d}, n={n}, l={l}]", {**kw, **options}))

    add("B, C (b, n, l), no D, z or delta_bias")
    add("length l=1", l=1)
    add("B, C fixed (d, n)", B_kind=fixed, C_kind=fixed, l=ri(2, 20) * 2 + 1)
    add("B (b, n, l), C fixed (d, n)", C_kind=fixed)
    add("B, C grouped (b, g=2, n, l): channel i uses group i // (d // g)", grp, grp, d=4, groups=2)
    add("B grouped (g=3, d=6), C (b, n, l)", grp, bnl, d=6, groups=3, l=16)
    add("D given (the skip connection y + D·x)", D=True)
    add("z given (the gate: out = y · silu(z))", z=True)
    add("delta_bias given, no softplus", delta_bias=True)
    add("delta_softplus=True", delta_softplus=True)
    add("delta_bias and delta_softplus=True (Δ = softplus(delta + bias))", delta_bias=True,
        delta_softplus=True)
    add("large delta (Ā = exp(ΔA) ≈ 0)", scale=30.0, l=33)
    add("tiny delta (Ā ≈ 1)", scale=1e-6, l=64)
    add("return_last_state=True", grp, grp, d=6, groups=2, D=True, return_last_state=True)
    add("a padding mask (False = masked: keep the state, output 0)", mask=True, D=True, z=True,
        return_last_state=True)
    add("initial_state (h_{-1})", initial_state=True, return_last_state=True)
    add("everything together", grp, grp, d=6, groups=3, D=True, z=True, delta_bias=True,
        delta_softplus=True, mask=True, initial_state=True, return_last_state=True, l=65)
    return cases


def selective_scan_sequential(fn):
    """Check ``fn`` with ``selective_scan_ref``'s signature (+ ``mask``, ``initial_state``)."""
    g = _core.generator()
    cases = _cases(g)
    for desc, kw in cases:
        got = _core.call(fn, **kw, case=desc)
        want = sequential.selective_scan_sequential(**kw)
        _compare(got, want, kw, desc, g, dtype=torch.float32)
    # mixed dtypes: float64 anywhere among u, delta, A, B, C means the scan runs in float64
    desc, kw = next((d, k) for d, k in cases if k.get("return_last_state"))
    kw = {**kw, "u": kw["u"].float(), "delta": kw["delta"].float()}
    desc = ("u, delta float32 but A, B, C float64 (compute in float64, return out as float32), "
            + desc)
    got = _core.call(fn, **kw, case=desc)
    _compare(got, sequential.selective_scan_sequential(**kw), kw, desc, g, dtype=torch.float32)
    if isinstance(got[1], torch.Tensor) and got[1].dtype != torch.float64:
        raise AssertionError(f"last_state must be in the compute dtype, float64 here (A, B, C are "
                             f"float64), got {got[1].dtype} on {desc}")
    # low-precision inputs: computed in fp32, returned in u's dtype
    desc, kw = cases[-1]
    kw = {k: v.bfloat16() if torch.is_tensor(v) and v.is_floating_point() else v
          for k, v in kw.items()}
    desc = "bfloat16 inputs, " + desc
    got = _core.call(fn, **kw, case=desc)
    _compare(got, sequential.selective_scan_sequential(**kw), kw, desc, g, dtype=torch.bfloat16)
    _core.passed("selective_scan_sequential", len(cases) + 2)


def _compare(got, want, kw, desc, g, dtype):
    if kw.get("return_last_state"):
        if not (isinstance(got, tuple) and len(got) == 2):
            raise AssertionError(f"with return_last_state=True return (out, last_state); got "
                                 f"{_core.kind(got)} on {desc}")
        _core.compare(got[1], want[1], what="last_state", case=desc, g=g, dtype=torch.float32)
        got, want = got[0], want[0]
    if isinstance(got, torch.Tensor) and got.dtype != kw["u"].dtype:
        raise AssertionError(f"out must have u's dtype {kw['u'].dtype}, got {got.dtype} on {desc}")
    _core.compare(got, want, what="out", case=desc, g=g, dtype=dtype)
