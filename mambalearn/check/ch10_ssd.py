"""Checks for chapter 10: ``segsum`` and ``ssd_chunked`` (Mamba-2's state space duality).

    segsum(x)_ts = Σ_{k=s+1..t} x_k for t ≥ s, −∞ for t < s          x (..., T) → (..., T, T)
    ssd_chunked(x, dt, A, B, C, chunk_size, initial_states=None) → (y, final state)
        h_t = exp(Δ_t A) h_{t−1} + Δ_t x_t B_tᵀ,  y_t = h_t C_t, computed by chunks of q steps

Oracles: ``mambalearn.mamba2.reference.segsum`` on float64 copies, and the *sequential* scan
``mambalearn.mamba2.reference.ssd_sequential`` in float64 (chapter 02's loop with A scalar per
head), so a chunked answer is compared with an independent computation, not with another chunked
one.

Stability cases: a segsum written as cumsum_t − cumsum_s looks right on small inputs but loses
every digit after one huge decay step (float32 rounds cumsum ≈ −10⁵ to multiples of 0.008) and
gives inf − inf = nan once the cumsum overflows; an SSD that forms exp(cumsum_t) / exp(cumsum_s)
gives 0 / 0 once the in-chunk cumsum drops below −745 (float64) — both are cases below.
"""

import torch

from mambalearn.check import _core
from mambalearn.mamba2 import reference as ssd

__all__ = ["segsum", "ssd_chunked"]
# for ssd_chunked also every library SSD that returns (y, final state) from the same inputs, and
# every earlier scan: Mamba-1's with channels = heads × p and A repeated, or one of the states
REBUILDS = {
    "segsum": ["mambalearn.mamba2.reference.segsum"],
    "ssd_chunked": ["@ssd", "@mamba1 scans", "@linear scans"],
}

HINTS = {
    "segsum": [
        "never cumsum_t − cumsum_s: z[..., None].expand(..., T, T), keep entries with k > s "
        "(torch.tril(…, diagonal=−1)), cumsum over k",
        "then mask t < s with −inf (torch.triu(…, diagonal=1) or masked_fill); the diagonal is 0",
    ],
    "ssd_chunked": [
        "pad l to c·q with Δ = 0, reshape x, Δ, B, C to (b, c, q, h, ·) (groups → heads with "
        "repeat_interleave(h // g, dim=2)); L = exp(segsum(ΔA)) per chunk",
        "diagonal blocks: einsum of L ∘ (C Bᵀ) with Δ·x; chunk states S_c with the last row of L "
        "as the decay to the chunk's end",
        "state passing H_{c+1} = exp(Σ_c)·H_c + S_c from H_0 = initial_states; off-diagonal y += "
        "exp(cs_t)·C_t·H_c; cut the padding off and return (y, H_last)",
    ],
}

f64 = torch.float64


# --------------------------------------------------------------------------------------------
# segsum
def _segsum_cases(g):
    """(description, x) pairs; x plays the role of Δ·A (≤ 0)."""
    r = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
    neg = lambda *s, scale=1.0: -torch.rand(*s, generator=g, dtype=f64) * scale
    T = r(5, 12)
    reset = neg(2, 300).float()  # ordinary steps, then one huge decay step early on
    reset[:, r(3, 20)] = -1e5
    huge = neg(2, 24, scale=3e37).float() - 1e37  # cumsum overflows float32 after a few steps
    return [
        ("random x (3, T)", neg(3, T)),
        ("a batch (2, 4, T) with odd T", neg(2, 4, 2 * T + 1)),
        ("T = 1", neg(2, 1)),
        ("positive and negative x", torch.randn(2, T, generator=g, dtype=f64)),
        ("float32 x", neg(3, 2 * T, scale=4.0).float()),
        ("float32, one huge decay step Δ·A = −1e5 then ordinary steps (T = 300)", reset),
        ("float32, Δ·A ≈ −3e37 per step (the cumsum overflows to −inf)", huge),
    ]


def segsum(fn):
    """Check ``fn(x) -> S``, S[..., t, s] = x_{s+1} + … + x_t for t ≥ s, −∞ above the diagonal."""
    g = _core.generator()
    n_checks = 0
    for desc, x in _segsum_cases(g):
        case = f"{desc}: " + _core.describe(x=x)
        want = ssd.segsum(x.to(f64)).to(x.dtype)  # exact sums, rounded once to x's dtype
        got = _core.call(fn, x.clone(), case=case)
        _core.compare(got, want, what="segsum", case=case, g=g)
        n_checks += 1
    # a non-contiguous x (a transposed view) must give the same answer
    x = -torch.rand(7, 3, generator=g, dtype=f64).T
    case = "non-contiguous x: " + _core.describe(x=x)
    _core.compare(_core.call(fn, x, case=case), ssd.segsum(x.contiguous()), what="segsum",
                  case=case, g=g)
    _core.passed("segsum", n_checks + 1)


# --------------------------------------------------------------------------------------------
# ssd_chunked
def _ssd_inputs(g, b, l, h, p, g_, n, dt_range=(0.01, 0.5), A_range=(0.1, 2.0), dtype=f64,
                with_h0=False):
    """x, dt, A, B, C (and h0) in mamba_ssm's layouts; dt > 0, A < 0, float64 unless asked."""
    r = lambda *s: torch.randn(*s, generator=g, dtype=f64)
    u = lambda lo, hi, *s: torch.rand(*s, generator=g, dtype=f64) * (hi - lo) + lo
    x, B, C = r(b, l, h, p), r(b, l, g_, n), r(b, l, g_, n)
    dt, A = u(*dt_range, b, l, h), -u(*A_range, h)
    h0 = r(b, h, p, n) if with_h0 else None
    cast = lambda t: None if t is None else t.to(dtype)
    return tuple(map(cast, (x, dt, A, B, C, h0)))


def _ssd_cases(g):
    """(description, inputs (x, dt, A, B, C, h0), chunk size q)."""
    r = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
    q = r(3, 7)
    return [
        ("q divides l, 2 groups of 2 heads", _ssd_inputs(g, 2, 4 * q, 4, 3, 2, 5), q),
        ("q does not divide l", _ssd_inputs(g, 1, 3 * q + r(1, q), 2, 3, 1, 4), q),
        ("an initial state", _ssd_inputs(g, 2, 2 * q + 1, 3, 2, 1, 3, with_h0=True), q),
        ("length l = 1", _ssd_inputs(g, 2, 1, 2, 3, 2, 4, with_h0=True), q),
        ("q = 1", _ssd_inputs(g, 1, 7, 2, 2, 1, 3), 1),
        ("q larger than l", _ssd_inputs(g, 1, 5, 2, 3, 1, 4, with_h0=True), 8),
        ("many chunks, tiny Δ (long memory across chunks)",
         _ssd_inputs(g, 1, 61, 2, 2, 1, 3, dt_range=(1e-4, 1e-3), with_h0=True), 4),
        ("large negative Δ·A (−100…−300 per step: exp(cumsum) underflows to 0)",
         _ssd_inputs(g, 1, 40, 2, 3, 1, 4, dt_range=(2.0, 5.0), A_range=(50.0, 60.0),
                     with_h0=True), 16),
        ("float32 inputs", _ssd_inputs(g, 2, 37, 4, 4, 2, 8, dtype=torch.float32), 8),
    ]


def _one_ssd(fn, inputs, q, desc, g):
    x, dt, A, B, C, h0 = inputs
    case = f"{desc}: " + _core.describe(x=x, B=B, chunk_size=q, initial_states=h0)
    up = lambda t: None if t is None else t.to(f64)
    want, want_last = ssd.ssd_sequential(up(x), up(dt), up(A), up(B), up(C), up(h0))
    kw = {} if h0 is None else {"initial_states": h0}
    got = _core.call(fn, x, dt, A, B, C, q, **kw, case=case)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise AssertionError(f"ssd_chunked must return (y, final_state); got "
                             f"{_core.kind(got)} on {case}")
    _core.compare(got[0], want, what="ssd_chunked: the output y", case=case, g=g, dtype=x.dtype)
    _core.compare(got[1], want_last, what="ssd_chunked: the final state", case=case, g=g,
                  dtype=x.dtype)


def ssd_chunked(fn):
    """Check ``fn(x, dt, A, B, C, chunk_size, initial_states=None) -> (y, final_state)``.

    x (b, l, h, p), dt (b, l, h) positive, A (h,) negative, B/C (b, l, g, n), initial_states
    (b, h, p, n) → y (b, l, h, p), final state (b, h, p, n), against the sequential scan; chunk
    sizes that do and do not divide l, l = 1, q = 1, q > l, groups, an initial state, tiny and
    huge Δ, float32, non-contiguous inputs.
    """
    g = _core.generator()
    cases = _ssd_cases(g)
    for desc, inputs, q in cases:
        _one_ssd(fn, inputs, q, desc, g)
    # non-contiguous x and B: stored with other axes last, viewed in mamba_ssm's layouts
    x, dt, A, B, C, h0 = _ssd_inputs(g, 2, 13, 2, 3, 1, 4, with_h0=True)
    x = x.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)  # stored (b, p, l, h)
    B = B.transpose(1, 3).contiguous().transpose(1, 3)  # stored (b, n, g, l)
    _one_ssd(fn, (x, dt, A, B, C, h0), 4, "non-contiguous x and B", g)
    _core.passed("ssd_chunked", len(cases) + 1)
