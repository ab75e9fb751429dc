"""Shared pieces of the SSD backward's kernels (chapter 10): the launch settings of each kernel
and the ``@triton.jit`` helpers that read tiles of (…, steps, features) tensors and split program
ids. The derivation of the steps is the docstring of ``mambalearn.triton.ssd.backward``.
"""

import triton
import triton.language as tl

from mambalearn import device
from mambalearn.triton.ssd.forward import _p2

_INTERP = device.interpreted()


def _cfg(name, n=None):
    """(BLOCK_N, launch options) of one kernel; the interpreter takes the whole n and one stage.
    Reads ``ssd_backward.CONFIGS`` at each call: the benchmark's sweep changes it at run time."""
    from mambalearn.triton.ssd import backward as ssd_backward  # here, not on top: that module imports this one

    c = dict(ssd_backward.CONFIGS[name])
    bn = c.pop("BLOCK_N", None)
    if _INTERP:  # (maxnreg, a compile option, is not for the interpreter either)
        return (_p2(n) if n else None), dict(num_warps=4, num_stages=1)
    return (min(bn, _p2(n)) if n and bn else bn), c


def _blocks(q):
    """The tile of the q×q blocks (steps t and s); steps 4–7 share it, so they agree on which
    blocks of dCB exist (those on or below the diagonal)."""
    return 16 if _INTERP else min(64, _p2(q))


# ---------------------------------------------------------------------------------------------
# helpers: tiles of contiguous (…, steps, features) tensors, program ids
@triton.jit
def _tile(ptr, rows, rows_ok, row_stride, cols, ncols):
    """ptr[rows · row_stride + cols] as a (rows, cols) tile, 0 where masked."""
    return tl.load(ptr + rows[:, None] * row_stride + cols[None, :],
                   mask=rows_ok[:, None] & (cols[None, :] < ncols), other=0.0)


@triton.jit
def _tile_T(ptr, rows, rows_ok, row_stride, cols, ncols):
    """The same tile transposed: (cols, rows)."""
    return tl.load(ptr + rows[None, :] * row_stride + cols[:, None],
                   mask=rows_ok[None, :] & (cols[:, None] < ncols), other=0.0)


@triton.jit
def _row(ptr, offs, Q: tl.constexpr):
    """Steps ``offs`` of one chunk's (q,) row of Δ or dA_cs (float32); 0 past the chunk."""
    return tl.load(ptr + offs, mask=offs < Q, other=0.0)


@triton.jit
def _bch(pid, h, nchunks):
    """(b, c, head) of a program over b·c·h, head fastest: the layout of S, H and dS."""
    return pid // (h * nchunks), (pid // h) % nchunks, pid % h


@triton.jit
def _bcgs(pid, g, nchunks, nsplit):
    """(b, c, group, split) of a program over b·c·g·nsplit, split fastest."""
    bcg = pid // nsplit
    return bcg // (g * nchunks), (bcg // g) % nchunks, bcg % g, pid % nsplit
