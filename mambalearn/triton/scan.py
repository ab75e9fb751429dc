"""Triton scans of h_t = a_t·h_{t−1} + b_t along the last dimension (chapter 08).

Three kernels, in the order the chapter builds them:

    scan_single_block  one program per row, the whole row in one block, one `tl.associative_scan`
    scan               one program per row, blocks of BLOCK_L steps scanned with
                       `tl.associative_scan`, the state carried from block to block in a loop;
                       ``reverse=True`` scans backwards, h_t = a_t·h_{t+1} + b_t
    scan_racy          WRONG ON PURPOSE: one program per time step, each reading h_{t−1} that
                       another program of the same launch writes. Nothing orders the programs of
                       a launch on a GPU, so it reads stale values there; Triton's CPU interpreter
                       runs programs one after another in grid order, which hides the race.

Every scan combines steps with the one ⊗ of `mambalearn.ops` (left = earlier step):

    (a_l, b_l) ⊗ (a_r, b_r) = (a_r·a_l, a_r·b_l + b_r)

``combine_fn = triton.jit(ops.combine_elementwise)`` — the same Python function, compiled.

The CPU interpreter runs `tl.associative_scan` as a left fold, element by element, so a combine
that is not associative (or drops a_l) still gives the right h there; a GPU combines in a tree.
`mambalearn.check.tree_order(combine_fn)` is the test that does not depend on the scan order.

The scan runs in float32 whatever the input dtype (fp16/bf16 are loaded and upcast), and h is
written in the input dtype. No autograd: these are forward kernels (chapter 09 adds backward).
"""

import torch
import triton
import triton.language as tl

from mambalearn import device, ops
from mambalearn.triton.common import GRID_Y
from mambalearn.utils import check_same_device, check_tensor

combine_fn = triton.jit(ops.combine_elementwise)  # ⊗, written once in ops, compiled here

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_SINGLE_BLOCK = 1 << 14  # longest row scan_single_block accepts (registers, not correctness)
DEFAULT_BLOCK_L = 1024  # steps per block of `scan` on a GPU: a first choice, not yet swept


# ---------------------------------------------------------------------------------------------
# 1. The first kernel: one program per row, the whole row in one block.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _scan_single_block_kernel(
    a_ptr, b_ptr, h_ptr,  # pointers to element [0, 0] of the (r, l) views of a, b and h
    l,  # steps per row (runtime value: one compiled kernel serves every l ≤ BLOCK_L)
    stride_ar, stride_al,  # strides of a in elements: next row, next step
    stride_br, stride_bl,  # same for b
    stride_hr, stride_hl,  # same for h
    BLOCK_L: tl.constexpr,  # a power of two ≥ l: tl.arange needs a compile-time power of two
    REVERSE: tl.constexpr,  # scan from the last step to the first
):
    row = tl.program_id(0).to(tl.int64)  # this program's row; int64 so row·stride cannot overflow
    t = tl.arange(0, BLOCK_L)  # (BLOCK_L,) the step indices this program handles
    mask = t < l  # the tail beyond l is padding
    # padding is the identity step (1, 0): it leaves every prefix unchanged, in either direction
    a = tl.load(a_ptr + row * stride_ar + t * stride_al, mask=mask, other=1.0).to(tl.float32)
    b = tl.load(b_ptr + row * stride_br + t * stride_bl, mask=mask, other=0.0).to(tl.float32)
    # all prefixes (A_t, U_t) = s_0 ⊗ … ⊗ s_t; with h_{−1} = 0 the state is h_t = U_t
    _, h = tl.associative_scan((a, b), axis=0, combine_fn=combine_fn, reverse=REVERSE)
    tl.store(h_ptr + row * stride_hr + t * stride_hl, h.to(h_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------
# 2. The blocked scan: blocks of BLOCK_L steps, the state carried between blocks.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _scan_blocked_kernel(
    a_ptr, b_ptr, h_ptr,  # pointers to element [0, 0] of the (r, l) views of a, b and h
    l,  # steps per row, any size
    stride_ar, stride_al,  # strides of a in elements: next row, next step
    stride_br, stride_bl,  # same for b
    stride_hr, stride_hl,  # same for h
    BLOCK_L: tl.constexpr,  # steps per block (a power of two)
    REVERSE: tl.constexpr,  # blocks from last to first, each scanned backwards
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_L)  # (BLOCK_L,) position inside a block
    # the step that ends a block in scan order; padding is (1, 0), so even in the partial last
    # block this position holds the state after the last real step
    LAST: tl.constexpr = 0 if REVERSE else BLOCK_L - 1
    h_carry = 0.0  # the state entering the block: h_{−1} = 0 (h_l = 0 when reversed)
    last_start = ((l - 1) // BLOCK_L) * BLOCK_L  # first step of the last block
    # Sequential over blocks: each needs the previous block's state. (A `while` rather than
    # `for start in range(0, l, BLOCK_L)`: Triton 3.6's interpreter cannot take a runtime `range`
    # bound with NumPy ≥ 2.4, triton-lang/triton#9171; the compiled loop is the same.)
    start = 0
    while start < l:
        t = (last_start - start if REVERSE else start) + offs  # (BLOCK_L,) global step indices
        mask = t < l
        a = tl.load(a_ptr + row * stride_ar + t * stride_al, mask=mask, other=1.0).to(tl.float32)
        b = tl.load(b_ptr + row * stride_br + t * stride_bl, mask=mask, other=0.0).to(tl.float32)
        # in-block prefixes from a zero state: (A, U) = s_first ⊗ … ⊗ s_t, in parallel
        A, U = tl.associative_scan((a, b), axis=0, combine_fn=combine_fn, reverse=REVERSE)
        # apply the composed step to the carried state: h_t = A·h_carry + U
        h = A * h_carry + U
        tl.store(h_ptr + row * stride_hr + t * stride_hl, h.to(h_ptr.dtype.element_ty), mask=mask)
        # the carry for the next block: h at LAST, pulled out of the block (a masked sum)
        h_carry = tl.sum(tl.where(offs == LAST, h, 0.0), axis=0)
        start += BLOCK_L


# ---------------------------------------------------------------------------------------------
# 3. The counterexample: one program per time step. A race on a GPU.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _scan_racy_kernel(
    a_ptr, b_ptr, h_ptr,  # pointers to element [0, 0] of the (r, l) views of a, b and h
    stride_ar, stride_al, stride_br, stride_bl, stride_hr, stride_hl,
):
    t = tl.program_id(0).to(tl.int64)  # this program's time step (axis 0: up to 2³¹−1 programs)
    row = tl.program_id(1).to(tl.int64)  # this program's row
    a = tl.load(a_ptr + row * stride_ar + t * stride_al).to(tl.float32)
    b = tl.load(b_ptr + row * stride_br + t * stride_bl).to(tl.float32)
    # BUG, on purpose: h_{t−1} is written by program t−1 of this same launch. A GPU runs the
    # programs of a launch in any order and at the same time; nothing makes this load wait for
    # that store, so it usually reads the zero h was filled with (or a stale value).
    h_prev = tl.load(h_ptr + row * stride_hr + (t - 1) * stride_hl, mask=t > 0, other=0.0)
    h = a * h_prev.to(tl.float32) + b
    tl.store(h_ptr + row * stride_hr + t * stride_hl, h.to(h_ptr.dtype.element_ty))


# ---------------------------------------------------------------------------------------------
# Launchers: check the arguments, flatten the leading dims into rows, build the grid.
# ---------------------------------------------------------------------------------------------
def _rows(a, b, what):
    """Check (a, b) and return their (r, l) views, an empty (r, l) output and the input shape."""
    check_tensor("a", a, dtypes=DTYPES)
    check_tensor("b", b, dtypes=DTYPES)
    if a.ndim == 0:
        raise ValueError(f"{what}: a and b need a time dimension (..., l); got scalars")
    if a.shape != b.shape:
        raise ValueError(f"{what}: a and b must have the same shape (..., l); "
                         f"got a {tuple(a.shape)} and b {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"{what}: a and b must have the same dtype; got {a.dtype} and {b.dtype}")
    check_same_device(a=a, b=b)
    if not device.interpreted() and a.device.type != "cuda":
        raise ValueError(f"{what}: a and b are on {a.device}, but Triton compiles for the GPU "
                         "here; move them with .cuda() (or run with TRITON_INTERPRET=1)")
    l = a.shape[-1]
    if l == 0:
        raise ValueError(f"{what}: the time dimension (last) of a and b must not be empty")
    # reshape gives a view when it can; the kernels take strides, so non-contiguous views
    # (a transposed last dim, a slice) are read in place
    a2, b2 = a.reshape(-1, l), b.reshape(-1, l)  # (r, l)
    h = torch.empty(a2.shape, dtype=a.dtype, device=a.device)  # (r, l)
    return a2, b2, h, a.shape


def _strides(a2, b2, h):
    return (*a2.stride(), *b2.stride(), *h.stride())


def scan_single_block(a, b, reverse=False):
    """h_t = a_t·h_{t−1} + b_t (h_{−1} = 0) with one program per row and one block per row.

    ``reverse=True``: h_t = a_t·h_{t+1} + b_t (h_l = 0). The first kernel of the chapter: each
    program loads its whole row (padded to a power of two) and calls ``tl.associative_scan``
    once, so l is limited to ``MAX_SINGLE_BLOCK``; use :func:`scan` for longer rows.

    Shapes:
        a, b: (..., l)   same shape and dtype (fp32, fp16, bf16); leading dims are rows
        h:    (..., l)   dtype of a
    """
    a2, b2, h, shape = _rows(a, b, "scan_single_block")
    l = a2.shape[1]
    if l > MAX_SINGLE_BLOCK:
        raise ValueError(f"scan_single_block: l = {l} > {MAX_SINGLE_BLOCK} steps do not fit one "
                         "block; use mambalearn.triton.scan.scan (blocked, with carries)")
    if a2.shape[0] == 0:
        return h.view(shape)
    BLOCK_L = triton.next_power_of_2(l)
    num_warps = 4 if BLOCK_L <= 1024 else 8 if BLOCK_L <= 4096 else 16
    _scan_single_block_kernel[(a2.shape[0],)](
        a2, b2, h, l, *_strides(a2, b2, h),
        BLOCK_L=BLOCK_L, REVERSE=bool(reverse), num_warps=num_warps)
    return h.view(shape)


def scan(a, b, reverse=False, block_l=None):
    """h_t = a_t·h_{t−1} + b_t (h_{−1} = 0) along the last dim: a blocked scan with carries.

    ``reverse=True``: h_t = a_t·h_{t+1} + b_t (h_l = 0), the scan of a backward pass.
    One program per row walks its row in blocks of ``block_l`` steps; inside a block
    ``tl.associative_scan`` with ⊗ gives the prefixes (A_t, U_t), and the state carried in from
    the previous block c enters as h_t = A_t·c + U_t. ``block_l`` (a power of two) defaults to
    ``DEFAULT_BLOCK_L`` on a GPU (smaller for short rows) and 16 under the interpreter.

    Shapes:
        a, b: (..., l)   same shape and dtype (fp32, fp16, bf16); leading dims are rows;
                         any strides
        h:    (..., l)   dtype of a; computed in fp32

    Reference: the chunked scan of chapter 06 (`mambalearn.scan.chunked`), with one chunk = one
    block and the carry passed inside one program.
    """
    a2, b2, h, shape = _rows(a, b, "scan")
    l = a2.shape[1]
    if block_l is None:
        block_l = 16 if device.interpreted() else min(DEFAULT_BLOCK_L, triton.next_power_of_2(l))
    if not isinstance(block_l, int) or block_l < 1 or block_l & (block_l - 1):
        raise ValueError(f"scan: block_l must be a power of two ≥ 1, got {block_l!r}")
    if a2.shape[0] == 0:
        return h.view(shape)
    num_warps = 4 if block_l <= 1024 else 8
    _scan_blocked_kernel[(a2.shape[0],)](
        a2, b2, h, l, *_strides(a2, b2, h),
        BLOCK_L=block_l, REVERSE=bool(reverse), num_warps=num_warps)
    return h.view(shape)


def scan_racy(a, b):
    """WRONG ON PURPOSE. h_t = a_t·h_{t−1} + b_t with one program per (time step, row).

    Program t reads h_{t−1} from memory that program t−1 of the same launch writes. Triton (like
    CUDA) gives no order between the programs of one launch, so on a GPU program t usually reads
    h_{t−1} before it is written and the result is wrong (tests/test_triton_scan.py). The
    CPU interpreter runs the programs one after another in grid order, so there it "works" —
    which is exactly why passing under the interpreter proves nothing about a GPU.

    Shapes:
        a, b: (..., l)   same shape and dtype; at most 65535 rows (the grid's second axis)
        h:    (..., l)
    """
    a2, b2, h, shape = _rows(a, b, "scan_racy")
    r, l = a2.shape
    if r > GRID_Y:
        raise ValueError(f"scan_racy: at most {GRID_Y} rows (grid axis 1), got {r}")
    h.zero_()  # what a program sees when it reads h_{t−1} before it is written
    if r:
        _scan_racy_kernel[(l, r)](a2, b2, h, *_strides(a2, b2, h))
    return h.view(shape)


def scan_reference(a, b, reverse=False):
    """The oracle: a plain loop over t in float64. h_t = a_t·h_{t−1} + b_t (or h_{t+1}).

    Shapes:
        a, b: (..., l)
        h:    (..., l) float64
    """
    a64, b64 = a.to(torch.float64), b.to(torch.float64)  # (..., l)
    h = torch.empty_like(b64)  # (..., l)
    state = torch.zeros_like(b64[..., 0])  # (...)
    l = a.shape[-1]
    for t in (reversed(range(l)) if reverse else range(l)):
        state = a64[..., t] * state + b64[..., t]
        h[..., t] = state
    return h
