"""The fused Mamba-1 selective scan in Triton, forward and backward (chapter 09): the tuned kernels.

    Δ_t = softplus(delta_t + delta_bias)      Ā_t = exp(Δ_t A)      B̄_t x_t = Δ_t B_t x_t
    h_t = Ā_t h_{t−1} + Δ_t B_t x_t           y_t = C_t h_t + D x_t  out_t = y_t · silu(z_t)

`selective_scan_fn` takes the arguments, layouts and dtypes of ``mamba_ssm.selective_scan_fn``
and adds variable-length sequences packed in one row (``seq_idx`` or ``cu_seqlens``), which
mamba_ssm's Mamba-1 kernel lacks: where the sequence index changes, the state restarts (Ā_t = 0).

How the forward kernel is laid out (the layout of the scan decides the speed, DESIGN.md §6):
one program owns a tile of BLOCK_D channels of one batch row (and one group of B/C). It walks
time in blocks of BLOCK_L steps; inside a block it loops over the n states (unrolled: the carry of
each state lives in registers, which cannot be indexed at run time) and scans a 2-D
(channels, time) tile with `tl.associative_scan` along time, combining with the one ⊗ of
`mambalearn.ops`. The state entering a block is folded into the block's first step
(b_0 ← Ā_0 h + b_0), so the scan result *is* h. y = Σ_n C_n h_n accumulates in registers; only u,
Δ, B, C, z are read and only y is written, once. Every CHUNK steps the state (b, d, n) goes to
memory for the backward: nothing of size (b, d, l, n) is ever stored.

The backward kernel walks the chunks backwards. Per chunk and state it recomputes h from the
stored chunk state (forward scan), runs the reverse scan of the adjoint
g_t = C_t dy_t + Ā_{t+1} g_{t+1} (the gate shifted by one: Ā_{t+1} is recomputed from Δ_{t+1}),
and forms every gradient from g and h, using Ā_t h_{t−1} = h_t − B̄_t x_t so no shifted h is needed:

    dB_t = Σ_d g Δ x   dC_t = Σ_d dy h   dx = Σ_n g Δ B + D dy   dA = Σ_t g (h − B̄x) Δ
    dΔ   = Σ_n g ((h − B̄x) A + B x)      dz = dout · y · silu′(z)   dD = Σ dy x

dB/dC are summed over the channel tile before the atomic add (one add per program, not per
channel). `selective_scan_teaching` (module ``selective_scan_teaching``) is the readable version
the chapter walks through; this module is the tuned one (autotuned tiles, exp2).
"""

import torch
import triton
import triton.language as tl

from mambalearn import device
from mambalearn.scan.sequential import check_inputs
from mambalearn.triton.scan import combine_fn  # the ⊗ of chapter 03, jitted in chapter 08
from mambalearn.triton.tile import column as _column
from mambalearn.triton.tile import load_delta as _load_delta
from mambalearn.triton.tile import put_column as _put_column
from mambalearn.triton.tile import seq_start as _is_start
from mambalearn.triton.tile import softplus as _softplus
from mambalearn.utils import check_same_device

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_DSTATE = 256  # mamba_ssm's limit too; the n loop is unrolled, so compile time grows with n
UNROLL_MAX = 16  # forward: unroll the loop over states up to this n (compile time grows with n)
BWD_UNROLL_MAX = 0  # backward: unrolled, n = 16 took minutes to compile and spilled (sm_90)
MIN_BLOCK_L = 8  # smallest time tile of any configuration (sizes the backward's scratch)
LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = 2^(x·log2 e)


def chunk_size(n):
    """Steps between the states the forward stores for the backward (the backward's time tile).

    Memory of the stored states: b·d·n·⌈l/q⌉·4 bytes; q = 64 at n ≤ 16 keeps fwd+bwd at the
    CUDA kernel's peak (it stores nothing of size l but keeps out), larger n takes longer chunks.
    """
    return 64 if n <= 16 else 128


# ---------------------------------------------------------------------------------------------
# Small helpers of the tuned kernels (inlined by Triton); the ones shared with the teaching
# kernel live in mambalearn.triton.tile.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _reverse_scan(a, b):
    """g_t = a_t g_{t+1} + b_t along axis 1 (g past the end = 0), as flip → scan → flip.

    Same result as ``tl.associative_scan(..., reverse=True)``, whose Triton 3.6 lowering adds
    ~100 warp shuffles per scan even when the whole axis sits in one thread's registers
    (measured on the compiled sm_90 code); the flips are register renames there.
    """
    _, g = tl.associative_scan((tl.flip(a, 1), tl.flip(b, 1)), 1, combine_fn)
    return tl.flip(g, 1)


@triton.jit
def _ld(ptr, mask, EVEN: tl.constexpr):
    """tl.load, unmasked when the tile is known to lie inside the tensor (EVEN: no predicates,
    no zero-filled registers before every load)."""
    if EVEN:
        return tl.load(ptr)
    else:
        return tl.load(ptr, mask=mask, other=0.0)


@triton.jit
def _st(ptr, value, mask, EVEN: tl.constexpr):
    """tl.store, unmasked when the tile is known to lie inside the tensor."""
    if EVEN:
        tl.store(ptr, value)
    else:
        tl.store(ptr, value, mask=mask)


# ---------------------------------------------------------------------------------------------
# Forward.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _fwd_state(n, h_in, dt, dtx, start, t, l, d_idx, d_mask, cols, A_ptr, B_ptr, Bv_ptr, C_ptr,
               Cv_ptr, sB0, sB1, sB2, sC0, sC1, sC2, N: tl.constexpr, BLOCK_L: tl.constexpr,
               VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
               EVEN_L: tl.constexpr, EVEN_D: tl.constexpr):
    """One state n over one block: returns (C_n·h, h at the block's last step). (Backward's
    replay; the forward kernel uses `_fwd_state_fast`.)"""
    A2_n = _ld(A_ptr + d_idx * N + n, d_mask, EVEN_D) * LOG2E  # (BLOCK_D,)
    a = tl.exp2(dt * A2_n[:, None])  # Ā = exp(ΔA) = 2^(Δ·A·log2 e)
    if HAS_SEQ:
        a = tl.where(start, 0.0, a)  # a new sequence forgets the old state
    Bn = _load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, sB0, sB1, sB2, VAR_B, EVEN_L, EVEN_D)
    Cn = _load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, sC0, sC1, sC2, VAR_C, EVEN_L, EVEN_D)
    bx = dtx * Bn  # B̄x
    bx = tl.where(cols[None, :] == 0, a * h_in[:, None] + bx, bx)  # fold h_in into step 0
    _, h = tl.associative_scan((a, bx), 1, combine_fn)  # (BLOCK_D, BLOCK_L)
    return h * Cn, _column(h, cols, BLOCK_L - 1)


@triton.jit
def _load_bc(X_ptr, Xv_ptr, n, t, l, d_idx, d_mask, s0, s1, s2, VAR: tl.constexpr,
             EVEN_L: tl.constexpr, EVEN_D: tl.constexpr):
    """Row n of B or C: (1, BLOCK_L) if it varies with time (b, g, n, l), else (BLOCK_D, 1)."""
    if VAR:
        return _ld(Xv_ptr + n * s2 + t, t < l, EVEN_L).to(tl.float32)[None, :]
    else:
        return _ld(X_ptr + d_idx * s0 + n * s1, d_mask, EVEN_D).to(tl.float32)[:, None]


@triton.jit
def _fwd_state_fast(n, A2_n, h_in, dt, dtx, start, t, l, d_idx, d_mask, cols, B_ptr, Bv_ptr,
                    C_ptr, Cv_ptr, sB0, sB1, sB2, sC0, sC1, sC2, BLOCK_L: tl.constexpr,
                    VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
                    EVEN_L: tl.constexpr, EVEN_D: tl.constexpr):
    """One state n over one block, A·log2 e given (BLOCK_D,): returns (h (BLOCK_D, BLOCK_L),
    C_n (broadcastable), h at the block's last step)."""
    a = tl.exp2(dt * A2_n[:, None])  # Ā = exp(ΔA) = 2^(Δ·A·log2 e): the one exp per element
    if HAS_SEQ:
        a = tl.where(start, 0.0, a)  # a new sequence forgets the old state
    Bn = _load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, sB0, sB1, sB2, VAR_B, EVEN_L, EVEN_D)
    Cn = _load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, sC0, sC1, sC2, VAR_C, EVEN_L, EVEN_D)
    bx = dtx * Bn  # B̄x
    bx = tl.where(cols[None, :] == 0, a * h_in[:, None] + bx, bx)  # fold h_in into step 0
    _, h = tl.associative_scan((a, bx), 1, combine_fn)  # (BLOCK_D, BLOCK_L)
    return h, Cn, _column(h, cols, BLOCK_L - 1)


@triton.jit
def _fwd_block(t0, H, bias_v, D_v, u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, z_ptr, seq_ptr,
               out_ptr, states_ptr, last_ptr, Bv_ptr, Cv_ptr, l, bi, d_idx, d_mask, bd_row, row,
               st_row, cols, ncols, sB0, sB1, sB2, sC0, sC1, sC2,
               N: tl.constexpr, BLOCK_L: tl.constexpr, CHUNK: tl.constexpr,
               HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
               SOFTPLUS: tl.constexpr, VAR_B: tl.constexpr, VAR_C: tl.constexpr,
               HAS_SEQ: tl.constexpr, UNROLL: tl.constexpr, EVEN_L: tl.constexpr,
               EVEN_D: tl.constexpr):
    """The steps t0 … t0 + BLOCK_L − 1 of one channel tile, every state: returns the new carry H."""
    EVEN: tl.constexpr = EVEN_L and EVEN_D
    t = t0 + cols  # (BLOCK_L,)
    mask = d_mask[:, None] & (t < l)[None, :]  # (BLOCK_D, BLOCK_L)
    offs = row[:, None] + t[None, :]
    x = _ld(u_ptr + offs, mask, EVEN).to(tl.float32)
    dt = _ld(delta_ptr + offs, mask, EVEN).to(tl.float32)
    if HAS_BIAS:
        dt += bias_v[:, None]
    if SOFTPLUS:  # once per (d, l), shared by every state
        dt = _softplus(dt)
    if not EVEN:
        dt = tl.where(mask, dt, 0.0)  # Δ = 0 past the end: Ā = 1, B̄x = 0, the state holds
    dtx = dt * x  # (BLOCK_D, BLOCK_L) Δ·x, shared by every state
    start = _is_start(seq_ptr + bi * l, t, l, HAS_SEQ)[None, :]  # (1, BLOCK_L)
    y = tl.zeros_like(x)  # (BLOCK_D, BLOCK_L) y = Σ_n C_n h_n, in registers
    t1 = t0 + BLOCK_L
    store_state = (t1 % CHUNK == 0) & (t1 < l)
    if UNROLL:  # n ≤ UNROLL_MAX: unrolled, every state's carry in registers
        for n in tl.static_range(N):
            # (A as a register tile read once per program cost a layout conversion per state
            # in the sm_90 compile: this load is an L1 hit, or a shared-memory read if STAGES)
            A2_n = _ld(A_ptr + d_idx * N + n, d_mask, EVEN_D) * LOG2E
            h, Cn, h_out = _fwd_state_fast(n, A2_n, _column(H, ncols, n), dt, dtx, start, t, l,
                                           d_idx, d_mask, cols, B_ptr, Bv_ptr, C_ptr, Cv_ptr,
                                           sB0, sB1, sB2, sC0, sC1, sC2, BLOCK_L, VAR_B, VAR_C,
                                           HAS_SEQ, EVEN_L, EVEN_D)
            H = _put_column(H, ncols, n, h_out)
            y += h * Cn
        if store_state:  # h before the next chunk, for the backward: one tile store (a
            # store per state inside the loop cost 2 BAR.SYNC per state, layout conversions)
            tl.store(states_ptr + st_row[:, None] + (t1 // CHUNK) * N + ncols[None, :], H,
                     mask=d_mask[:, None] & (ncols[None, :] < N))
    else:  # large n: a run-time loop (compile time), the carry kept in `last` (L1/L2)
        for n in range(N):
            A2_n = _ld(A_ptr + d_idx * N + n, d_mask, EVEN_D) * LOG2E
            h_in = tl.load(last_ptr + bd_row * N + n, mask=d_mask, other=0.0)
            h, Cn, h_out = _fwd_state_fast(n, A2_n, h_in, dt, dtx, start, t, l, d_idx, d_mask,
                                           cols, B_ptr, Bv_ptr, C_ptr, Cv_ptr, sB0, sB1, sB2,
                                           sC0, sC1, sC2, BLOCK_L, VAR_B, VAR_C, HAS_SEQ,
                                           EVEN_L, EVEN_D)
            tl.store(last_ptr + bd_row * N + n, h_out, mask=d_mask)
            if store_state:
                tl.store(states_ptr + st_row + (t1 // CHUNK) * N + n, h_out, mask=d_mask)
            y += h * Cn
        tl.debug_barrier()  # the next block reads carries other threads may have written
    if HAS_D:
        y += x * D_v[:, None]
    if HAS_Z:
        zz = _ld(z_ptr + offs, mask, EVEN).to(tl.float32)
        y *= zz * tl.sigmoid(zz)
    if EVEN:
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty))
    else:
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
    return H


@triton.jit
def _fwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, seq_ptr,  # inputs
    out_ptr, states_ptr, last_ptr,  # outputs: out (b,d,l), states (b,d,c,n) fp32, last (b,d,n)
    l, d, dpg, g,  # length, channels, channels per group, groups
    sB0, sB1, sB2, sC0, sC1, sC2,  # B/C strides: (b, g, n) if variable, (d, n, -) if fixed
    N: tl.constexpr, NP: tl.constexpr,  # states, and n padded to a power of two
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, CHUNK: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr, UNROLL: tl.constexpr,
    EVEN_L: tl.constexpr = False,  # l % BLOCK_L == 0: no masks along time
    EVEN_D: tl.constexpr = False,  # channels per group % BLOCK_D == 0: no masks along channels
    STAGES: tl.constexpr = 0,  # > 0: a `for` over the time blocks whose loads Triton pipelines
):                             # (STAGES deep, cp.async); 0: a `while` (the interpreter's path)
    pid_bg, pid_d = tl.program_id(0), tl.program_id(1)
    bi, gi = pid_bg // g, pid_bg % g  # batch row, group of B/C
    d_loc = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)  # channel inside its group
    d_mask = d_loc < dpg
    d_idx = gi * dpg + d_loc  # (BLOCK_D,) channel index
    cols = tl.arange(0, BLOCK_L)  # (BLOCK_L,) step inside the block
    ncols = tl.arange(0, NP)  # (NP,) state index
    bd_row = (bi * d + d_idx).to(tl.int64)  # (BLOCK_D,) index of each (b, d) row
    row = bd_row * l  # (BLOCK_D,) start of each row of u/delta/z/out
    nchunks = tl.cdiv(l, CHUNK)
    st_row = bd_row * nchunks * N  # (BLOCK_D,) rows of states
    n_mask = d_mask[:, None] & (ncols[None, :] < N)  # (BLOCK_D, NP)
    H = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # the carried state h, one column per n
    bias_v = tl.zeros((BLOCK_D,), dtype=tl.float32)  # (BLOCK_D,) read once per program
    if HAS_BIAS:
        bias_v = _ld(bias_ptr + d_idx, d_mask, EVEN_D)
    D_v = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_D:
        D_v = _ld(D_ptr + d_idx, d_mask, EVEN_D)
    Bv_ptr = B_ptr + bi * sB0 + gi * sB1
    Cv_ptr = C_ptr + bi * sC0 + gi * sC1
    if STAGES > 0:  # compiled: Triton's pipeliner issues block i + 1's loads during block i
        for t0 in tl.range(0, l, BLOCK_L, num_stages=STAGES):
            H = _fwd_block(t0, H, bias_v, D_v, u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, z_ptr,
                           seq_ptr, out_ptr, states_ptr, last_ptr, Bv_ptr, Cv_ptr, l, bi, d_idx,
                           d_mask, bd_row, row, st_row, cols, ncols, sB0, sB1, sB2, sC0, sC1, sC2,
                           N, BLOCK_L, CHUNK, HAS_D, HAS_Z, HAS_BIAS, SOFTPLUS, VAR_B, VAR_C,
                           HAS_SEQ, UNROLL, EVEN_L, EVEN_D)
    else:
        # (`while`, not `for t0 in range(0, l, BLOCK_L)`: Triton 3.6's interpreter cannot take
        # a runtime `range` bound with NumPy ≥ 2.4, triton-lang/triton#9171; see triton/scan.py.
        # Compiled, a `while` is never software-pipelined: every block waits for its loads.)
        t0 = 0
        while t0 < l:
            t0 = tl.multiple_of(t0, BLOCK_L)  # a `while` hides that from the compiler
            H = _fwd_block(t0, H, bias_v, D_v, u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, z_ptr,
                           seq_ptr, out_ptr, states_ptr, last_ptr, Bv_ptr, Cv_ptr, l, bi, d_idx,
                           d_mask, bd_row, row, st_row, cols, ncols, sB0, sB1, sB2, sC0, sC1, sC2,
                           N, BLOCK_L, CHUNK, HAS_D, HAS_Z, HAS_BIAS, SOFTPLUS, VAR_B, VAR_C,
                           HAS_SEQ, UNROLL, EVEN_L, EVEN_D)
            t0 += BLOCK_L
    if UNROLL:
        tl.store(last_ptr + bd_row[:, None] * N + ncols[None, :], H, mask=n_mask)


# ---------------------------------------------------------------------------------------------
# Backward.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _bwd_state(n, h_in, g_in, x, dt, dtx, dt_nx, dy, start, start_nx, t, t_ok, l, d_idx, d_mask,
               cols, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, dBv_ptr, dCv_ptr,
               sB0, sB1, sB2, sC0, sC1, sC2, dB2, dC2, N: tl.constexpr, BLOCK_L: tl.constexpr,
               VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
               EVEN_L: tl.constexpr, EVEN_D: tl.constexpr):
    """One state n over one sub-block, backwards. Returns the tile terms C·h, ∂x, ∂Δ, the adjoint
    at the first step (carried to the earlier block), and the (BLOCK_D,) sums for dA, dB, dC."""
    A_n = _ld(A_ptr + d_idx * N + n, d_mask, EVEN_D)[:, None]  # (BLOCK_D, 1)
    a = tl.exp2(dt * (A_n * LOG2E))  # Ā_t
    a_nx = tl.exp2(dt_nx * (A_n * LOG2E))  # Ā_{t+1}
    if HAS_SEQ:
        a = tl.where(start, 0.0, a)
        a_nx = tl.where(start_nx, 0.0, a_nx)
    Bn = _load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, sB0, sB1, sB2, VAR_B, EVEN_L, EVEN_D)
    Cn = _load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, sC0, sC1, sC2, VAR_C, EVEN_L, EVEN_D)
    # h over the sub-block from the state replayed in step 1
    bx = dtx * Bn
    bx0 = tl.where(cols[None, :] == 0, a * h_in[:, None] + bx, bx)
    _, h = tl.associative_scan((a, bx0), 1, combine_fn)
    # the adjoint, g_t = C_t dy_t + Ā_{t+1} g_{t+1}, scanned backwards; g_in folds into the end
    beta = Cn * dy
    beta = tl.where(cols[None, :] == BLOCK_L - 1, beta + a_nx * g_in[:, None], beta)
    gg = _reverse_scan(a_nx, beta)
    # gradients from g and h; Ā_t h_{t−1} = h_t − B̄_t x_t
    ah = h - bx
    gdt = gg * dt
    dB_c = tl.sum(gdt * x, axis=1)  # (BLOCK_D,): fixed B's gradient
    dC_c = tl.sum(dy * h, axis=1)
    if VAR_B:  # summed over the channel tile, then one atomic add per step
        if EVEN_L:
            tl.atomic_add(dBv_ptr + n * dB2 + t, tl.sum(gdt * x, axis=0), sem="relaxed")
        else:
            tl.atomic_add(dBv_ptr + n * dB2 + t, tl.sum(gdt * x, axis=0), mask=t_ok,
                          sem="relaxed")
    if VAR_C:
        if EVEN_L:
            tl.atomic_add(dCv_ptr + n * dC2 + t, tl.sum(dy * h, axis=0), sem="relaxed")
        else:
            tl.atomic_add(dCv_ptr + n * dC2 + t, tl.sum(dy * h, axis=0), mask=t_ok,
                          sem="relaxed")
    return (h * Cn, gdt * Bn, gg * (ah * A_n + x * Bn), _column(gg, cols, 0),
            tl.sum(gg * ah * dt, axis=1), dB_c, dC_c)


@triton.jit
def _bwd_replay_state(n, j, nsub, c, nchunks, dt, dtx, start, t, l, bd_row, sc_row, d_idx, d_mask,
                      cols, states_ptr, scratch_ptr, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr,
                      sB0, sB1, sB2, sC0, sC1, sC2, N: tl.constexpr, BLOCK_L: tl.constexpr,
                      VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
                      EVEN_L: tl.constexpr, EVEN_D: tl.constexpr):
    """Pass 1, run-time state loop, state n of sub-block j: keep the state entering the
    sub-block in the scratch, replay it to the sub-block's end (the next slot)."""
    h_in = tl.load(scratch_ptr + sc_row + j * N + n, mask=d_mask & (j > 0), other=0.0)
    h_in += tl.load(states_ptr + (bd_row * nchunks + c) * N + n, mask=d_mask & (j == 0),
                    other=0.0)
    _st(scratch_ptr + sc_row + j * N + n, h_in, d_mask, EVEN_D)
    _, h_out = _fwd_state(n, h_in, dt, dtx, start, t, l, d_idx, d_mask, cols, A_ptr, B_ptr,
                          Bv_ptr, C_ptr, Cv_ptr, sB0, sB1, sB2, sC0, sC1, sC2, N, BLOCK_L,
                          VAR_B, VAR_C, HAS_SEQ, EVEN_L, EVEN_D)
    tl.store(scratch_ptr + sc_row + (j + 1) * N + n, h_out, mask=d_mask & (j + 1 < nsub))


@triton.jit
def _bwd_grad_state(n, j, x, dt, dtx, dt_nx, dy, start, start_nx, t, t_ok, l, bd_row, sc_row,
                    d_idx, d_mask, cols, scratch_ptr, gbuf_ptr, dA_ptr, dBf_ptr, dCf_ptr,
                    A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, dBv_ptr, dCv_ptr,
                    sB0, sB1, sB2, sC0, sC1, sC2, dB2, dC2, N: tl.constexpr,
                    BLOCK_L: tl.constexpr, VAR_B: tl.constexpr, VAR_C: tl.constexpr,
                    HAS_SEQ: tl.constexpr, EVEN_L: tl.constexpr, EVEN_D: tl.constexpr):
    """Pass 2, run-time state loop, state n of sub-block j: carries (g, row sums of dA and of
    fixed dB/dC) in memory. Returns the tile terms C·h, ∂x, ∂Δ."""
    h_in = _ld(scratch_ptr + sc_row + j * N + n, d_mask, EVEN_D)
    g_in = _ld(gbuf_ptr + bd_row * N + n, d_mask, EVEN_D)
    yc, dxc, ddtc, g_out, dA_c, dB_c, dC_c = _bwd_state(
        n, h_in, g_in, x, dt, dtx, dt_nx, dy, start, start_nx,
        t, t_ok, l, d_idx, d_mask, cols, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr,
        dBv_ptr, dCv_ptr, sB0, sB1, sB2, sC0, sC1, sC2, dB2, dC2, N, BLOCK_L,
        VAR_B, VAR_C, HAS_SEQ, EVEN_L, EVEN_D)
    _st(gbuf_ptr + bd_row * N + n, g_out, d_mask, EVEN_D)
    p = bd_row * N + n  # (BLOCK_D,) this row's partial sums
    _st(dA_ptr + p, _ld(dA_ptr + p, d_mask, EVEN_D) + dA_c, d_mask, EVEN_D)
    if not VAR_B:
        _st(dBf_ptr + p, _ld(dBf_ptr + p, d_mask, EVEN_D) + dB_c, d_mask, EVEN_D)
    if not VAR_C:
        _st(dCf_ptr + p, _ld(dCf_ptr + p, d_mask, EVEN_D) + dC_c, d_mask, EVEN_D)
    return yc, dxc, ddtc


@triton.jit
def _bwd_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS: tl.constexpr,
               SOFTPLUS: tl.constexpr, EVEN: tl.constexpr):
    """`tile.load_delta`, without masks when the tile lies inside the tensor (EVEN)."""
    if EVEN:
        dt = tl.load(delta_ptr + offs).to(tl.float32)
        if HAS_BIAS:
            dt += tl.load(bias_ptr + d_idx)[:, None]
        raw = dt
        if SOFTPLUS:
            dt = _softplus(dt)
        return dt, raw
    else:
        return _load_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS, SOFTPLUS)


@triton.jit
def _bwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, seq_ptr, dout_ptr, states_ptr,
    scratch_ptr,  # (b, d, SCR, n) fp32: the state entering each sub-block of the current chunk
    gbuf_ptr,  # (b, d, n) fp32 zeros: the adjoint carry when n is not unrolled
    du_ptr, ddelta_ptr, dz_ptr, dB_ptr, dC_ptr,  # (b,d,l) grads; fp32 zeroed dB/dC if variable
    dA_ptr, dBf_ptr, dCf_ptr, dD_ptr, dbias_ptr,  # fp32 zeroed partial sums per batch row:
    l, d, dpg, g,                                 # (b, d, n) ×3, (b, d) ×2
    sB0, sB1, sB2, sC0, sC1, sC2,  # strides of B/C: (b, g, n) if variable, (d, n, -) if fixed
    dB0, dB1, dB2, dC0, dC1, dC2,  # strides of the variable dB/dC buffers
    N: tl.constexpr, NP: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,  # tile: channels × steps of one sub-block
    CHUNK: tl.constexpr, SCR: tl.constexpr,  # steps between stored states; scratch slots
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr, UNROLL: tl.constexpr,
    EVEN_L: tl.constexpr = False,  # l % BLOCK_L == 0: no masks along time
    EVEN_D: tl.constexpr = False,  # channels per group % BLOCK_D == 0: no masks along channels
    STAGES: tl.constexpr = 0,  # > 0: the run-time state loop is a `tl.range` Triton pipelines
):                             # (the next state's loads issued during this one); 0: `range`
    EVEN: tl.constexpr = EVEN_L and EVEN_D
    pid_bg, pid_d = tl.program_id(0), tl.program_id(1)
    bi, gi = pid_bg // g, pid_bg % g
    d_loc = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d_loc < dpg
    d_idx = gi * dpg + d_loc  # (BLOCK_D,)
    cols = tl.arange(0, BLOCK_L)  # (BLOCK_L,)
    ncols = tl.arange(0, NP)  # (NP,)
    bd_row = (bi * d + d_idx).to(tl.int64)  # (BLOCK_D,) the (b, d) rows of this tile
    row = bd_row * l
    nchunks = tl.cdiv(l, CHUNK)
    n_mask = d_mask[:, None] & (ncols[None, :] < N)  # (BLOCK_D, NP)
    sc_row = bd_row * SCR * N
    Dv = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_D:
        Dv = _ld(D_ptr + d_idx, d_mask, EVEN_D)
    G = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # adjoint g entering from the later block
    dA_acc = tl.zeros((BLOCK_D, NP), dtype=tl.float32)
    dB_acc = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # fixed B only
    dC_acc = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # fixed C only
    dD_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dbias_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    Bv_ptr = B_ptr + bi * sB0 + gi * sB1
    Cv_ptr = C_ptr + bi * sC0 + gi * sC1
    dBv_ptr = dB_ptr + bi * dB0 + gi * dB1
    dCv_ptr = dC_ptr + bi * dC0 + gi * dC1
    c = nchunks - 1
    while c >= 0:  # chunks from last to first
        nsub = tl.minimum(tl.cdiv(l - c * CHUNK, BLOCK_L), CHUNK // BLOCK_L)  # sub-blocks in it
        # 1. replay the chunk forward from its stored state; keep the state entering each
        #    sub-block (a few KB per program, in L1/L2) instead of every h_t
        H = tl.load(states_ptr + (bd_row * nchunks + c)[:, None] * N + ncols[None, :],
                    mask=n_mask, other=0.0)  # (BLOCK_D, NP)
        j = 0
        while j < nsub:
            t = c * CHUNK + j * BLOCK_L + cols  # (BLOCK_L,)
            mask = d_mask[:, None] & (t < l)[None, :]
            offs = row[:, None] + t[None, :]
            x = _ld(u_ptr + offs, mask, EVEN).to(tl.float32)
            dt, _ = _bwd_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS,
                               SOFTPLUS, EVEN)
            dtx = dt * x
            start = _is_start(seq_ptr + bi * l, t, l, HAS_SEQ)[None, :]
            if UNROLL:
                for n in tl.static_range(N):
                    h_in = _column(H, ncols, n)
                    _st(scratch_ptr + sc_row + j * N + n, h_in, d_mask, EVEN_D)
                    _, h_out = _fwd_state(n, h_in, dt, dtx, start, t, l, d_idx, d_mask, cols,
                                          A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, sB0, sB1, sB2,
                                          sC0, sC1, sC2, N, BLOCK_L, VAR_B, VAR_C, HAS_SEQ,
                                          EVEN_L, EVEN_D)
                    H = _put_column(H, ncols, n, h_out)
            elif STAGES > 0:  # pipelined: state n + 1's loads in flight during state n
                for n in tl.range(0, N, num_stages=STAGES):
                    _bwd_replay_state(n, j, nsub, c, nchunks, dt, dtx, start, t, l, bd_row,
                                      sc_row, d_idx, d_mask, cols, states_ptr, scratch_ptr,
                                      A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, sB0, sB1, sB2, sC0,
                                      sC1, sC2, N, BLOCK_L, VAR_B, VAR_C, HAS_SEQ, EVEN_L, EVEN_D)
                tl.debug_barrier()
            else:
                for n in range(N):
                    _bwd_replay_state(n, j, nsub, c, nchunks, dt, dtx, start, t, l, bd_row,
                                      sc_row, d_idx, d_mask, cols, states_ptr, scratch_ptr,
                                      A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, sB0, sB1, sB2, sC0,
                                      sC1, sC2, N, BLOCK_L, VAR_B, VAR_C, HAS_SEQ, EVEN_L, EVEN_D)
                tl.debug_barrier()
            j += 1
        tl.debug_barrier()  # scratch written above is read below, possibly by other threads
        # 2. sub-blocks backwards: recompute h, reverse-scan g, form the gradients
        j = nsub - 1
        while j >= 0:
            t = c * CHUNK + j * BLOCK_L + cols  # (BLOCK_L,)
            t_ok = t < l
            mask = d_mask[:, None] & t_ok[None, :]
            offs = row[:, None] + t[None, :]
            x = _ld(u_ptr + offs, mask, EVEN).to(tl.float32)
            dt, dt_raw = _bwd_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS,
                                    SOFTPLUS, EVEN)
            # Δ_{t+1}: the reverse scan's gate is Ā_{t+1}
            nxt_mask = d_mask[:, None] & (t + 1 < l)[None, :]
            dt_nx, _ = _load_delta(delta_ptr, bias_ptr, offs + 1, nxt_mask, d_idx, d_mask,
                                   HAS_BIAS, SOFTPLUS)
            start = _is_start(seq_ptr + bi * l, t, l, HAS_SEQ)[None, :]
            start_nx = _is_start(seq_ptr + bi * l, t + 1, l, HAS_SEQ)[None, :]
            dout = _ld(dout_ptr + offs, mask, EVEN).to(tl.float32)
            dy = dout
            if HAS_Z:
                zz = _ld(z_ptr + offs, mask, EVEN).to(tl.float32)
                dy = dout * zz * tl.sigmoid(zz)  # ∂out/∂y = silu(z)
            dtx = dt * x
            y = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
            dx = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
            ddt = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
            if UNROLL:
                for n in tl.static_range(N):
                    h_in = _ld(scratch_ptr + sc_row + j * N + n, d_mask, EVEN_D)
                    yc, dxc, ddtc, g_out, dA_c, dB_c, dC_c = _bwd_state(
                        n, h_in, _column(G, ncols, n), x, dt, dtx, dt_nx, dy, start, start_nx,
                        t, t_ok, l, d_idx, d_mask, cols, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr,
                        dBv_ptr, dCv_ptr, sB0, sB1, sB2, sC0, sC1, sC2, dB2, dC2, N, BLOCK_L,
                        VAR_B, VAR_C, HAS_SEQ, EVEN_L, EVEN_D)
                    G = _put_column(G, ncols, n, g_out)
                    dA_acc = _put_column(dA_acc, ncols, n, _column(dA_acc, ncols, n) + dA_c)
                    if not VAR_B:
                        dB_acc = _put_column(dB_acc, ncols, n, _column(dB_acc, ncols, n) + dB_c)
                    if not VAR_C:
                        dC_acc = _put_column(dC_acc, ncols, n, _column(dC_acc, ncols, n) + dC_c)
                    y += yc
                    dx += dxc
                    ddt += ddtc
            elif STAGES > 0:  # pipelined: state n + 1's loads in flight during state n
                for n in tl.range(0, N, num_stages=STAGES):
                    yc, dxc, ddtc = _bwd_grad_state(
                        n, j, x, dt, dtx, dt_nx, dy, start, start_nx, t, t_ok, l, bd_row, sc_row,
                        d_idx, d_mask, cols, scratch_ptr, gbuf_ptr, dA_ptr, dBf_ptr, dCf_ptr,
                        A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, dBv_ptr, dCv_ptr, sB0, sB1, sB2,
                        sC0, sC1, sC2, dB2, dC2, N, BLOCK_L, VAR_B, VAR_C, HAS_SEQ, EVEN_L,
                        EVEN_D)
                    y += yc
                    dx += dxc
                    ddt += ddtc
                tl.debug_barrier()
            else:
                for n in range(N):
                    yc, dxc, ddtc = _bwd_grad_state(
                        n, j, x, dt, dtx, dt_nx, dy, start, start_nx, t, t_ok, l, bd_row, sc_row,
                        d_idx, d_mask, cols, scratch_ptr, gbuf_ptr, dA_ptr, dBf_ptr, dCf_ptr,
                        A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, dBv_ptr, dCv_ptr, sB0, sB1, sB2,
                        sC0, sC1, sC2, dB2, dC2, N, BLOCK_L, VAR_B, VAR_C, HAS_SEQ, EVEN_L,
                        EVEN_D)
                    y += yc
                    dx += dxc
                    ddt += ddtc
                tl.debug_barrier()
            # 3. the per-step parts: D skip, gate, softplus
            if HAS_D:
                y += x * Dv[:, None]
                dx += dy * Dv[:, None]
                dD_acc += tl.sum(dy * x, axis=1)
            if HAS_Z:
                sig = tl.sigmoid(zz)
                dz = dout * y * sig * (1.0 + zz * (1.0 - sig))  # silu′(z) = σ(z)(1 + z(1 − σ(z)))
                _st(dz_ptr + offs, dz.to(dz_ptr.dtype.element_ty), mask, EVEN)
            if SOFTPLUS:
                ddt *= tl.sigmoid(dt_raw)  # softplus′ = σ
            if not EVEN:
                ddt = tl.where(mask, ddt, 0.0)
            dbias_acc += tl.sum(ddt, axis=1)
            _st(du_ptr + offs, dx.to(du_ptr.dtype.element_ty), mask, EVEN)
            _st(ddelta_ptr + offs, ddt.to(ddelta_ptr.dtype.element_ty), mask, EVEN)
            j -= 1
        tl.debug_barrier()  # the next chunk's step 1 overwrites the scratch
        c -= 1
    # 4. this program's sums over its batch row (the launcher adds the rows: no atomics)
    if UNROLL:
        pn = bd_row[:, None] * N + ncols[None, :]
        tl.store(dA_ptr + pn, dA_acc, mask=n_mask)
        if not VAR_B:
            tl.store(dBf_ptr + pn, dB_acc, mask=n_mask)
        if not VAR_C:
            tl.store(dCf_ptr + pn, dC_acc, mask=n_mask)
    tl.store(dD_ptr + bd_row, dD_acc, mask=d_mask)
    tl.store(dbias_ptr + bd_row, dbias_acc, mask=d_mask)


# ---------------------------------------------------------------------------------------------
# Backward, state-outer layout (BWD_VARIANTS with LAYOUT="state-outer"; helper A4, not default).
# One tile is a whole chunk (BLOCK_L = CHUNK), so the state entering it is the stored one: no
# replay pass, no scratch. The loop over the n states runs inside the chunk, once per chunk and
# state (not per sub-block): its loads (A_n, the stored h_n, the adjoint g_n the later chunk
# left in gbuf, B_n, C_n) depend on no earlier state and are issued one state ahead; the row
# sums of dA (and of fixed dB/dC) sit in column n of a (BLOCK_D, BLOCK_L) register tile (so
# n ≤ CHUNK). No state iteration waits for a load-add-store of its own.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _so_state(h_in, g_in, A_n, B_n, C_n, C_r, dt, dtx, dt_nx, dy, dy_r, start, start_nx, cols,
              BLOCK_L: tl.constexpr, HAS_SEQ: tl.constexpr, REV_LOADS: tl.constexpr):
    """State n over one chunk: h (forward scan from the stored state h_in), the adjoint
    g_t = C_t dy_t + Ā_{t+1} g_{t+1} (reverse scan from the later chunk's g_in), and
    Ā_t h_{t−1} = h_t − B̄_t x_t. Each (BLOCK_D, BLOCK_L) in time order.

    REV_LOADS: dt_nx, dy_r, C_r come in reversed time order (column k = step BLOCK_L − 1 − k),
    so the reverse scan is a forward one and only g is flipped back: one flip instead of the
    three of `_reverse_scan` (a flip across the lanes that hold the time axis costs a shuffle
    per element and lane bit)."""
    A2 = (A_n * LOG2E)[:, None]  # (BLOCK_D, 1)
    a = tl.exp2(dt * A2)  # Ā_t = exp(Δ_t A)
    a_nx = tl.exp2(dt_nx * A2)  # Ā_{t+1}: the reverse scan's gate
    if HAS_SEQ:
        a = tl.where(start, 0.0, a)
        a_nx = tl.where(start_nx, 0.0, a_nx)
    bx = dtx * B_n  # B̄x
    bx0 = tl.where(cols[None, :] == 0, a * h_in[:, None] + bx, bx)  # fold h_in into step 0
    _, h = tl.associative_scan((a, bx0), 1, combine_fn)
    if REV_LOADS:
        beta = C_r * dy_r  # reversed: g_in folds into column 0 (the chunk's last step)
        beta = tl.where(cols[None, :] == 0, beta + a_nx * g_in[:, None], beta)
        _, g_rev = tl.associative_scan((a_nx, beta), 1, combine_fn)
        gg = tl.flip(g_rev, 1)
    else:
        beta = C_n * dy
        beta = tl.where(cols[None, :] == BLOCK_L - 1, beta + a_nx * g_in[:, None], beta)
        gg = _reverse_scan(a_nx, beta)
    return h, gg, h - bx


@triton.jit
def _so_load_state(n, st_c, g_c, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, t, t_r, l, d_idx, d_mask,
                   sB0, sB1, sB2, sC0, sC1, sC2, N: tl.constexpr, VAR_B: tl.constexpr,
                   VAR_C: tl.constexpr, EVEN_L: tl.constexpr, EVEN_D: tl.constexpr,
                   REV_LOADS: tl.constexpr):
    """What state n reads in one chunk: A[:, n], the stored state entering the chunk, the
    adjoint leaving the later chunk, B_n, C_n (and C_n reversed). Nothing here depends on an
    earlier state of this chunk, so the loop issues it one state ahead."""
    A_n = _ld(A_ptr + d_idx * N + n, d_mask, EVEN_D)  # (BLOCK_D,)
    h_n = _ld(st_c + n, d_mask, EVEN_D)  # (BLOCK_D,)
    g_n = _ld(g_c + n, d_mask, EVEN_D)  # (BLOCK_D,) written in the later chunk
    B_n = _load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, sB0, sB1, sB2, VAR_B, EVEN_L, EVEN_D)
    C_n = _load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, sC0, sC1, sC2, VAR_C, EVEN_L, EVEN_D)
    C_r = C_n
    if REV_LOADS and VAR_C:  # a (BLOCK_L,) row read backwards: one layout conversion
        C_r = _load_bc(C_ptr, Cv_ptr, n, t_r, l, d_idx, d_mask, sC0, sC1, sC2, VAR_C, EVEN_L,
                       EVEN_D)
    return A_n, h_n, g_n, B_n, C_n, C_r


@triton.jit
def _so_atomic(ptr, v, t_ok, EVEN_L: tl.constexpr):
    """Relaxed atomic add of a (BLOCK_L,) row (acq_rel would add a fence per add)."""
    if EVEN_L:
        tl.atomic_add(ptr, v, sem="relaxed")
    else:
        tl.atomic_add(ptr, v, mask=t_ok, sem="relaxed")


@triton.jit
def _bwd_so_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, seq_ptr, dout_ptr,
    states_ptr,  # (b, d, c, n) fp32: the state entering each chunk (from the forward)
    gbuf_ptr,  # (b, d, n) fp32 zeros: the adjoint leaving the later chunk, per state
    du_ptr, ddelta_ptr, dz_ptr, dB_ptr, dC_ptr,  # (b,d,l) grads; fp32 zeroed dB/dC if variable
    dA_ptr, dBf_ptr, dCf_ptr, dD_ptr, dbias_ptr,  # fp32 sums per batch row: (b,d,n) ×3, (b,d) ×2
    l, d, dpg, g,  # length, channels, channels per group, groups
    sB0, sB1, sB2, sC0, sC1, sC2,  # strides of B/C: (b, g, n) if variable, (d, n, -) if fixed
    dB0, dB1, dB2, dC0, dC1, dC2,  # strides of the variable dB/dC buffers
    N: tl.constexpr,  # states, ≤ BLOCK_L (the row sums live in the columns of a tile)
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,  # tile: channels × one whole chunk
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
    EVEN_L: tl.constexpr = False,  # l % BLOCK_L == 0: no masks along time
    EVEN_D: tl.constexpr = False,  # channels per group % BLOCK_D == 0: no masks along channels
    REV_LOADS: tl.constexpr = True,  # adjoint inputs loaded time-reversed: 1 flip, not 3
):
    EVEN: tl.constexpr = EVEN_L and EVEN_D
    pid_bg, pid_d = tl.program_id(0), tl.program_id(1)
    bi, gi = pid_bg // g, pid_bg % g
    d_loc = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d_loc < dpg
    d_idx = gi * dpg + d_loc  # (BLOCK_D,)
    cols = tl.arange(0, BLOCK_L)  # (BLOCK_L,) step in the chunk; also the state of a row sum
    bd_row = (bi * d + d_idx).to(tl.int64)  # (BLOCK_D,)
    row = bd_row * l
    nchunks = tl.cdiv(l, BLOCK_L)
    g_c = gbuf_ptr + bd_row * N  # (BLOCK_D,) the adjoint carries of these rows
    Dv = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_D:
        Dv = _ld(D_ptr + d_idx, d_mask, EVEN_D)
    # sums over time, column n = state n: dA (and dB/dC when those are fixed (d, n))
    dA_acc = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
    dBf_acc = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)  # fixed B only
    dCf_acc = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)  # fixed C only
    dD_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dbias_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    Bv_ptr = B_ptr + bi * sB0 + gi * sB1
    Cv_ptr = C_ptr + bi * sC0 + gi * sC1
    dBv_ptr = dB_ptr + bi * dB0 + gi * dB1
    dCv_ptr = dC_ptr + bi * dC0 + gi * dC1
    c = nchunks - 1
    while c >= 0:  # chunks from last to first
        # 1. the chunk's tiles, shared by every state
        t = c * BLOCK_L + cols  # (BLOCK_L,)
        t_r = c * BLOCK_L + (BLOCK_L - 1 - cols)  # (BLOCK_L,) the same steps, reversed
        t_ok = t < l
        mask = d_mask[:, None] & t_ok[None, :]
        offs = row[:, None] + t[None, :]  # (BLOCK_D, BLOCK_L)
        x = _ld(u_ptr + offs, mask, EVEN).to(tl.float32)
        dt, _ = _bwd_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS, SOFTPLUS,
                           EVEN)
        dy = _ld(dout_ptr + offs, mask, EVEN).to(tl.float32)
        if HAS_Z:
            zz = _ld(z_ptr + offs, mask, EVEN).to(tl.float32)
            dy = dy * zz * tl.sigmoid(zz)  # ∂out/∂y = silu(z)
        start = _is_start(seq_ptr + bi * l, t, l, HAS_SEQ)[None, :]
        # the reverse scan's inputs Δ_{t+1} (masked: the last step of a row reads past it) and
        # dy, time-reversed once per chunk if REV_LOADS (contiguous loads, then a flip)
        nxt_mask = d_mask[:, None] & (t + 1 < l)[None, :]
        dt_nx, _ = _load_delta(delta_ptr, bias_ptr, offs + 1, nxt_mask, d_idx, d_mask,
                               HAS_BIAS, SOFTPLUS)
        start_nx = _is_start(seq_ptr + bi * l, t + 1, l, HAS_SEQ)[None, :]
        dy_r = dy
        if REV_LOADS:
            dt_nx = tl.flip(dt_nx, 1)
            start_nx = _is_start(seq_ptr + bi * l, t_r + 1, l, HAS_SEQ)[None, :]
            dy_r = tl.flip(dy, 1)
        dtx = dt * x
        y = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)  # Σ_n C_n h_n
        gB = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)  # Σ_n g_n B_n  (dx = Δ·gB)
        gahA = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)  # Σ_n g_n Ā h_{t−1} A_n
        st_c = states_ptr + (bd_row * nchunks + c) * N  # (BLOCK_D,) this chunk's stored states
        A_n, h_n, g_n, B_n, C_n, C_r = _so_load_state(
            0, st_c, g_c, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, t, t_r, l, d_idx, d_mask,
            sB0, sB1, sB2, sC0, sC1, sC2, N, VAR_B, VAR_C, EVEN_L, EVEN_D, REV_LOADS)
        # 2. every state over the whole chunk
        for n in range(N):
            # state n + 1's loads in flight during state n (the last one reloads N − 1)
            A_nx, h_nx, g_nx, B_nx, C_nx, C_rnx = _so_load_state(
                tl.minimum(n + 1, N - 1), st_c, g_c, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, t,
                t_r, l, d_idx, d_mask, sB0, sB1, sB2, sC0, sC1, sC2, N, VAR_B, VAR_C,
                EVEN_L, EVEN_D, REV_LOADS)
            h, gg, ah = _so_state(h_n, g_n, A_n, B_n, C_n, C_r, dt, dtx, dt_nx, dy, dy_r, start,
                                  start_nx, cols, BLOCK_L, HAS_SEQ, REV_LOADS)
            _st(g_c + n, _column(gg, cols, 0), d_mask, EVEN_D)  # g at the chunk's first step
            p = gg * ah  # g_t Ā_t h_{t−1}
            dA_acc += tl.where(cols[None, :] == n, tl.sum(p * dt, axis=1)[:, None], 0.0)
            y += h * C_n
            gB += gg * B_n
            gahA += p * A_n[:, None]
            if VAR_B:  # summed over the channel tile, one atomic add per step
                _so_atomic(dBv_ptr + n * dB2 + t, tl.sum(gg * dtx, axis=0), t_ok, EVEN_L)
            else:
                dBf_acc += tl.where(cols[None, :] == n, tl.sum(gg * dtx, axis=1)[:, None], 0.0)
            if VAR_C:
                _so_atomic(dCv_ptr + n * dC2 + t, tl.sum(dy * h, axis=0), t_ok, EVEN_L)
            else:
                dCf_acc += tl.where(cols[None, :] == n, tl.sum(dy * h, axis=1)[:, None], 0.0)
            A_n, h_n, g_n, B_n, C_n, C_r = A_nx, h_nx, g_nx, B_nx, C_nx, C_rnx
        # 3. the per-step parts (x, dout, z, δ read again: L1/L2 hits, fewer live registers)
        x = _ld(u_ptr + offs, mask, EVEN).to(tl.float32)
        dx = gB * dt  # Σ_n g Δ B_n
        ddt = gahA + gB * x  # Σ_n g (Ā h_{t−1} A_n + B_n x)
        if HAS_D:
            y += x * Dv[:, None]
            dx += dy * Dv[:, None]
            dD_acc += tl.sum(dy * x, axis=1)
        if HAS_Z:
            dout = _ld(dout_ptr + offs, mask, EVEN).to(tl.float32)
            zz = _ld(z_ptr + offs, mask, EVEN).to(tl.float32)
            sig = tl.sigmoid(zz)
            dz = dout * y * sig * (1.0 + zz * (1.0 - sig))  # silu′(z) = σ(z)(1 + z(1 − σ(z)))
            _st(dz_ptr + offs, dz.to(dz_ptr.dtype.element_ty), mask, EVEN)
        if SOFTPLUS:
            _, dt_raw = _bwd_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS,
                                   SOFTPLUS, EVEN)
            ddt *= tl.sigmoid(dt_raw)  # softplus′ = σ
        if not EVEN:
            ddt = tl.where(mask, ddt, 0.0)
        dbias_acc += tl.sum(ddt, axis=1)
        _st(du_ptr + offs, dx.to(du_ptr.dtype.element_ty), mask, EVEN)
        _st(ddelta_ptr + offs, ddt.to(ddelta_ptr.dtype.element_ty), mask, EVEN)
        tl.debug_barrier()  # the adjoints stored above are read by other threads next chunk
        c -= 1
    # 4. this program's sums over its batch row (the launcher adds the rows: no atomics)
    pn = bd_row[:, None] * N + cols[None, :]  # (BLOCK_D, BLOCK_L), columns < N used
    n_mask = d_mask[:, None] & (cols[None, :] < N)
    tl.store(dA_ptr + pn, dA_acc, mask=n_mask)
    if not VAR_B:
        tl.store(dBf_ptr + pn, dBf_acc, mask=n_mask)
    if not VAR_C:
        tl.store(dCf_ptr + pn, dCf_acc, mask=n_mask)
    tl.store(dD_ptr + bd_row, dD_acc, mask=d_mask)
    tl.store(dbias_ptr + bd_row, dbias_acc, mask=d_mask)


# ---------------------------------------------------------------------------------------------
# Launchers: argument checks, layouts, the tile configurations.
# ---------------------------------------------------------------------------------------------
def fwd_configs():
    """Candidate forward tiles (BLOCK_D channels × BLOCK_L steps, warps): 4–32 values a thread."""
    out = []
    for bl in (8, 16, 32):
        for bd in (32, 64, 128):
            for w in (1, 2, 4):
                if 4 <= bd * bl // (32 * w) <= 32:
                    out.append(dict(BLOCK_D=bd, BLOCK_L=bl, num_warps=w))
    return out


def bwd_configs():
    """Candidate backward tiles (sub-blocks of BLOCK_L steps inside a chunk)."""
    out = []
    for bl in (8, 16, 32):
        for bd in (16, 32, 64):
            for w in (1, 2, 4):
                if 4 <= bd * bl // (32 * w) <= 16:
                    out.append(dict(BLOCK_D=bd, BLOCK_L=bl, num_warps=w))
    return out


def _autotuned(kernel, configs, **kw):
    cfgs = [triton.Config({k: v for k, v in c.items() if k != "num_warps"},
                          num_warps=c["num_warps"]) for c in configs]
    return triton.autotune(cfgs, key=["l", "d", "dpg", "N", "CHUNK"], **kw)(kernel)


_ZEROED = ["dB_ptr", "dC_ptr", "gbuf_ptr"]
_fwd_autotuned = _autotuned(_fwd_kernel, fwd_configs())
_bwd_autotuned = _autotuned(_bwd_kernel, bwd_configs(), reset_to_zero=_ZEROED)

# Launch configuration: "auto" = autotune over the candidates (slow first call, one compile per
# candidate), or a dict. CPU (interpreter): one small tile, nothing to tune.
# Tiles: the fastest candidates of the H200 sweep of 2026-11-29 (bench/gpu_selective_scan.py,
# docs/BENCHMARKS.md), b8 d2048 l2048 bf16; n64 only had the run-time-loop candidates.
# Forward keys besides the tile: STAGES (> 0: pipelined `for` over time blocks), EVEN (False:
# keep every mask even where the tile divides the tensor), maxnreg (registers per thread: ≤ 128
# lets two 8-warp programs share an SM). The H200 run of the variants below (bench/gpu_all.sh
# final, 2026-11-29, docs/BENCHMARKS.md) at b8 d2048 n16 l2048: unmasked while-loop 0.447 ms,
# pipelined 0.483, masked 0.636, mamba_ssm CUDA 0.591. The default stays the pipelined one: it is
# the variant whose full-size accuracy and gpu tests ran on the H200 in that call; the unmasked
# while-loop one was timed there but checked only in the interpreter (switch once checked).
FWD_MEASURED = dict(BLOCK_D=64, BLOCK_L=32, num_warps=4, STAGES=0, EVEN=False)
FWD_PIPELINED = dict(BLOCK_D=64, BLOCK_L=32, num_warps=4, STAGES=2)
FWD_UNMASKED = dict(FWD_MEASURED, EVEN=True)
BWD_RUNTIME_LOOP = dict(BLOCK_D=32, BLOCK_L=16, num_warps=2)  # the default until 2026-11-30
# defaults from the H200 runs of 2026-11-30 (docs/BENCHMARKS.md): the unmasked forward (0.447 ms
# vs 0.484 pipelined) and the state-outer backward with three flips (fwd+bwd 3.18 ms vs 4.98)
DEFAULT_FWD = FWD_UNMASKED
DEFAULT_BWD = dict(LAYOUT="state-outer", EVEN=True, BLOCK_D=2, BLOCK_L=64, num_warps=1,
                   REV_LOADS=False)
DEFAULT_FWD_LARGE_N = dict(BLOCK_D=64, BLOCK_L=8, num_warps=2)
DEFAULT_BWD_LARGE_N = dict(BLOCK_D=32, BLOCK_L=8, num_warps=1)
# named forward variants (n ≤ UNROLL_MAX) the GPU script times side by side
FWD_VARIANTS = {
    "measured 64x32w4": FWD_MEASURED,  # while loop, masks (the 0.949 ms kernel)
    "unmasked 64x32w4": FWD_UNMASKED,  # while loop, no masks (fastest, H200; the default)
    "pipelined 64x32w4": FWD_PIPELINED,  # + `for` with 2-stage cp.async pipelining
    "pipelined 64x32w8 r128": dict(FWD_PIPELINED, num_warps=8, maxnreg=128),  # 2× the warps
    "pipelined 32x32w4 r128": dict(FWD_PIPELINED, BLOCK_D=32, maxnreg=128),  # 2× the programs
}
# named backward variants (n ≤ UNROLL_MAX; the run-time state loop) the GPU script times side
# by side, each with the default forward. Keys besides the tile: EVEN (True: no masks where the
# tile divides l and d/g; the backward's default is False), STAGES (> 0: the state loop is a
# pipelined `tl.range`). Not yet timed (helper A3, 2026-11-29; bench/NOTES_selective_scan.md).
# LAYOUT="state-outer": the other kernel (`_bwd_so_kernel`; BLOCK_L is the chunk, whatever the
# config says; REV_LOADS=False: three flips per state instead of one). sm_90 compile at
# b8 d2048 n16 l2048 bf16 (helper A4): 2x64w1 128 registers, no spill; 8x64w4 128 + 8 B spill.
STATE_OUTER = dict(LAYOUT="state-outer", EVEN=True)
BWD_VARIANTS = {
    "runtime-loop 32x16w2": BWD_RUNTIME_LOOP,  # masks, plain run-time state loop (4.5 ms, H200)
    "unmasked 32x16w2": dict(BWD_RUNTIME_LOOP, EVEN=True),
    "pipelined 32x16w2": dict(BWD_RUNTIME_LOOP, STAGES=2),
    "unmasked pipelined 32x16w2": dict(BWD_RUNTIME_LOOP, EVEN=True, STAGES=2),
    "unmasked pipelined 32x16w4": dict(BWD_RUNTIME_LOOP, EVEN=True, STAGES=2, num_warps=4),
    "state-outer 2x64w1": dict(STATE_OUTER, BLOCK_D=2, BLOCK_L=64, num_warps=1),
    "state-outer 8x64w4": dict(STATE_OUTER, BLOCK_D=8, BLOCK_L=64, num_warps=4),
    "state-outer 2x64w1 flip3": dict(STATE_OUTER, BLOCK_D=2, BLOCK_L=64, num_warps=1,
                                     REV_LOADS=False),
}
# n > 16 (chunk 128): the state-outer kernel, timed by the GPU script next to DEFAULT_BWD_LARGE_N
# (sm_90, n64: 1x128w1 96 registers, 4x128w4 164, no spills; helper A4, not yet timed)
# (the first entry is the one the script times: 4× fewer dB/dC atomic adds than 1x128w1)
BWD_VARIANTS_LARGE_N = {
    "state-outer 4x128w4": dict(STATE_OUTER, BLOCK_D=4, BLOCK_L=128, num_warps=4),
    "state-outer 1x128w1": dict(STATE_OUTER, BLOCK_D=1, BLOCK_L=128, num_warps=1),
}
# a config dict, a function of n returning one, or "auto" (autotune over fwd_/bwd_configs())
FWD_CONFIG = lambda n: DEFAULT_FWD if n <= UNROLL_MAX else DEFAULT_FWD_LARGE_N
BWD_CONFIG = lambda n: DEFAULT_BWD if n <= UNROLL_MAX else DEFAULT_BWD_LARGE_N
CPU_FWD = dict(BLOCK_D=4, BLOCK_L=8, num_warps=1)
CPU_BWD = dict(BLOCK_D=4, BLOCK_L=8, num_warps=1)


def _numpy_breaks_range():
    """NumPy ≥ 2.4: the interpreter cannot run a `for` with a run-time bound (triton#9171)."""
    import numpy as np
    return tuple(int(v) for v in np.__version__.split(".")[:2]) >= (2, 4)


def _launch(kernel, autotuned, config, default, cpu_config, grid_fn, args, consts, even=None,
            even_default=True):
    """Launch ``kernel`` with ``config`` (None: ``default``, or ``cpu_config`` in the interpreter).

    ``even`` = (l, channels per group): the EVEN_L / EVEN_D flags are set from the tile, unless
    the config says ``EVEN=False`` (``even_default``: when the config does not say; the backward
    passes False, so its configs without ``EVEN`` keep every mask, as before the flag existed).
    """
    if config is None:
        config = cpu_config if device.interpreted() else default
    if callable(config):
        config = config(consts["N"])
    if config == "auto":  # the autotuner's config supplies BLOCK_D, BLOCK_L and num_warps
        autotuned[lambda meta: grid_fn(meta["BLOCK_D"])](*args, **consts)
        return
    config = dict(config)  # a config may also override UNROLL
    keep_masks = not config.pop("EVEN", even_default)
    if even is not None:
        l, dpg = even
        config.setdefault("EVEN_L", not keep_masks and l % config["BLOCK_L"] == 0)
        config.setdefault("EVEN_D", not keep_masks and dpg % config["BLOCK_D"] == 0)
        if device.interpreted() and config.get("STAGES", 0) and _numpy_breaks_range():
            config["STAGES"] = 0  # same block body, `while` loop
    if device.interpreted():
        config.pop("maxnreg", None)  # a compile option the interpreter does not take
    kernel[grid_fn(config["BLOCK_D"])](*args, **{**consts, **config})


def _bc_strides(X):
    """B/C strides for the kernels: (b, g, n) if variable (b, g, n, l), (d, n, 0) if fixed."""
    if X.ndim == 2:
        return X.stride(0), X.stride(1), 0
    return X.stride(0), X.stride(1), X.stride(2)


def bc_layout(X, upcast=False):
    """B or C ready for a kernel: contiguous, (b, n, l) viewed as (b, 1, n, l); fp32 if upcast."""
    X = X[:, None] if X.ndim == 3 else X  # (b, 1, n, l)
    # (upcast: the few KB of B/C go to fp32 once here, instead of every thread converting the
    # same broadcast values for every state inside the kernel)
    return (X.float() if upcast else X).contiguous()


def seq_idx_from_cu_seqlens(cu_seqlens, l):
    """(1, l) int32 sequence index of each token from cumulative lengths [0, l₀, l₀+l₁, …, l]."""
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D [0, …, l], got shape {tuple(cu_seqlens.shape)}")
    if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != l:
        raise ValueError(f"cu_seqlens must start at 0 and end at l = {l}, got "
                         f"{cu_seqlens[0].item()} … {cu_seqlens[-1].item()}")
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    if (lengths < 0).any():
        raise ValueError("cu_seqlens must be non-decreasing")
    ids = torch.arange(len(lengths), device=cu_seqlens.device, dtype=torch.int32)
    return ids.repeat_interleave(lengths.long())[None]  # (1, l)


def check_args(u, delta, A, B, C, D, z, delta_bias, seq_idx, cu_seqlens):
    """mamba_ssm's argument rules, with clear errors. Returns ((b, d, l, n, g), seq_idx int32)."""
    if isinstance(A, torch.Tensor) and A.is_complex():
        raise TypeError("complex A is not supported: this kernel covers real A (Mamba-1) only")
    b, d, l, n = check_inputs(u, delta, A, B, C, D, z, delta_bias)
    if u.dtype not in DTYPES:
        raise TypeError(f"u must be float32, float16 or bfloat16, got {u.dtype}")
    for name, X in (("delta", delta), ("z", z)):
        if X is not None and X.dtype != u.dtype:
            raise TypeError(f"{name} must have u's dtype {u.dtype}, got {X.dtype}")
    for name, X in (("A", A), ("D", D), ("delta_bias", delta_bias)):
        if X is not None and X.dtype != torch.float32:
            raise TypeError(f"{name} must be float32 (as in mamba_ssm), got {X.dtype}")
    for name, X in (("B", B), ("C", C)):
        ok = (torch.float32,) if X.ndim == 2 else (u.dtype, torch.float32)
        if X.dtype not in ok:
            raise TypeError(f"{name} must have dtype in {list(ok)}, got {X.dtype}")
    if n > MAX_DSTATE:
        raise ValueError(f"dstate n = {n} is larger than the supported maximum {MAX_DSTATE}")
    gB = B.shape[1] if B.ndim == 4 else 1
    gC = C.shape[1] if C.ndim == 4 else 1
    if B.ndim != 2 and C.ndim != 2 and gB != gC:
        raise ValueError(f"B and C must have the same number of groups, got {gB} and {gC}")
    if cu_seqlens is not None:
        if seq_idx is not None:
            raise ValueError("pass seq_idx or cu_seqlens, not both")
        if b != 1:
            raise ValueError(f"cu_seqlens packs sequences into one row: u must have b = 1, got {b}")
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.is_floating_point():
            raise TypeError("cu_seqlens must be an integer tensor")
        seq_idx = seq_idx_from_cu_seqlens(cu_seqlens.to(u.device), l)
    if seq_idx is not None:
        if not isinstance(seq_idx, torch.Tensor) or seq_idx.is_floating_point():
            raise TypeError("seq_idx must be an integer tensor (b, l)")
        if tuple(seq_idx.shape) != (b, l):
            raise ValueError(f"seq_idx must have shape (b, l) = {(b, l)}, "
                             f"got {tuple(seq_idx.shape)}")
        seq_idx = seq_idx.to(torch.int32).contiguous()
    check_same_device(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=delta_bias,
                      seq_idx=seq_idx)
    if not u.is_cuda and not device.interpreted():
        raise ValueError("tensors are on the CPU but Triton is not in interpreter mode "
                         "(TRITON_INTERPRET=1); move them to the GPU")
    g = gB if B.ndim != 2 else gC  # groups of B/C (1 if both fixed)
    return (b, d, l, n, g), seq_idx


def flags(D, z, delta_bias, softplus, B, C, seq_idx):
    """The compile-time switches both kernels take."""
    return dict(HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None,
                SOFTPLUS=bool(softplus), VAR_B=B.ndim != 2, VAR_C=C.ndim != 2,
                HAS_SEQ=seq_idx is not None)


def optional(*tensors, dummy):
    """Kernels need a pointer for every argument: ``dummy`` stands in for absent ones (unread)."""
    return tuple(dummy if t is None else t for t in tensors)


def _forward(u, delta, A, B, C, D, z, delta_bias, softplus, seq_idx, shape, config=None):
    """Launch the forward. Returns (out (b,d,l), states (b,d,c,n) fp32, last state (b,d,n) fp32).

    ``config``: None (FWD_CONFIG, or CPU_FWD in the interpreter), a dict, a function of n, "auto".
    """
    b, d, l, n, g = shape
    u, delta, A = u.contiguous(), delta.contiguous(), A.contiguous()
    z = z.contiguous() if z is not None else None
    Bk, Ck = bc_layout(B, upcast=True), bc_layout(C, upcast=True)
    q = chunk_size(n)
    out = torch.empty_like(u)
    states = torch.empty((b, d, triton.cdiv(l, q), n), device=u.device, dtype=torch.float32)
    states[:, :, 0] = 0.0  # h_{−1} = 0; the kernel writes the state entering every later chunk
    last = torch.zeros((b, d, n), device=u.device, dtype=torch.float32)  # (carry if n large)
    args = (u, delta, A, Bk, Ck, *optional(D, z, delta_bias, seq_idx, dummy=A),
            out, states, last, l, d, d // g, g, *_bc_strides(Bk), *_bc_strides(Ck))
    consts = dict(N=n, NP=triton.next_power_of_2(n), CHUNK=q, UNROLL=n <= UNROLL_MAX,
                  **flags(D, z, delta_bias, softplus, B, C, seq_idx))
    _launch(_fwd_kernel, _fwd_autotuned, config, FWD_CONFIG, CPU_FWD,
            lambda bd: (b * g, triton.cdiv(d // g, bd)), args, consts, even=(l, d // g))
    return out, states, last


def _backward(dout, u, delta, A, B, C, D, z, delta_bias, softplus, seq_idx, states, shape,
              config=None):
    """Launch the backward. Returns du, ddelta, dA, dB, dC, dD, dz, ddelta_bias."""
    b, d, l, n, g = shape
    picked = config if config is not None else CPU_BWD if device.interpreted() else BWD_CONFIG
    picked = picked(n) if callable(picked) else picked
    if isinstance(picked, dict) and picked.get("LAYOUT") == "state-outer":
        return _backward_state_outer(dout, u, delta, A, B, C, D, z, delta_bias, softplus,
                                     seq_idx, states, shape, picked)
    u, delta, A, dout = u.contiguous(), delta.contiguous(), A.contiguous(), dout.contiguous()
    z = z.contiguous() if z is not None else None
    Bk, Ck = bc_layout(B, upcast=True), bc_layout(C, upcast=True)
    f32 = dict(device=u.device, dtype=torch.float32)
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dz = torch.empty_like(z) if z is not None else None
    # fp32 sums: dB/dC over the channel tiles (atomic adds) if they vary with time; the rest per
    # batch row (each program owns its rows), added over b below
    dB = torch.zeros(Bk.shape if B.ndim != 2 else (1,), **f32)
    dC = torch.zeros(Ck.shape if C.ndim != 2 else (1,), **f32)
    dA_rows = torch.zeros((b, d, n), **f32)
    dBf_rows = torch.zeros((b, d, n) if B.ndim == 2 else (1,), **f32)
    dCf_rows = torch.zeros((b, d, n) if C.ndim == 2 else (1,), **f32)
    dD_rows, dbias_rows = torch.zeros((b, d), **f32), torch.zeros((b, d), **f32)
    q = chunk_size(n)
    scr = q // MIN_BLOCK_L  # sub-blocks of the smallest tile in one chunk
    scratch = torch.empty((b, d, scr, n), **f32)
    gbuf = torch.zeros((b, d, n), **f32)  # (used when the state loop is not unrolled)
    dBs = _bc_strides(dB) if B.ndim != 2 else (0, 0, 0)
    dCs = _bc_strides(dC) if C.ndim != 2 else (0, 0, 0)
    args = (u, delta, A, Bk, Ck, *optional(D, z, delta_bias, seq_idx, dummy=A), dout, states,
            scratch, gbuf, du, ddelta, *optional(dz, dummy=A), dB, dC,
            dA_rows, dBf_rows, dCf_rows, dD_rows, dbias_rows,
            l, d, d // g, g, *_bc_strides(Bk), *_bc_strides(Ck), *dBs, *dCs)
    consts = dict(N=n, NP=triton.next_power_of_2(n), CHUNK=q, SCR=scr, UNROLL=n <= BWD_UNROLL_MAX,
                  **flags(D, z, delta_bias, softplus, B, C, seq_idx))
    _launch(_bwd_kernel, _bwd_autotuned, config, BWD_CONFIG, CPU_BWD,
            lambda bd: (b * g, triton.cdiv(d // g, bd)), args, consts, even=(l, d // g),
            even_default=False)
    dA = dA_rows.sum(0)
    dB = dBf_rows.sum(0) if B.ndim == 2 else dB
    dC = dCf_rows.sum(0) if C.ndim == 2 else dC
    return finish_grads(du, ddelta, dA, dB, dC, dD_rows.sum(0), dz, dbias_rows.sum(0), B, C, D,
                        delta_bias)


def _backward_state_outer(dout, u, delta, A, B, C, D, z, delta_bias, softplus, seq_idx, states,
                          shape, config):
    """`_backward` with the state-outer kernel (config LAYOUT="state-outer"): the tile is one
    chunk (BLOCK_L = chunk_size(n), whatever the config says): no scratch, no replay pass."""
    b, d, l, n, g = shape
    q = chunk_size(n)
    if n > q:
        raise ValueError(f"LAYOUT='state-outer' keeps the carries in the {q} columns of a tile: "
                         f"needs n ≤ {q}, got n = {n}")
    u, delta, A, dout = u.contiguous(), delta.contiguous(), A.contiguous(), dout.contiguous()
    z = z.contiguous() if z is not None else None
    Bk, Ck = bc_layout(B, upcast=True), bc_layout(C, upcast=True)
    f32 = dict(device=u.device, dtype=torch.float32)
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dz = torch.empty_like(z) if z is not None else None
    dB = torch.zeros(Bk.shape if B.ndim != 2 else (1,), **f32)  # atomic sums if variable
    dC = torch.zeros(Ck.shape if C.ndim != 2 else (1,), **f32)
    dA_rows = torch.zeros((b, d, n), **f32)  # per batch row, added over b below
    dBf_rows = torch.zeros((b, d, n) if B.ndim == 2 else (1,), **f32)
    dCf_rows = torch.zeros((b, d, n) if C.ndim == 2 else (1,), **f32)
    dD_rows, dbias_rows = torch.zeros((b, d), **f32), torch.zeros((b, d), **f32)
    dBs = _bc_strides(dB) if B.ndim != 2 else (0, 0, 0)
    dCs = _bc_strides(dC) if C.ndim != 2 else (0, 0, 0)
    gbuf = torch.zeros((b, d, n), **f32)  # the adjoint carried between chunks
    args = (u, delta, A, Bk, Ck, *optional(D, z, delta_bias, seq_idx, dummy=A), dout, states,
            gbuf, du, ddelta, *optional(dz, dummy=A), dB, dC, dA_rows, dBf_rows, dCf_rows, dD_rows,
            dbias_rows, l, d, d // g, g, *_bc_strides(Bk), *_bc_strides(Ck), *dBs, *dCs)
    config = {k: v for k, v in config.items() if k not in ("LAYOUT", "STAGES", "UNROLL")}
    config["BLOCK_L"] = q
    consts = dict(N=n, **flags(D, z, delta_bias, softplus, B, C, seq_idx))
    _launch(_bwd_so_kernel, None, config, None, None,
            lambda bd: (b * g, triton.cdiv(d // g, bd)), args, consts, even=(l, d // g),
            even_default=False)
    dB = dBf_rows.sum(0) if B.ndim == 2 else dB
    dC = dCf_rows.sum(0) if C.ndim == 2 else dC
    return finish_grads(du, ddelta, dA_rows.sum(0), dB, dC, dD_rows.sum(0), dz,
                        dbias_rows.sum(0), B, C, D, delta_bias)


def finish_grads(du, ddelta, dA, dB, dC, dD, dz, dbias, B, C, D, delta_bias):
    """Gradients in the shapes and dtypes of the arguments (None for absent ones)."""
    dB = dB.reshape(B.shape).to(B.dtype)
    dC = dC.reshape(C.shape).to(C.dtype)
    return (du, ddelta, dA, dB, dC, dD if D is not None else None, dz,
            dbias if delta_bias is not None else None)


class Kernels:
    """A forward and a backward launcher: ``forward(...)`` → (out, states, last),
    ``backward(dout, ..., states, shape)`` → the eight gradients."""

    def __init__(self, name, forward, backward):
        self.name, self.forward, self.backward = name, forward, backward


TUNED = Kernels("tuned", _forward, _backward)


def variant(fwd=None, bwd=None, name="tuned variant"):
    """The tuned kernels with other launch configurations (None: the defaults); see FWD_VARIANTS.

    ``fwd`` / ``bwd``: a dict (BLOCK_D, BLOCK_L, num_warps, maxnreg, STAGES, EVEN; see
    FWD_VARIANTS / BWD_VARIANTS), a function of n returning one, or "auto"."""
    def forward(*args):
        return _forward(*args, config=fwd)

    def backward(*args):
        return _backward(*args, config=bwd)

    return Kernels(name, forward, backward)


class SelectiveScanFn(torch.autograd.Function):
    """Forward saves the inputs and one state per chunk; backward recomputes inside each chunk."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
                seq_idx, kernels, shape):
        out, states, last = kernels.forward(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                            seq_idx, shape)
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, seq_idx, states)
        ctx.softplus, ctx.kernels, ctx.shape = delta_softplus, kernels, shape
        if return_last_state:
            ctx.mark_non_differentiable(last)
            return out, last
        return out

    @staticmethod
    def backward(ctx, dout, *_):
        u, delta, A, B, C, D, z, delta_bias, seq_idx, states = ctx.saved_tensors
        grads = ctx.kernels.backward(dout, u, delta, A, B, C, D, z, delta_bias, ctx.softplus,
                                     seq_idx, states, ctx.shape)
        return (*grads, None, None, None, None, None)


def run(kernels, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
        return_last_state=False, seq_idx=None, cu_seqlens=None):
    """Check the arguments, then run ``kernels`` forward (and backward through autograd)."""
    shape, seq_idx = check_args(u, delta, A, B, C, D, z, delta_bias, seq_idx, cu_seqlens)
    return SelectiveScanFn.apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                 return_last_state, seq_idx, kernels, shape)


def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False, seq_idx=None, cu_seqlens=None, config=None):
    """out = (C·h + D·x)·silu(z),  h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t,  Δ = softplus(δ + bias).

    Shapes (as ``mamba_ssm.selective_scan_fn``):
        u, delta, z:    (b, d, l) float32 / float16 / bfloat16 (one dtype)
        A:              (d, n) float32, real (complex A raises TypeError); n ≤ 256
        B, C:           (b, n, l) or (b, g, n, l) in u's dtype or float32, or fixed (d, n) float32
        D, delta_bias:  (d,) float32
        seq_idx:        (b, l) int, optional: packed sequences; the state restarts where it changes
        cu_seqlens:     (k + 1,) int, optional, b = 1: cumulative lengths [0, …, l] of k sequences
        returns out (b, d, l) in u's dtype; with return_last_state (out, h_{l−1} (b, d, n)
        float32) — for packed sequences, the state of the row's last sequence.

    Gradients flow to every tensor argument (not through last_state, as in mamba_ssm). The tuned
    kernels (tile table / autotune, exp2); ``selective_scan_teaching`` is the readable version.
    Matches ``mamba_ssm.ops.selective_scan_interface.selective_scan_fn`` (real A).
    ``config`` (not in mamba_ssm): None for the defaults, or {"fwd": …, "bwd": …} launch configs
    (see ``variant``), to time alternatives.
    """
    kernels = TUNED
    if config is not None:
        if not isinstance(config, dict) or set(config) - {"fwd", "bwd"}:
            raise ValueError(f"config must be a dict with keys 'fwd'/'bwd', got {config!r}")
        kernels = variant(config.get("fwd"), config.get("bwd"))
    return run(kernels, u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
               seq_idx, cu_seqlens)
