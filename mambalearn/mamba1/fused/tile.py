"""Register-tile helpers of the tuned Mamba-1 kernels (chapter 09); Triton inlines them.

A (BLOCK_D, BLOCK_L) tile holds BLOCK_D channels × BLOCK_L time steps in registers. Registers
cannot be indexed by a run-time value, so a column is read or written with a mask (`column`,
`put_column`); with a compile-time index that folds to register moves. `ld` / `st` drop their
masks when the tile is known to lie inside the tensor (EVEN: no predicates, no zero-filled
registers before every load). The teaching kernel has its own, simpler copies of the few it uses.
"""

import triton
import triton.language as tl

from mambalearn.triton.common import INTERPRETED, LOG2E, exp2_ftz, softplus
from mambalearn.triton.scan import combine_fn  # the ⊗ of chapter 03, jitted in chapter 08

A_FLOOR = tl.constexpr(-1e30)  # the least A the backward uses (``floor_A``)
_INTERPRETED = tl.constexpr(INTERPRETED)


@triton.jit
def prefetch_l1(ptr):
    """Ask for the 32-byte sector holding each pointer to be brought into L1
    (``prefetch.global.L1``, CCTL.E.PF1 on sm_90): a hint that nothing waits for and that returns
    nothing — a load issued later finds its data in L1 instead of paying an L2 or DRAM round trip.
    Every pointer must lie inside its tensor. The interpreter: nothing."""
    if not _INTERPRETED:
        tl.inline_asm_elementwise("prefetch.global.L1 [$1]; mov.u32 $0, 0;", "=r,l", [ptr],
                                  dtype=tl.int32, is_pure=False, pack=1)


def l1_sectors(values, bits=32):
    """SECTORS of `prefetch_run` for a run of ``values`` values of ``bits`` bits starting on a
    sector: the 32-byte sectors it covers, rounded up to a power of two (0 for none)."""
    return triton.next_power_of_2(-(-values * bits // 256)) if values > 0 else 0


@triton.jit
def prefetch_run(X_ptr, first, count, last, SECTORS: tl.constexpr):
    """`prefetch_l1` of the values ``first`` … ``first + count − 1`` after ``X_ptr``, one pointer
    per 32-byte sector, SECTORS of them; ``first`` and ``last`` (the run's last valid offset in
    its tensor: offsets past it are clamped to it) a scalar or an (R, 1) column of runs."""
    STEP: tl.constexpr = 256 // X_ptr.dtype.element_ty.primitive_bitwidth  # values a sector
    at = first + tl.arange(0, SECTORS) * STEP
    at = tl.minimum(tl.minimum(at, first + count - 1), last)
    prefetch_l1(X_ptr + at)


@triton.jit
def softplus_fast(x):
    """log(1 + eˣ) from the exp unit's 2ˣ and log₂ (``ex2``/``lg2.approx.ftz``): about 12
    instructions where `common.softplus`'s precise log takes about 30. Relative error ≤ ~1e-5:
    lg2.approx's ≤ 2⁻²² absolute error near 1, over log(1 + e) ≥ 1/64 (e = e^−|x|); below that
    log(1 + e) = e − e²/2 + e³/3 (error e⁴/4). x > 20: x, as `common.softplus`. The interpreter
    runs the same formula with tl.log2."""
    e = exp2_ftz(-tl.abs(x) * LOG2E)  # (0, 1]
    if _INTERPRETED:
        lg = tl.log2(1.0 + e)
    else:
        lg = tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [1.0 + e],
                                       dtype=tl.float32, is_pure=True, pack=1)
    log1p = tl.where(e < 0.015625, e * (1.0 + e * (e * 0.3333333333333333 - 0.5)),
                     lg * 0.6931471805599453)
    return tl.where(x <= 20.0, tl.maximum(x, 0.0) + log1p, x)


@triton.jit
def floor_A(A):
    """A floored at −1e30: one select per (channel, state), not per step. At A = −∞ the backward
    would form Δ A = 0 · (−∞) = NaN where Δ = 0 (past l: no step; the reverse scan carries that
    NaN to every earlier step) and A Ā_t h_{t−1} = −∞ · 0 = NaN in dΔ; floored, Δ A is 0 there
    (decay 1, no step) and −1e30 · Δ otherwise (decay 0, as exp(−∞) was), and the product 0. No
    finite answer changes: exp(Δ A) is 0 in float32 for A ≤ −1e30 and any Δ above 1e-28.
    The backward forms Ā_t h_{t−1} as h_t − B̄_t x_t, which is 0 where Ā_t is — in exact
    arithmetic. On a GPU the compiler contracts ``h - dtx * B`` into one fused multiply-add, which
    subtracts the unrounded product from the rounded h: a residue of one rounding (≈ 1e-8 of B̄x),
    times A = −1e30, put 1e21 into dΔ. So the backward kernels take that term as 0 wherever Ā_t
    is 0 (a select; the interpreter, without fused multiply-adds, never showed it)."""
    return tl.where(A < A_FLOOR, A_FLOOR, A)


@triton.jit
def ld(ptr, mask, EVEN: tl.constexpr):
    """tl.load, unmasked when the tile lies inside the tensor."""
    if EVEN:
        return tl.load(ptr)
    else:
        return tl.load(ptr, mask=mask, other=0.0)


@triton.jit
def st(ptr, value, mask, EVEN: tl.constexpr):
    """tl.store, unmasked when the tile lies inside the tensor."""
    if EVEN:
        tl.store(ptr, value)
    else:
        tl.store(ptr, value, mask=mask)


@triton.jit
def column(X, cols, j):
    """X[:, j] of a register tile, as a vector (a masked sum; a register move for a constant j)."""
    return tl.sum(tl.where(cols[None, :] == j, X, 0.0), axis=1)


@triton.jit
def put_column(X, cols, j, v):
    """X with column j replaced by the vector v."""
    return tl.where(cols[None, :] == j, v[:, None], X)


@triton.jit
def load_bc(X_ptr, Xv_ptr, n, t, l, d_idx, d_mask, stride_Xn, N: tl.constexpr,
            VAR: tl.constexpr, EVEN_L: tl.constexpr, EVEN_D: tl.constexpr):
    """Row n of B or C: (1, BLOCK_L) if it varies with time (b, g, n, l) — ``Xv_ptr`` points at
    this program's (b, g) slice — else (BLOCK_D, 1) from the fixed, contiguous (d, n) ``X_ptr``."""
    if VAR:
        return ld(Xv_ptr + n * stride_Xn + t, t < l, EVEN_L).to(tl.float32)[None, :]
    else:
        return ld(X_ptr + d_idx * N + n, d_mask, EVEN_D).to(tl.float32)[:, None]


@triton.jit
def load_step(Xv3, t, stride_Xl, l, zero3, n3, N: tl.constexpr, NP: tl.constexpr,
              EVEN_L: tl.constexpr):
    """Row t of a transposed B or C (b, g, l, n) for every state, in a recurrent kernel's state
    tile shape (BLOCK_D, NP / V, V), the same in every channel row (``zero3`` gives it that
    shape). (The step's mask is a tensor: a scalar and-ed in is not a bool mask.)"""
    if EVEN_L and N == NP:
        return tl.load(Xv3 + t * stride_Xl)
    else:
        return tl.load(Xv3 + t * stride_Xl, mask=(zero3 + t < l) & (n3 < N), other=0.0)


@triton.jit
def load_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS: tl.constexpr,
               SOFTPLUS: tl.constexpr, EVEN: tl.constexpr):
    """Δ = softplus(delta + bias) for a tile, and delta + bias (the backward needs it). Masked
    (not EVEN): Δ = 0 outside the tensor, so Ā = exp(0) = 1 and B̄x = 0 there: the state holds."""
    if EVEN:
        dt = tl.load(delta_ptr + offs).to(tl.float32)
        if HAS_BIAS:
            dt += tl.load(bias_ptr + d_idx)[:, None]
    else:
        dt = tl.load(delta_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            dt += tl.load(bias_ptr + d_idx, mask=d_mask, other=0.0)[:, None]
    raw = dt
    if SOFTPLUS:
        dt = softplus(dt)
    if not EVEN:
        dt = tl.where(mask, dt, 0.0)
    return dt, raw


@triton.jit
def seq_start(seq_ptr, t, l, HAS_SEQ: tl.constexpr):
    """True at the steps where a new packed sequence begins (seq_idx changes)."""
    if HAS_SEQ:
        cur = tl.load(seq_ptr + t, mask=t < l, other=0)
        prev = tl.load(seq_ptr + t - 1, mask=(t >= 1) & (t < l), other=0)
        return (cur != prev) & (t >= 1)
    else:
        return t < 0  # no packing: never


@triton.jit
def reverse_scan(a, b):
    """g_t = a_t g_{t+1} + b_t along axis 1 (g past the end = 0), as flip → scan → flip.

    Same result as ``tl.associative_scan(..., reverse=True)``, whose Triton 3.6 lowering adds
    ~100 warp shuffles per scan even when the whole axis sits in one thread's registers
    (measured on the compiled sm_90 code); the flips are register renames there.
    """
    _, g = tl.associative_scan((tl.flip(a, 1), tl.flip(b, 1)), 1, combine_fn)
    return tl.flip(g, 1)


@triton.jit
def fold_summaries(E_ptr, P_ptr, at, mask, count, bdn):
    """The state entering a segment, folded from the summaries before it (chapter 14's ring pass
    inside one GPU): H ← P_j H + E_j for j = 0 … count − 1, from H = 0. ``at``: the offsets of the
    tile's (b, d, n) in one (b, d, n) slot of the (M, b, d, n) summaries (``bdn`` values)."""
    H = tl.zeros(at.shape, dtype=tl.float32)
    j = 0
    while j < count:  # (count is small: pieces before this segment)
        P = tl.load(P_ptr + j * bdn + at, mask=mask, other=0.0)
        H = P * H + tl.load(E_ptr + j * bdn + at, mask=mask, other=0.0)
        j += 1
    return H


@triton.jit
def fold_adjoints(G_ptr, P_ptr, at, mask, first, count, bdn):
    """The adjoint entering a segment from the right, folded from the summaries after it:
    g ← G_j + P_j g for j = count − 1 down to ``first``, from g = 0 (``at``, ``bdn``: as
    `fold_summaries`)."""
    g = tl.zeros(at.shape, dtype=tl.float32)
    j = count - 1
    while j >= first:
        g = tl.load(G_ptr + j * bdn + at, mask=mask, other=0.0) + \
            tl.load(P_ptr + j * bdn + at, mask=mask, other=0.0) * g
        j -= 1
    return g
