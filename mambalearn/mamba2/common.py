"""What every SSD kernel module shares (chapters 10–11), and nothing else: whether Triton runs in
its CPU interpreter, tile-size rounding, and the small ``@triton.jit`` helpers that read tiles of
contiguous (…, steps, features) tensors, split program ids and form Δ. It imports no other module
of this package, so the forward, fused and backward modules can all import it without a circle.
"""

import triton
import triton.language as tl

from mambalearn import device
from mambalearn.triton.common import softplus

INTERP = device.interpreted()  # Triton's CPU interpreter: small tiles, one pipeline stage

# The fused kernels (chapter 11) multiply over a chunk's steps on the tensor cores: the steps are
# the K of a tl.dot, which an sm_90 build takes only from 16 up. Shorter chunks run chapter 10's
# kernels, which tile the steps in blocks of 16 and mask the rest.
FUSED_MIN_CHUNK = 16


def check_dot_k(k, name):
    """Refuse a configured tile of fewer than 16 along a ``tl.dot``'s K, by the config's name."""
    if k < FUSED_MIN_CHUNK:
        raise ValueError(f"{name} = {k}: it is the K of a tl.dot, which a GPU's tensor cores take "
                         f"from {FUSED_MIN_CHUNK} up (Triton's interpreter would run it; an sm_90 "
                         f"build refuses it)")
    return k


def check_fused_chunk(q, what):
    """Refuse a chunk of fewer than ``FUSED_MIN_CHUNK`` steps for a fused kernel, by name."""
    if q < FUSED_MIN_CHUNK:
        raise ValueError(f"{what} tiles a chunk's steps as the K of tl.dot: chunk_size must be "
                         f"≥ {FUSED_MIN_CHUNK} on a GPU's tensor cores, got {q}; chapter 10's "
                         f"kernels (mambalearn.mamba2.chunk) take any chunk")


def p2(v, lo=16):
    """``v`` rounded up to a power of two, at least ``lo`` (tiles must be powers of two; the
    tensor cores want at least 16)."""
    return max(lo, triton.next_power_of_2(int(v)))


def tile(block, size, lo=16):
    """A config's tile along a dimension of ``size``: ``block`` (None: the whole dimension),
    never wider than the dimension rounded up (``p2``)."""
    return p2(size, lo) if block is None else min(int(block), p2(size, lo))


def stages(n):
    """Pipeline stages of a launch: the config's (the interpreter ignores them, and the sm_90
    build check of what it launched reads them: ``mambalearn.compiled.check_launches``)."""
    return int(n)


def launch_options(maxnreg):
    """Compile options of a launch beyond warps and stages: a register cap ``maxnreg`` if the
    config sets one (the interpreter, which has no registers, ignores it)."""
    return {} if not maxnreg else dict(maxnreg=int(maxnreg))


LOG_DECAY_FLOOR = tl.constexpr(-128.0)  # the least Δ A a step keeps (``log_decay``)


@triton.jit
def log_decay(dt, A, ok):
    """Δ_t A floored at −128, and 0 where not ``ok`` (padding past l).

    A = −∞ (forget at once) would make a_t = Σ_{s≤t} Δ_s A = −∞ at every step and every decay
    exp(a_t − a_s) a NaN, −∞ − (−∞); Δ = 0 on the padding would make 0 · (−∞) a NaN too.
    Floored, a stays finite and the decays are the recurrence's: exp(0) = 1 from a step to
    itself, and across a floored step exp(≤ −128) = 0 in float32, as exp(Δ A) was. So no output
    changes for a finite input either (a Δ A below −104 already decays by 0 in float32), and the
    cumulative sums stay small enough that a_t − a_s keeps its precision. A NaN stays NaN (the
    comparison is false). The backward gives a floored step no gradient in Δ or A (the floor is
    flat there; the true derivative A exp(Δ A) · … is 0 in float32 too)."""
    a = dt * A
    return tl.where(ok, tl.where(a < LOG_DECAY_FLOOR, LOG_DECAY_FLOOR, a), 0.0)


@triton.jit
def delta_of(dt, bias, dt_min, dt_max,
           HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_LIMIT: tl.constexpr):
    """Δ = clamp(softplus(dt + dt_bias), dt_min, dt_max), in float32; each step optional."""
    dt = dt.to(tl.float32)
    if HAS_BIAS:
        dt += bias
    if SOFTPLUS:
        dt = softplus(dt)  # log(1 + e^x); x itself above 20 (mamba_ssm's threshold)
    if HAS_LIMIT:
        dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)
    return dt


@triton.jit
def load_tile(ptr, rows, rows_ok, row_stride, cols, ncols):
    """ptr[rows · row_stride + cols] as a (rows, cols) tile, 0 where masked."""
    return tl.load(ptr + rows[:, None] * row_stride + cols[None, :],
                   mask=rows_ok[:, None] & (cols[None, :] < ncols), other=0.0)


@triton.jit
def load_tile_t(ptr, rows, rows_ok, row_stride, cols, ncols):
    """The same tile transposed: (cols, rows)."""
    return tl.load(ptr + rows[None, :] * row_stride + cols[:, None],
                   mask=rows_ok[None, :] & (cols[:, None] < ncols), other=0.0)


@triton.jit
def load_row(ptr, offs, Q: tl.constexpr):
    """Steps ``offs`` of one chunk's (q,) row of Δ or dA_cs (float32); 0 past the chunk."""
    return tl.load(ptr + offs, mask=offs < Q, other=0.0)


@triton.jit
def bch_of(pid, h, nchunks):
    """(b, c, head) of a program over b·c·h, head fastest: the layout of S, H and dS. b is
    64-bit, so offsets built from it reach past 2³¹ elements."""
    return (pid // (h * nchunks)).to(tl.int64), (pid // h) % nchunks, pid % h


@triton.jit
def bcgs_of(pid, g, nchunks, nsplit):
    """(b, c, group, split) of a program over b·c·g·nsplit, split fastest."""
    bcg = pid // nsplit
    return (bcg // (g * nchunks)).to(tl.int64), (bcg // g) % nchunks, bcg % g, pid % nsplit
