"""Checks for chapter 07: ``scan_backward`` and ``ChunkedScanFn`` against autograd through the loop.

The oracle is PyTorch's own autograd through ``mambalearn.scan.chunked.scan_reference`` in float64
(the gradients of the same expression, computed another way). ``ChunkedScanFn`` must also keep
only its inputs and one state per chunk: the bytes it saves for the backward are counted with
``torch.autograd.graph.saved_tensors_hooks`` (and tensors hung on ``ctx`` are counted too).
"""

import torch

from mambalearn.check import _core, _probes
from mambalearn.scan.chunked import scan_reference

__all__ = ["scan_backward", "ChunkedScanFn"]
REBUILDS = {  # (torch's checkpoint recomputes by itself: ChunkedScanFn is to do it by hand)
    "scan_backward": ["mambalearn.autograd.scan_backward"],
    "ChunkedScanFn": ["mambalearn.autograd.ChunkedScanFn", "torch.utils.checkpoint.checkpoint",
                      "torch.utils.checkpoint.checkpoint_sequential"],
}

HINTS = {
    "scan_backward": [
        "loop t = l − 1 down to 0: dh_t = g_t + a_{t+1}·dh_{t+1} (the gate of the *next* step; 0 "
        "past the end)",
        "grad_b = dh; grad_a_t = dh_t · h_{t−1}, with h_{−1} = initial_state or zeros: shift h by "
        "one step along time",
    ],
    "ChunkedScanFn": [
        "forward: h = chunked_scan(…); save a, b and the states entering each chunk as a copy "
        "(torch.stack or .clone() of h[..., kQ − 1, :]), never h or a slice of it",
        "backward, chunk by chunk from the last: recompute its states from H_k, add the gradient "
        "coming back from the next chunk to its last state's grad_h, call your scan_backward",
        "the gradient of H_k is a_{kQ} · (∂b at step kQ); pass it on to the previous chunk, and "
        "return it as the initial state's gradient (None when there was none)",
    ],
}


def _problem(shape, with_h0, g):
    a = (torch.rand(shape, generator=g, dtype=torch.float64) * 0.75 + 0.3).requires_grad_()
    b = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = None
    if with_h0:
        h0 = torch.randn(shape[:-2] + shape[-1:], generator=g, dtype=torch.float64,
                         requires_grad=True)
    return a, b, h0


def _oracle(a, b, h0, grad_h):
    """h and the gradients of ⟨grad_h, h⟩ w.r.t. a, b (and h0) by autograd through the loop."""
    h = scan_reference(a, b, h0)
    inputs = [a, b] + ([h0] if h0 is not None else [])
    return h.detach(), torch.autograd.grad(h, inputs, grad_h)


def scan_backward(fn):
    """Check ``fn(a, h, grad_h, initial_state=None) -> (grad_a, grad_b)``."""
    g = _core.generator()
    r = int(torch.randint(5, 12, (1,), generator=g))
    cases = [("l = 1", (2, 3, 1, 2), False), ("l = 1 with an initial state", (1, 2, 1, 3), True),
             (f"l = {r}", (2, 2, r, 3), False),
             (f"l = {r + 4} with an initial state", (1, 3, r + 4, 2), True),
             ("a 2-D (l, n) problem", (9, 4), True)]
    for desc, shape, with_h0 in cases:
        a, b, h0 = _problem(shape, with_h0, g)
        grad_h = torch.randn(shape, generator=g, dtype=torch.float64)
        h, want = _oracle(a, b, h0, grad_h)
        case = f"{desc}: " + _core.describe(a=a, initial_state=h0)
        h0_in = None if h0 is None else h0.detach()
        got, runs = _core.probe(_probes.call_counting_backward, fn, a.detach(), h, grad_h,
                                initial_state=h0_in, case=case)
        if runs:
            raise AssertionError(
                f"scan_backward ran PyTorch's autograd ({runs} backward pass(es), through "
                f"torch.autograd.grad, .backward() or torch.func) on {case}: compute the "
                f"gradients with the reverse scan you derived, not by differentiating a forward")
        if not (isinstance(got, tuple) and len(got) == 2):
            raise AssertionError(f"scan_backward must return (grad_a, grad_b); got "
                                 f"{_core.kind(got)} on {case}")
        for what, x, y in zip(("grad_a", "grad_b"), got, want[:2], strict=True):
            _core.compare(x, y, what=f"scan_backward: {what}", case=case, g=g, grad=True)
    _core.passed("scan_backward", len(cases))


def ChunkedScanFn(cls):  # noqa: N802 - the exercise is a class
    """Check ``cls.apply(a, b, chunk_size, initial_state)``: h, the gradients of a, b and
    initial_state, and that it saves only the inputs plus one (…, n) state per chunk."""
    g = _core.generator()
    cases = [("q dividing l", (2, 2, 12, 3), 4, False),
             ("q not dividing l", (1, 3, 13, 2), 4, True),
             ("l = 1", (2, 2, 1, 2), 3, True), ("q = 1", (1, 2, 5, 2), 1, False),
             ("q larger than l", (1, 2, 5, 2), 8, True)]
    for desc, shape, q, with_h0 in cases:
        a, b, h0 = _problem(shape, with_h0, g)
        grad_h = torch.randn(shape, generator=g, dtype=torch.float64)
        h_want, want = _oracle(a, b, h0, grad_h)
        case = f"{desc}: " + _core.describe(a=a, chunk_size=q, initial_state=h0)
        h, got = _core.probe(_probes.chunked_fn_grads, cls, a.detach(), b.detach(), q,
                             None if h0 is None else h0.detach(), grad_h, case=case)
        _core.compare(h, h_want, what="ChunkedScanFn forward: h", case=case, g=g)
        names = ("grad of a", "grad of b", "grad of initial_state")
        for what, x, y in zip(names, got, want, strict=False):
            if x is None:
                raise AssertionError(f"ChunkedScanFn backward returned no {what} on {case}")
            _core.compare(x, y, what=f"ChunkedScanFn backward: {what}", case=case, g=g, grad=True)
    _check_saved_memory(cls, g)
    _core.passed("ChunkedScanFn", len(cases) + 1)


def _check_saved_memory(cls, g):
    """Beyond its inputs, the Function may keep about one state per chunk, never all l states."""
    shape, q = (2, 3, 64, 4), 8
    a, b, h0 = (x.detach() for x in _problem(shape, True, g))
    extra = _core.probe(_probes.chunked_fn_saved_bytes, cls, a, b, q, h0, case="the memory check")
    if not isinstance(extra, int):
        raise AssertionError(f"the memory check could not count your saved tensors ({extra!r})")
    per_state = 2 * 3 * 4 * 8  # one (b, d, n) float64 state
    chunks = shape[2] // q
    if extra > 2 * (chunks + 1) * per_state:
        raise AssertionError(
            f"ChunkedScanFn keeps {extra} bytes beyond its inputs for the backward, for l = 64 and "
            f"chunk_size = 8: one state per chunk would be {chunks * per_state} bytes and all the "
            f"states {shape[2] * per_state}. Save a, b and the {chunks} chunk-entry states only "
            f"(a slice of h keeps all of h alive: copy the boundary states)."
        )
