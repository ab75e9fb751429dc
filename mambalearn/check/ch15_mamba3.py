"""Checks for chapter 15: ``trapezoid_scan`` and ``rotate_pairs``.

``trapezoid_scan(V, K, Q, ADT, DT, lam)`` — Mamba-3's recurrence without rotations or biases:

    h_t = α_t h_{t−1} + β_t v_{t−1} k_{t−1}ᵀ + γ_t v_t k_tᵀ,   y_t = h_t q_t
    α_t = exp(ADT_t),  β_t = (1 − λ_t) Δ_t α_t,  γ_t = λ_t Δ_t,   h_{−1} = 0, v_{−1} k_{−1}ᵀ = 0

Shapes: V (b, l, h, p); K, Q (b, l, h, n); ADT, DT, lam (b, h, l) with λ ∈ [0, 1] → y (b, l, h, p).
The oracle is ``mambalearn.mamba3.mamba3_siso_sequential`` (zero angles, zero biases) in float64.

``rotate_pairs(X, theta)`` — the pairs (X_2j, X_2j+1), j < na, turned by θ_j (x₀ + i x₁ ↦ e^{iθ}
(x₀ + i x₁)), the others unchanged. Shapes: X (..., n), theta (..., na), na ≤ n/2 → (..., n). The
check compares with complex multiplication, then rotates B and C with it and compares the real
scan with the complex-state oracle ``mamba3_complex_sequential``.

``REBUILDS`` names the library functions each exercise rebuilds: the grader blocks them while
grading. The oracles below are bound when this module is imported, before any blocking.
"""

import math

import torch

from mambalearn.check import _core
from mambalearn.mamba3 import reference as _seq

__all__ = ["trapezoid_scan", "rotate_pairs"]

REBUILDS = {
    "trapezoid_scan": ["mambalearn.mamba3.reference.mamba3_siso_sequential",
                       "mambalearn.mamba3.reference_chunked.mamba3_siso_chunked",
                       "mambalearn.mamba3.reference.mamba3_complex_sequential",
                       "mambalearn.mamba3.reference.trapezoid_coefficients"],
    "rotate_pairs": ["mambalearn.mamba3.reference.rotate_pairs"],
}

HINTS = {
    "trapezoid_scan": [
        "α = exp(ADT), β = (1 − λ)·Δ·α, γ = λ·Δ, all (b, h, l); keep the previous v kᵀ (zeros "
        "before step 0)",
        "h_t = α_t h_{t−1} + β_t v_{t−1} k_{t−1}ᵀ + γ_t v_t k_tᵀ with h (b, h, p, n); y_t = h_t "
        "q_t, read from the new state",
    ],
    "rotate_pairs": [
        "pair j is columns 2j and 2j + 1 (interleaved): x0 = X[..., 0:2na:2], x1 = "
        "X[..., 1:2na:2]",
        "(x0 cos θ − x1 sin θ, x0 sin θ + x1 cos θ) for the first na pairs; the rest unchanged, "
        "in a new tensor",
    ],
}

_oracle = _seq.mamba3_siso_sequential  # bound now: blocking the public names cannot reach them
_complex_oracle = _seq.mamba3_complex_sequential


def _scan_case(b, l, h, p, n, g, lam=None, dt_scale=1.0, dtype=torch.float64):
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    DT = torch.rand(b, h, l, generator=g, dtype=torch.float64) * dt_scale + 1e-3
    lam = torch.rand(b, h, l, generator=g, dtype=torch.float64) if lam is None \
        else torch.full((b, h, l), float(lam), dtype=torch.float64)
    case = dict(V=r(b, l, h, p), K=r(b, l, h, n), Q=r(b, l, h, n),
                ADT=-torch.rand(b, h, l, generator=g, dtype=torch.float64) * DT, DT=DT, lam=lam)
    return {k: v.to(dtype) for k, v in case.items()}


def _want_scan(V, K, Q, ADT, DT, lam):
    """The oracle on the exercise's arguments: Trap = logit(λ), no angles, biases or D."""
    f = lambda t: t.to(torch.float64)
    b, l, h, _ = V.shape
    n = K.shape[-1]
    zeros = torch.zeros(h, n, dtype=torch.float64)
    return _oracle(f(Q), f(K), f(V), f(ADT), f(DT), torch.logit(f(lam)), zeros, zeros,
                   torch.zeros(b, l, h, 1, dtype=torch.float64))


def trapezoid_scan(fn):
    """Check a student's ``trapezoid_scan(V, K, Q, ADT, DT, lam) -> y`` against the oracle."""
    g = _core.generator()
    cases = [
        ("a random batch", _scan_case(2, 9, 3, 4, 6, g)),
        ("l = 1 (no previous input yet)", _scan_case(2, 1, 2, 3, 4, g)),
        ("odd sizes b = 1, l = 13, h = 1, p = 5, n = 6", _scan_case(1, 13, 1, 5, 6, g)),
        ("λ = 1 everywhere: Mamba-2's exponential-Euler step", _scan_case(2, 7, 2, 3, 4, g, lam=1)),
        ("λ = 0 everywhere: only the previous input enters", _scan_case(2, 7, 2, 3, 4, g, lam=0)),
        ("large Δ (strong decay)", _scan_case(2, 8, 2, 3, 4, g, dt_scale=20.0)),
        ("float32 inputs", _scan_case(2, 10, 2, 3, 4, g, dtype=torch.float32)),
    ]
    for case, inp in cases:
        where = f"{case} ({_core.describe(**inp)})"
        args = [inp[k].clone() for k in ("V", "K", "Q", "ADT", "DT", "lam")]
        got = _core.call(fn, *args, case=where)
        _core.compare(got, _want_scan(**inp), what="y", case=where, g=g)
    _core.passed("trapezoid_scan", len(cases))


def _want_rotation(X, theta):
    na = theta.shape[-1]
    z = torch.view_as_complex(X.to(torch.float64).unflatten(-1, (-1, 2)).contiguous())
    turn = torch.ones(z.shape, dtype=torch.complex128)
    turn[..., :na] = torch.exp(1j * theta.to(torch.float64))
    return torch.view_as_real(z * turn).flatten(-2)


def _rotation_cases(g):
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    u = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64) * 4 * math.pi - 2 * math.pi
    return [
        ("one pair", r(2), u(1)),
        ("every pair rotated, a batch", r(3, 5, 8), u(3, 5, 4)),
        ("only the first 2 of 5 pairs rotated", r(4, 10), u(4, 2)),
        ("θ = π: a half turn flips the sign", r(6), torch.full((3,), math.pi,
                                                                 dtype=torch.float64)),
        ("float32", r(2, 3, 6).float(), u(2, 3, 3).float()),
    ]


def _equivalence(fn, g):
    """Rotating B and C by the cumulative angles with ``fn`` gives the complex-state model."""
    b, l, h, n, p, na = 2, 7, 2, 6, 3, 2
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    DT = torch.rand(b, h, l, generator=g, dtype=torch.float64) + 0.05
    kw = dict(Q=r(b, l, h, n), K=r(b, l, h, n), V=r(b, l, h, p), ADT=-DT * torch.rand(
        b, h, l, generator=g, dtype=torch.float64), DT=DT, Trap=r(b, h, l),
        Q_bias=torch.zeros(h, n, dtype=torch.float64), K_bias=torch.zeros(h, n,
                                                                          dtype=torch.float64),
        Angles=r(b, l, h, na))
    want = _complex_oracle(**kw)
    theta = torch.cumsum(math.pi * torch.tanh(kw["Angles"]) * DT.transpose(1, 2)[..., None], 1)
    case = "rotating B and C of a Mamba-3 layer by the cumulative angles θ_t"
    turned = {k: _core.call(fn, kw[k], theta, case=case) for k in ("Q", "K")}
    got = _oracle(**{**kw, **turned, "Angles": torch.zeros_like(kw["Angles"])})
    _core.compare(got, want, what="the real scan with your rotated B, C (vs the complex state)",
                  case=case, g=g)


def rotate_pairs(fn):
    """Check a student's ``rotate_pairs(X, theta)`` against complex multiplication."""
    g = _core.generator()
    cases = _rotation_cases(g)
    for case, X, theta in cases:
        where = f"{case} ({_core.describe(X=X, theta=theta)})"
        got = _core.call(fn, X.clone(), theta.clone(), case=where)
        _core.compare(got, _want_rotation(X, theta).to(X.dtype), what="the rotated X", case=where,
                      g=g)
    _equivalence(fn, g)
    _core.passed("rotate_pairs", len(cases) + 1)
