"""Checks for chapter 08: a Triton scan kernel and the ⊗ combine it uses.

The exercise writes three things: ``combine_fn`` (⊗ as a ``@triton.jit`` function), the kernel
body (a blocked scan with a carry between blocks) and the launcher ``scan_kernel(a, b, block_l)``.
The notebook's check cells are ``check.combine_fn(combine_fn)`` and
``check.scan_kernel(scan_kernel, combine_fn)``.

The launcher gets ``a`` and ``b`` in different layouts (one transposed, one a strided slice): a
kernel launched with one tensor's strides for both reads the other one wrong. Its h must come from
a Triton kernel (a PyTorch loop in its place computes the right numbers and teaches nothing): while
it runs PyTorch may only make, view and copy tensors, the buffers it hands a kernel must be inputs
or PyTorch's own, and the h it returns must have been written by a launch (``triton_evidence``).

Why the combine is checked on its own: Triton's CPU interpreter runs ``tl.associative_scan`` as a
left fold, so a combine that drops a_l, (a_r, a_r·u_l + u_r), still produces the right h there —
and the wrong one on a GPU, which combines in a tree. `tree_order` tries every kind of bracketing.
"""

import torch

from mambalearn import device
from mambalearn.check import _core, _probes
from mambalearn.check.treeorder import tree_order

__all__ = ["combine_fn", "scan_kernel"]
REBUILDS = {
    "combine_fn": ["@elementwise combines"],
    "scan_kernel": ["mambalearn.triton.scan.scan", "mambalearn.triton.scan.scan_single_block",
                    "mambalearn.triton.scan.scan_reference",
                    "mambalearn.triton.scan._scan_blocked_kernel",
                    "mambalearn.triton.scan._scan_single_block_kernel"],
}

HINTS = {
    "combine_fn": [
        "(a_l, u_l) is the earlier step: return a_r * a_l, a_r * u_l + u_r (a_r multiplies both)",
        "a combine right only in the left-to-right order the interpreter uses is wrong on a GPU: "
        "check (((s0⊗s1)⊗s2) against (s0⊗(s1⊗s2)) on paper",
    ],
    "scan_kernel": [
        "launcher: a, b = a.contiguous(), b.contiguous(); h = torch.empty_like(a); launch "
        "scan_rows_kernel[(r,)](a, b, h, l, *a.stride(), BLOCK_L=block_l) and return h",
        "kernel: per block, load with other=1.0 for a and 0.0 for b, A, U = tl.associative_scan((a,"
        " b), axis=0, combine_fn=combine_fn), h = A·carry + U, store under the mask",
        "the next carry is h at lane BLOCK_L − 1: tl.sum(tl.where(offs == BLOCK_L − 1, h, 0.0), "
        "axis=0); every value of h must come from the kernel, not from PyTorch",
    ],
}


def _oracle(a, b):
    """h_t = a_t·h_{t−1} + b_t, a plain loop in float64. Shapes: a, b, h (r, l)."""
    a64, b64 = a.double(), b.double()  # (r, l)
    h, state = torch.empty_like(b64), torch.zeros_like(b64[:, 0])  # (r, l), (r,)
    for t in range(a.shape[1]):
        state = a64[:, t] * state + b64[:, t]
        h[:, t] = state
    return h


_LAYOUTS = {  # how a stored (r, l) tensor is viewed: each a different pair of strides
    "contiguous": lambda x: x,
    "transposed": lambda x: x.t().contiguous().t(),  # stride (1, r)
    "strided slice": lambda x: torch.cat([x, x], dim=1)[:, ::2],  # stride (2l, 2)
    "offset view": lambda x: torch.cat([x[:1], x])[1:],  # storage offset l, stride (l, 1)
}


def _case(r, l, block_l, g, layout=("contiguous", "contiguous")):
    """Fresh (a, b) of shape (r, l) on the course device: |a| in [0.5, 1) with random signs."""
    sign = torch.randint(0, 2, (r, l), generator=g).double() * 2 - 1
    a = sign * (0.5 + 0.5 * torch.rand((r, l), generator=g, dtype=torch.float64))
    b = torch.randn((r, l), generator=g, dtype=torch.float64)
    a, b = (x.float().to(device.get()) for x in (a, b))
    return _LAYOUTS[layout[0]](a), _LAYOUTS[layout[1]](b)


def combine_fn(fn):
    """Check a Triton ``combine_fn(a_l, u_l, a_r, u_r) -> (a_r·a_l, a_r·u_l + u_r)`` in every
    bracketing (``tree_order``): the interpreter's left fold would hide a wrong one."""
    g = _core.generator()
    n = tree_order(fn, name="combine_fn", g=g)
    _core.passed("combine_fn", n)


def triton_evidence(name, seen, case, kernel):
    """Raise unless ``seen`` (of ``_probes.call_watching_triton``) shows the output is Triton's."""
    if not seen["launched"]:
        raise AssertionError(f"{name} launched no Triton kernel on {case}: it must run your "
                             f"{kernel} (kernel[grid](...)), not compute in PyTorch")
    if seen["computed"]:
        raise AssertionError(
            f"{name} computed with PyTorch outside its Triton kernel on {case} "
            f"({', '.join(seen['computed'])}): while it runs, PyTorch may only make, view and copy "
            f"tensors; every value it returns must come from your {kernel}")
    if seen["foreign"]:
        raise AssertionError(f"{name} on {case}: {seen['foreign'][0]}; hand your kernel the inputs "
                             f"and buffers made with torch (torch.empty_like, …) only")
    for who in seen["returned"]:
        if who != "triton":
            what = {"input": "one of its inputs", "not made by PyTorch": "a tensor not made by "
                    "PyTorch (numpy memory?)"}.get(who, f"last written by PyTorch ({who})")
            raise AssertionError(f"{name} returned {what} on {case}, not a buffer your {kernel} "
                                 f"wrote: return the tensor the kernel stores its results in")


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
    plain = ("contiguous", "contiguous")
    cases = [  # (rows, length, block_l, layouts of a and b)
        (1, 1, 4, plain),  # a single step
        (3, 7, 8, plain),  # odd length, one partial block
        (2, 37, 8, plain),  # five blocks, the last partial: needs the carry
        (4, 16, 16, plain),  # exactly one full block
        (2, 33, 4, plain),  # many small blocks
        (3, 21, 8, ("transposed", "transposed")),  # both non-contiguous, the same strides
        (3, 13, 4, ("transposed", "contiguous")),  # a and b in different layouts
        (2, 11, 4, ("contiguous", "strided slice")),
        (2, 9, 8, ("offset view", "transposed")),
    ]
    for r, l, block_l, layout in cases:
        a, b = _case(r, l, block_l, g, layout)
        case = f"rows={r}, l={l}, block_l={block_l}" + (
            "" if layout == plain else f" (a {layout[0]}, b {layout[1]}: strides {a.stride()} "
                                       f"and {b.stride()})")
        h, seen = _core.probe(_probes.call_watching_triton, fn, a, b, block_l=block_l,
                              case=case)
        triton_evidence("scan_kernel", seen, case, "scan_rows_kernel")
        try:
            _core.compare(h, _oracle(a, b), what="scan_kernel(a, b, block_l)", case=case, g=g,
                          dtype=torch.float32)
        except AssertionError as e:
            hint = _hint(e, block_l)
            if not hint and a.stride() != b.stride():
                hint = (f"\nhint: a and b come in different layouts here (strides {a.stride()} and "
                        f"{b.stride()}), and every same-layout case passed: does the kernel read "
                        f"both with one tensor's strides? Make both contiguous, or pass each "
                        f"its own.")
            raise AssertionError(str(e) + hint) from None
        n += 1
    _core.passed("scan_kernel", n)
