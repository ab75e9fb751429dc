"""Checks for chapter 06: ``chunked_scan`` against the loop ``scan.chunked.scan_reference``."""

import torch

from mambalearn.check import _core
from mambalearn.scan.chunked import scan_reference

__all__ = ["chunked_scan"]
# The chunked scan and every library scan that returns the same states for (b, d, l, n) inputs
# (chapter 08's Triton scan among them: a later chapter's, so not in this chapter's library).
REBUILDS = {
    "chunked_scan": ["@linear scans", "mambalearn.scan.chunked._local_scan"],
}

HINTS = {
    "chunked_scan": [
        "pad the end with identity steps (a = 1, b = 0) to c·q steps and reshape to (batch, d, c, "
        "q, n); inside every chunk scan from zero with ops.combine in a loop over the q positions",
        "the chunk's local prefix (P_j, h̃_j) applied to the state entering it gives h: h = P·H_k "
        "+ h̃; H_{k+1} = P_last·H_k + h̃_last, H_0 = initial_state (or zeros)",
        "cut the padding off before returning; with return_final_state=True return (h, h[..., "
        "l − 1, :]); make no assumption on the inputs' strides (use reshape, not view)",
    ],
}


def _steps(shape, g):
    """Gates a in (0.3, 1.05) (a few slightly > 1, as exp(ΔA) never is but a scan must not care)
    and inputs b ~ N(0, 1), float64."""
    a = torch.rand(shape, generator=g, dtype=torch.float64) * 0.75 + 0.3
    return a, torch.randn(shape, generator=g, dtype=torch.float64)


def _cases(g):
    """(description, shape (b, d, l, n), chunk size q, with initial state?)."""
    r = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
    q = r(3, 6)
    return [
        ("q dividing l", (2, 3, 4 * q, 2), q, False),
        ("q not dividing l", (1, 2, 3 * q + r(1, q), 3), q, False),
        ("an initial state", (2, 2, 2 * q + 1, 2), q, True),
        ("length l = 1", (2, 3, 1, 2), q, True),
        ("q = 1", (1, 2, 7, 2), 1, False),
        ("q larger than l", (1, 2, 5, 3), 8, True),
        ("many chunks", (1, 1, 61, 2), 4, True),
    ]


def chunked_scan(fn):
    """Check ``fn(a, b, chunk_size, initial_state=None, return_final_state=False)``.

    a, b are (b, d, l, n).

    It must give every state h_t of h_t = a_t h_{t−1} + b_t, for chunk sizes that do and do not
    divide l, l = 1, an initial state, non-contiguous inputs, and return (h, h_{l−1}) on request.
    """
    g = _core.generator()
    n_checks = 0
    for desc, shape, q, with_h0 in _cases(g):
        a, b = _steps(shape, g)
        h0 = None
        if with_h0:
            h0 = torch.randn(shape[:2] + shape[3:], generator=g, dtype=torch.float64)  # (b, d, n)
        case = f"{desc}: " + _core.describe(a=a, chunk_size=q, initial_state=h0)
        want, want_last = scan_reference(a, b, h0, return_final_state=True)
        got = _core.call(fn, a, b, q, initial_state=h0, case=case)
        _core.compare(got, want, what="chunked_scan: the state sequence h", case=case, g=g)
        got = _core.call(fn, a, b, q, initial_state=h0, return_final_state=True, case=case)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise AssertionError(f"chunked_scan(..., return_final_state=True) must return (h, "
                                 f"h_last); got {_core.kind(got)} on {case}")
        _core.compare(got[0], want, what="chunked_scan: the state sequence h", case=case, g=g)
        _core.compare(got[1], want_last, what="chunked_scan: the final state", case=case, g=g)
        n_checks += 2
    # non-contiguous layouts: time as the last stored dimension, transposed into (b, d, l, n);
    # then a contiguous a with a transposed b (one layout each)
    a, b = (x.transpose(-1, -2) for x in _steps((2, 2, 3, 11), g))
    for desc, a_, b_ in (("non-contiguous a, b", a, b), ("contiguous a, transposed b",
                                                         a.contiguous(), b)):
        case = f"{desc}: " + _core.describe(a=a_, chunk_size=4)
        _core.compare(_core.call(fn, a_, b_, 4, case=case), scan_reference(a_, b_),
                      what="chunked_scan: the state sequence h", case=case, g=g)
    _core.passed("chunked_scan", n_checks + 2)
