"""Checks for chapter 14: ``rank_scan`` (the ⊗-scan of rank summaries) and ``fix_up``.

``rank_scan`` is checked against ``ops.fold`` on diagonal summaries (Mamba-1 and Mamba-2
layouts) and on 2×2 matrices, where a product taken in the wrong order shows; the ⊗ it applies
between two ranks is then put through ``tree_order`` (every bracketing must agree). ``fix_up``
is checked against the oracle scanned from the given state.
"""

import torch

from mambalearn import ops
from mambalearn.check import _core
from mambalearn.check.treeorder import tree_order
from mambalearn.scan.sequential import selective_scan_sequential

__all__ = ["rank_scan", "fix_up"]

# The library functions each exercise rebuilds: the grader blocks them while grading.
# (and for rank_scan every earlier scan of h_t = a_t h_{t−1} + b_t; for fix_up every earlier
# scan that starts from a given state: run from H with zero input, it is the fix-up)
REBUILDS = {
    "rank_scan": ["mambalearn.parallel.summary.rank_scan", "@linear scans"],
    "fix_up": ["mambalearn.parallel.summary.fix_up",
               "mambalearn.inference.initial_state_contribution",
               "mambalearn.inference.decode_step", "@mamba1 scans", "@ssd"],
}

HINTS = {
    "rank_scan": [
        "H_0 = initial_state (or zeros); H_{r+1} = P_r H_r + h_r: a loop over the ranks with "
        "ops.apply((P[r], h[r]), H) handles diagonal and matrix P",
        "return (torch.stack of H_0 … H_{R−1}, H_R): the state entering each rank, and the last",
    ],
    "fix_up": [
        "decay_t = exp(A · cumsum(Δ) up to t): (b, d, l, n); the start state reaches step t as "
        "decay_t ⊙ H",
        "y += Σ_n C_t · (decay_t ⊙ H) (groups: C.repeat_interleave(d // g, dim=1)); last += "
        "decay at the last step ⊙ H",
    ],
}

f64 = torch.float64


def _summary_cases(g):
    """(description, P, h, initial_state or None)."""
    ri = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
    decay = lambda *s: torch.rand(*s, generator=g, dtype=f64) * 0.8 + 0.2
    r = lambda *s: torch.randn(*s, generator=g, dtype=f64)
    odd = 2 * ri(1, 4) + 1
    return [
        ("one rank", decay(1, 2, 3, 4), r(1, 2, 3, 4), None),
        ("two ranks, Mamba-1 layout (R, b, d, n)", decay(2, 2, 3, 4), r(2, 2, 3, 4), None),
        (f"{odd} ranks with an initial state", decay(odd, 2, 3, 4), r(odd, 2, 3, 4), r(2, 3, 4)),
        ("Mamba-2 layout: P (R, b, h, 1, 1) broadcast over h (R, b, h, p, n)",
         decay(4, 1, 3, 1, 1), r(4, 1, 3, 2, 5), r(1, 3, 2, 5)),
        (f"2×2 matrices P (R={odd}, 2, 2), h (R, 2): order matters", r(odd, 2, 2) / 1.5,
         r(odd, 2), r(2)),
        ("8 ranks, 3×3 matrices with an initial state", r(8, 3, 3) / 2, r(8, 3), r(3)),
    ]


def _want(P, h, h0):
    start = (ops.identity(P[0], h[0])[0] * 0, torch.zeros_like(h[0]) if h0 is None else h0)
    prefixes = [start]
    for k in range(h.shape[0]):
        prefixes.append(ops.combine(prefixes[-1], (P[k], h[k])))
    return torch.stack([p[1] for p in prefixes[:-1]]), prefixes[-1][1]


def _induced_op(fn):
    """The ⊗ that ``fn`` applies between two 2×2 summaries, read off as an affine map:
    u = fn(...) from a zero state, A's columns = fn(...) from e_i minus u."""
    def op(left, right):
        P, h = torch.stack([left[0], right[0]]), torch.stack([left[1], right[1]])
        u = _final(fn, P, h, None, "a tree-order check")
        cols = [_final(fn, P, h, e, "a tree-order check") - u for e in torch.eye(2, dtype=f64)]
        return torch.stack(cols, -1), u

    return op


def _final(fn, P, h, h0, case):
    got = _core.call(fn, P, h, h0, case=case)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise AssertionError(f"rank_scan must return (H, H_final); got {_core.kind(got)} "
                             f"on {case}")
    return got[1]


def rank_scan(fn):
    """Check ``fn(P, h, initial_state=None) -> (H, H_final)``.

    H[r] is the state entering rank r (H[0] = initial_state or 0), H_final the state after the
    last rank: H_{r+1} = P_r H_r + h_r, for diagonal P (broadcastable to h) and full matrices.
    """
    g = _core.generator()
    n_checks = 0
    for desc, P, h, h0 in _summary_cases(g):
        case = f"{desc}: " + _core.describe(P=P, h=h, initial_state=h0)
        want, want_final = _want(P, h, h0)
        got = _core.call(fn, P, h, h0, case=case)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise AssertionError(f"rank_scan must return (H, H_final); got "
                                 f"{_core.kind(got)} on {case}")
        _core.compare(got[0], want, what="rank_scan: the entering state H of each rank",
                      case=case, g=g)
        _core.compare(got[1], want_final, what="rank_scan: the final state", case=case, g=g)
        n_checks += 2
    n_checks += tree_order(_induced_op(fn), name="the ⊗ of rank_scan", matrix=True, g=g)
    _core.passed("rank_scan", n_checks)


def _fix_up_cases(g):
    """(description, b, d, l, n, C layout, Δ scale)."""
    ri = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
    return [
        ("one token", 2, 3, 1, 4, "shared", 1.0),
        (f"an odd length l = {2 * ri(3, 9) + 1}", 2, 4, 2 * ri(3, 9) + 1, 3, "shared", 1.0),
        ("grouped C (b, g = 2, n, l)", 1, 4, 9, 2, "grouped", 1.0),
        ("large Δ (the carry decays away)", 1, 2, 6, 3, "shared", 8.0),
        ("tiny Δ (the carry survives)", 2, 2, 7, 3, "grouped", 1e-3),
    ]


def fix_up(fn):
    """Check ``fn(y, last, delta, A, C, H) -> (y, last)``: a zero-start shard continued from H.

    y (b, d, l) and last (b, d, n) come from the scan started at zero; delta (b, d, l) is Δ as
    the scan uses it (bias added, softplus applied: positive); A (d, n); C (b, n, l) or
    (b, g, n, l); H (b, d, n). The result must equal the scan started at H:
    y_t + C_t (exp(A Σ_{s≤t} Δ_s) ⊙ H) and exp(A ΣΔ) ⊙ H + last.
    """
    g = _core.generator()
    n_checks = 0
    for desc, b, d, l, n, layout, scale in _fix_up_cases(g):
        r = lambda *s: torch.randn(*s, generator=g, dtype=f64)
        delta = torch.rand(b, d, l, generator=g, dtype=f64) * scale
        A, H = -torch.exp(r(d, n) * 0.5), r(b, d, n)
        u = r(b, d, l)
        B, C = ((r(b, n, l), r(b, n, l)) if layout == "shared" else (r(b, 2, n, l),
                                                                     r(b, 2, n, l)))
        y0, last0 = selective_scan_sequential(u, delta, A, B, C, return_last_state=True)
        want, want_last = selective_scan_sequential(u, delta, A, B, C, return_last_state=True,
                                                    initial_state=H)
        case = f"{desc}: " + _core.describe(y=y0, delta=delta, A=A, C=C, H=H)
        got = _core.call(fn, y0, last0, delta, A, C, H, case=case)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise AssertionError(f"fix_up must return (y, last); got {_core.kind(got)} on "
                                 f"{case}")
        _core.compare(got[0], want, what="fix_up: the output y", case=case, g=g)
        _core.compare(got[1], want_last, what="fix_up: the last state", case=case, g=g)
        n_checks += 2
    _core.passed("fix_up", n_checks)
