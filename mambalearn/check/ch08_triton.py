"""Checks for chapter 08: a Triton scan kernel and the ⊗ combine it uses.

The exercise writes three things: ``combine_fn`` (⊗ as a ``@triton.jit`` function), the kernel
body (a blocked scan with a carry between blocks) and the launcher ``scan_kernel(a, b, block_l)``.
The notebook's check cell is ``check.scan_kernel(scan_kernel, combine_fn)``.

Why the combine is checked on its own: Triton's CPU interpreter runs ``tl.associative_scan`` as a
left fold, so a combine that drops a_l, (a_r, a_r·u_l + u_r), still produces the right h there —
and the wrong one on a GPU, which combines in a tree. `tree_order` tries every kind of bracketing.
"""

import torch

from mambalearn import device
from mambalearn.check import _core
from mambalearn.check.treeorder import tree_order

__all__ = ["scan_kernel"]


def _oracle(a, b):
    """h_t = a_t·h_{t−1} + b_t, a plain loop in float64. Shapes: a, b, h (r, l)."""
    a64, b64 = a.double(), b.double()  # (r, l)
    h, state = torch.empty_like(b64), torch.zeros_like(b64[:, 0])  # (r, l), (r,)
    for t in range(a.shape[1]):
        state = a64[:, t] * state + b64[:, t]
        h[:, t] = state
    return h


def _case(r, l, block_l, g, transposed=False):
    """Fresh (a, b) of shape (r, l) on the course device: |a| in [0.5, 1) with random signs."""
    shape = (l, r) if transposed else (r, l)
    sign = torch.randint(0, 2, shape, generator=g).double() * 2 - 1
    a = sign * (0.5 + 0.5 * torch.rand(shape, generator=g, dtype=torch.float64))
    b = torch.randn(shape, generator=g, dtype=torch.float64)
    a, b = (x.float().to(device.get()) for x in (a, b))
    if transposed:  # a (r, l) view with stride (1, r): the launcher must honour strides
        a, b = a.t(), b.t()
    return a, b


def _hint(err, block_l):
    """Name the likely bug when the first wrong step is the first step of a later block."""
    import re

    m = re.search(r"first wrong index \(\d+, (\d+)\)", str(err))
    if m and int(m.group(1)) > 0 and int(m.group(1)) % block_l == 0:
        return (f"\nhint: step {m.group(1)} is the first step of block {int(m.group(1)) // block_l}"
                " and everything before it is right: is the state carried in from the previous "
                "block (h = A·h_carry + U) missing?")
    return ""


def scan_kernel(fn, combine_fn):
    """Check ``fn(a, b, block_l) -> h`` (h_t = a_t·h_{t−1} + b_t, rows (r, l)) and its ⊗.

    1. ``combine_fn(a_l, u_l, a_r, u_r)`` against ⊗ in every bracketing (`tree_order`).
    2. ``fn`` on fresh random rows: one step, one partial block, several blocks with a partial
       last one, exact blocks, strided (transposed) inputs; against a float64 loop.
    """
    g = _core.generator()
    n = tree_order(combine_fn, name="combine_fn", g=g)
    cases = [  # (rows, length, block_l, transposed)
        (1, 1, 4, False),  # a single step
        (3, 7, 8, False),  # odd length, one partial block
        (2, 37, 8, False),  # five blocks, the last partial: needs the carry
        (4, 16, 16, False),  # exactly one full block
        (2, 33, 4, False),  # many small blocks
        (3, 21, 8, True),  # non-contiguous rows
    ]
    for r, l, block_l, transposed in cases:
        a, b = _case(r, l, block_l, g, transposed)
        case = f"rows={r}, l={l}, block_l={block_l}" + (" (transposed input)" if transposed else "")
        h = _core.call(fn, a, b, block_l=block_l, case=case)
        try:
            _core.compare(h, _oracle(a, b), what="scan_kernel(a, b, block_l)", case=case, g=g,
                          dtype=torch.float32)
        except AssertionError as e:
            raise AssertionError(str(e) + _hint(e, block_l)) from None
        n += 1
    _core.passed("scan_kernel", n)
