"""What every scan of h_t = a_t h_{t−1} + b_t shares: argument checks, time-first layout, counting.

A scan takes the steps as two tensors, ``a`` (the decays Ā_t) and ``b`` (the inputs B̄_t x_t), and a
``dim`` naming the time axis of ``b``. Two kinds of ``a``:

    diagonal  a broadcasts elementwise to b's shape     (Mamba: a (b, d, l, n), b (b, d, l, n))
    matrix    a has one more trailing dim: a (..., l, n, n), b (..., l, n)   (full state matrix)

:func:`time_first` checks them, moves time to dim 0 (a view, nothing copied), flips it for
``reverse=True``, and returns a ``restore`` function that undoes both on the result. The scan
algorithms of chapter 04 then only ever see time-first steps, ``a[t], b[t]``.
"""

import torch

from mambalearn.utils import check_same_device, check_tensor


class ScanCounter:
    """Counts what a scan does: ``work`` = combine applications, ``depth`` = sequential rounds.

    A vectorized scan calls ``counter.add(n, ...)`` once per round in which it applies ⊗ to ``n``
    pairs at once. ``src``/``dst`` (time indices, the pair's earlier and later element) and
    ``phase`` are optional; chapter 04 draws the tree from them.
    """

    def __init__(self):
        self.work, self.depth, self.rounds = 0, 0, []

    def add(self, n, src=None, dst=None, phase=""):
        self.work += int(n)
        self.depth += 1
        self.rounds.append(dict(n=int(n), src=src, dst=dst, phase=phase))

    def __repr__(self):
        return f"ScanCounter(work={self.work}, depth={self.depth})"


def is_matrix(a, b):
    """True if ``a`` holds full n×n matrices for the vectors of ``b`` (one more dimension)."""
    return a.ndim == b.ndim + 1


def time_first(a, b, dim=-1, reverse=False):
    """Check the steps (a, b); return ``(a, b, restore)`` with time on dim 0 (flipped if reverse).

    Shapes (diagonal):  a broadcastable to b,  b (..., l, ...) with l on ``dim``
    Shapes (matrix):    a (..., l, ..., n, n), b (..., l, ..., n); ``dim`` counts in b, not the last
    ``restore(h)`` maps a time-first result back to b's layout (and order).
    """
    check_tensor("b", b)
    check_tensor("a", a)
    check_same_device(a=a, b=b)
    if b.ndim == 0:
        raise ValueError("b must have a time dimension, got a 0-d tensor")
    matrix = is_matrix(a, b)
    if matrix:
        n = b.shape[-1]
        if a.shape[-2:] != (n, n) or not _broadcasts(a.shape[:-2], b.shape[:-1]):
            raise ValueError(f"matrix a must have shape (..., n, n) = {(*b.shape[:-1], n, n)} "
                             f"(or broadcast to it) for b of shape {tuple(b.shape)}; "
                             f"got {tuple(a.shape)}")
        a = a.expand(*b.shape, n)
    else:
        if a.ndim > b.ndim or not _broadcasts(a.shape, b.shape):
            raise ValueError(f"a of shape {tuple(a.shape)} must broadcast elementwise to b's "
                             f"{tuple(b.shape)} (diagonal a), or be (..., n, n) matrices with one "
                             f"more dimension than b")
        a = a.expand(b.shape)
    last = b.ndim - 1 if matrix else b.ndim  # valid time dims are 0 .. last-1
    if not -b.ndim <= dim < b.ndim:
        raise ValueError(f"dim={dim} is out of range for b of shape {tuple(b.shape)}")
    dim = dim % b.ndim
    if dim >= last:
        raise ValueError(f"dim={dim} is b's state axis n, not time: with matrix a (..., n, n) the "
                         f"time axis of b (..., l, n) must come before n")
    if b.shape[dim] == 0:
        raise ValueError(f"b has length 0 on the time axis dim={dim}; a scan needs ≥ 1 step")
    a, b = a.movedim(dim, 0), b.movedim(dim, 0)  # (l, ...): a view
    if reverse:
        a, b = a.flip(0), b.flip(0)

    def restore(h):
        return (h.flip(0) if reverse else h).movedim(0, dim)

    return a, b, restore


def _broadcasts(shape, target):
    try:
        return torch.broadcast_shapes(shape, target) == tuple(target)
    except RuntimeError:
        return False
