"""Register-tile helpers shared by the chapter 09 kernels (teaching and tuned); Triton inlines them.

A (BLOCK_D, BLOCK_L) tile holds BLOCK_D channels × BLOCK_L time steps in registers. Registers
cannot be indexed by a run-time value, so a column is read or written with a mask (`column`,
`put_column`); with a compile-time index that folds to register moves.
"""

import triton
import triton.language as tl


@triton.jit
def column(X, cols, j):
    """X[:, j] of a register tile, as a vector. A register cannot be indexed by a run-time j, so
    we select with a mask and sum; with j known at compile time this folds to a register move."""
    return tl.sum(tl.where(cols[None, :] == j, X, 0.0), axis=1)


@triton.jit
def put_column(X, cols, j, v):
    """X with column j replaced by the vector v."""
    return tl.where(cols[None, :] == j, v[:, None], X)


@triton.jit
def softplus(x):
    # log(1 + e^x), stable for large |x|; mamba_ssm returns x itself above 20
    return tl.where(x <= 20.0, tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))), x)


@triton.jit
def load_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask,
               HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """Δ = softplus(delta + bias) for a tile, and delta + bias (the backward needs it)."""
    dt = tl.load(delta_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        dt += tl.load(bias_ptr + d_idx, mask=d_mask, other=0.0)[:, None]
    raw = dt
    if SOFTPLUS:
        dt = softplus(dt)
    # Δ = 0 outside the sequence: Ā = exp(0) = 1 and B̄x = 0, so the state passes unchanged
    return tl.where(mask, dt, 0.0), raw


@triton.jit
def seq_start(seq_ptr, t, l, HAS_SEQ: tl.constexpr):
    """True at the steps where a new packed sequence begins (seq_idx changes)."""
    if HAS_SEQ:
        cur = tl.load(seq_ptr + t, mask=t < l, other=0)
        prev = tl.load(seq_ptr + t - 1, mask=(t >= 1) & (t < l), other=0)
        return (cur != prev) & (t >= 1)
    else:
        return t < 0  # no packing: never
