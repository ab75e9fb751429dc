"""Checks for chapter 12: ``decode_step(state, x, delta, A, B, C, D)``.

The exercise is the Mamba-1 decode step (Δ already positive, no gate):

    h ← exp(Δ A) ⊙ h + Δ B x      (in place: ``state`` is the cache)
    y = C·h + D x                 (read out the *new* state: y_t sees x_t)

Shapes: state (b, d, n), x and delta (b, d), A (d, n), B and C (b, n), D (d,) → y (b, d).
The oracle is ``mambalearn.inference.decode_step`` in float64.
"""

import torch

from mambalearn import inference
from mambalearn.check import _core

__all__ = ["decode_step"]
# The step, and every earlier scan that takes a state in: one step of it is a decode step.
REBUILDS = {
    "decode_step": ["@decode steps", "@mamba1 scans", "@ssd"],
}

HINTS = {
    "decode_step": [
        "the decode step is one step of chapter 02's scan: first the new state from the old one "
        "(decay it, then add the input), then the output from the new state",
        "Δ and x are (b, d), A is (d, n), B and C are (b, n): give Δ and x a last axis of size 1 "
        "and B, C a middle one, so every product is (b, d, n); write the new state into the "
        "cache with state.copy_(…) — rebinding the name leaves the cache as it was",
        "the output sums C·h over the n states, read after the update, and adds the skip D·x; "
        "keep the inputs' dtype throughout (float64 stays float64)",
    ],
}


def _case(b, d, n, g, dtype=torch.float64, delta_scale=1.0):
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return dict(
        state=r(b, d, n).to(dtype), x=r(b, d).to(dtype),
        delta=(torch.rand(b, d, generator=g, dtype=torch.float64) * delta_scale + 1e-3).to(dtype),
        A=(-torch.exp(r(d, n))).to(dtype), B=r(b, n).to(dtype), C=r(b, n).to(dtype),
        D=r(d).to(dtype),
    )


def _one(fn, inp, case, g):
    """Run the student's step and the oracle on copies; compare the output and the updated state."""
    s_student = inp["state"].clone()
    s_oracle = inp["state"].to(torch.float64, copy=True)
    args = [inp[k] for k in ("x", "delta", "A", "B", "C", "D")]
    where = f"{case} ({_core.describe(**inp)})"
    y = _core.call(fn, s_student, *args, case=where, mutable=(0,))  # the cache changes in place
    want = inference.decode_step(s_oracle, *[a.to(torch.float64) for a in args])
    if torch.equal(s_student, inp["state"]):
        raise AssertionError(
            f"decode_step did not change `state` on {where}: update it in place "
            f"(state.copy_(...) or state[...] = ...), not by rebinding the name; the cache *is* "
            f"this tensor")
    _core.compare(s_student, s_oracle, what="the updated state h", case=where, g=g)
    try:
        _core.compare(y, want, what="the output y", case=where, g=g)
    except AssertionError as e:
        raise AssertionError(str(e) + _hint(y, inp, s_oracle)) from None


def _hint(y, inp, h_new):
    """Which part of y = C·h + D·x is wrong, when the state is right and y is a wrong version."""
    f64 = lambda t: t.to(torch.float64)
    C, D, x, h_old = f64(inp["C"]), f64(inp["D"]), f64(inp["x"]), f64(inp["state"])
    read = lambda h: (h * C[:, None, :]).sum(-1)  # C·h: (b, d)
    variants = [
        ("y reads the old state h_{t−1}: read out the new one (y_t = C·h_t + D·x_t)",
         read(h_old) + D * x),
        ("the skip term D·x is missing (y = C·h + D·x)", read(h_new)),
        ("y reads the old state and misses D·x", read(h_old)),
    ]
    for what, wrong in variants:
        if _core.matches(y, wrong.to(y.dtype) if isinstance(y, torch.Tensor) else wrong):
            return f"\nhint: {what}."
    return ""


def decode_step(fn):
    """Check a student's ``decode_step(state, x, delta, A, B, C, D) -> y`` against the oracle."""
    g = _core.generator()
    cases = [
        ("a random batch", _case(3, 5, 4, g)),
        ("b = 1, d = 1, n = 1", _case(1, 1, 1, g)),
        ("odd sizes b = 2, d = 7, n = 3", _case(2, 7, 3, g)),
        ("large Δ (the old state is nearly forgotten)", _case(2, 4, 3, g, delta_scale=20.0)),
        ("tiny Δ (the state is nearly kept)", _case(2, 4, 3, g, delta_scale=1e-3)),
        ("float32 inputs", _case(2, 6, 5, g, dtype=torch.float32)),
    ]
    for case, inp in cases:
        _one(fn, inp, case, g)
    # several steps in a row from h = 0 must reproduce the sequential scan
    from mambalearn.scan.sequential import selective_scan_sequential

    b, d, n, l = 2, 3, 4, 6
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    u, delta = r(b, d, l), torch.rand(b, d, l, generator=g, dtype=torch.float64)
    A, B, C, D = -torch.exp(r(d, n)), r(b, n, l), r(b, n, l), r(d)
    want = selective_scan_sequential(u, delta, A, B, C, D)
    state = torch.zeros(b, d, n, dtype=torch.float64)
    ys = [_core.call(fn, state, u[..., t], delta[..., t], A, B[..., t], C[..., t], D,
                     case=f"step {t} of a {l}-step decode", mutable=(0,)) for t in range(l)]
    _core.compare(torch.stack(ys, -1), want, case="a decode loop", g=g,
                  what=f"the output of {l} decode steps from h = 0 (vs the full scan)")
    _core.passed("decode_step", len(cases) + 1)
