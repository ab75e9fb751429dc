"""The forward kernel of the tuned Mamba-1 selective scan (chapter 09) and its launcher.

    Ā_t = exp(Δ_t A)      h_t = Ā_t h_{t−1} + Δ_t B_t x_t      y_t = C_t h_t + D x_t
    out_t = y_t · silu(z_t)

Shapes: u, delta, z, out (b, d, l); A (d, n); B, C (b, g, n, l) fp32 or fixed (d, n); D, bias
(d,); h0 (b, d, n) fp32, the state before step 0 (optional; it enters through ``last``); states (b,
d, c, n) fp32, the state
entering each chunk of ``config.chunk`` steps (states[:, :, 0] = h0 or 0); last (b, d, n) fp32.

How the kernel is laid out (its layout decides the speed: bench/NOTES_selective_scan.md):
one program owns a tile of BLOCK_D channels of one batch row (and one group of B/C). It walks
time in blocks of BLOCK_L steps; inside a block it loops over the n states (unrolled: the carry of
each state lives in registers, which cannot be indexed at run time) and scans a 2-D
(channels, time) tile with `tl.associative_scan` along time, combining with the one ⊗ of
`mambalearn.ops`. The state entering a block is folded into the block's first step
(b_0 ← Ā_0 h + b_0), so the scan result *is* h. y = Σ_n C_n h_n accumulates in registers; only u,
Δ, B, C, z are read and only y is written, once. Every CHUNK steps the state (b, d, n) goes to
memory for the backward: nothing of size (b, d, l, n) is ever stored. For large n the loop over
states runs at run time and each state's carry lives in ``last`` (L1/L2).
"""

import torch
import triton
import triton.language as tl

from mambalearn import device
from mambalearn.mamba1 import config as cfgs
from mambalearn.mamba1.args import bc_layout, bc_strides
from mambalearn.mamba1.fused.tile import (
    column,
    l1_sectors,
    ld,
    load_bc,
    prefetch_run,
    put_column,
    seq_start,
    softplus_fast,
)
from mambalearn.triton.common import LOG2E
from mambalearn.triton.common import softplus as _softplus
from mambalearn.triton.scan import combine_fn  # the ⊗ of chapter 03, jitted in chapter 08


@triton.jit
def fwd_scan(A2_n, h_in, Bn, dt, dtx, start, cols, BLOCK_L: tl.constexpr, HAS_SEQ: tl.constexpr):
    """The scan of one state n over one block, its inputs given: A·log2 e (BLOCK_D,), the state
    entering the block (BLOCK_D,), B_n (broadcastable). Returns h (BLOCK_D, BLOCK_L) and h at the
    block's last step."""
    a = tl.exp2(dt * A2_n[:, None])  # Ā = exp(ΔA) = 2^(Δ·A·log2 e): the one exp per element
    if HAS_SEQ:
        a = tl.where(start, 0.0, a)  # a new sequence forgets the old state
    bx = dtx * Bn  # B̄x
    bx = tl.where(cols[None, :] == 0, a * h_in[:, None] + bx, bx)  # fold h_in into step 0
    _, h = tl.associative_scan((a, bx), 1, combine_fn)  # (BLOCK_D, BLOCK_L)
    return h, column(h, cols, BLOCK_L - 1)


@triton.jit
def fwd_state(n, A2_n, h_in, dt, dtx, start, t, l, d_idx, d_mask, cols, B_ptr, Bv_ptr, C_ptr,
              Cv_ptr, stride_Bn, stride_Cn, N: tl.constexpr, BLOCK_L: tl.constexpr,
              VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
              EVEN_L: tl.constexpr, EVEN_D: tl.constexpr):
    """One state n over one block, A·log2 e given (BLOCK_D,): returns (h (BLOCK_D, BLOCK_L),
    C_n (broadcastable), h at the block's last step)."""
    Bn = load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, stride_Bn, N, VAR_B, EVEN_L, EVEN_D)
    Cn = load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, stride_Cn, N, VAR_C, EVEN_L, EVEN_D)
    h, h_last = fwd_scan(A2_n, h_in, Bn, dt, dtx, start, cols, BLOCK_L, HAS_SEQ)
    return h, Cn, h_last


@triton.jit
def _fwd_loads(n, A_ptr, last_ptr, bd_row, t, l, d_idx, d_mask, B_ptr, Bv_ptr, C_ptr, Cv_ptr,
               stride_Bn, stride_Cn, N: tl.constexpr, VAR_B: tl.constexpr,
               VAR_C: tl.constexpr, EVEN_L: tl.constexpr, EVEN_D: tl.constexpr):
    """What state n reads in one block of the run-time state loop: A[:, n]·log2 e, its carry
    (from ``last``), B_n, C_n. Nothing here depends on state n − 1, so it is issued one ahead."""
    A2_n = ld(A_ptr + d_idx * N + n, d_mask, EVEN_D) * LOG2E
    h_in = tl.load(last_ptr + bd_row * N + n, mask=d_mask, other=0.0)
    Bn = load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, stride_Bn, N, VAR_B, EVEN_L, EVEN_D)
    Cn = load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, stride_Cn, N, VAR_C, EVEN_L, EVEN_D)
    return A2_n, h_in, Bn, Cn


@triton.jit
def _fwd_block(t0, H, bias_v, D_v, u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, z_ptr, seq_ptr,
               out_ptr, states_ptr, last_ptr, Bv_ptr, Cv_ptr, l, bi, d_idx, d_mask, bd_row, row,
               st_row, cols, ncols, stride_Bn, stride_Cn,
               N: tl.constexpr, BLOCK_L: tl.constexpr, CHUNK: tl.constexpr,
               HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
               SOFTPLUS: tl.constexpr, VAR_B: tl.constexpr, VAR_C: tl.constexpr,
               HAS_SEQ: tl.constexpr, UNROLL: tl.constexpr, EVEN_L: tl.constexpr,
               EVEN_D: tl.constexpr, STATE_UNROLL: tl.constexpr, L1_X: tl.constexpr,
               L1_BC: tl.constexpr, FAST_SP: tl.constexpr):
    """The steps t0 … t0 + BLOCK_L − 1 of one channel tile, every state: returns the new carry H."""
    EVEN: tl.constexpr = EVEN_L and EVEN_D
    t = t0 + cols  # (BLOCK_L,)
    mask = d_mask[:, None] & (t < l)[None, :]  # (BLOCK_D, BLOCK_L)
    offs = row[:, None] + t[None, :]
    if L1_X > 0:  # the next block's u, Δ, z rows and B, C rows asked into L1: hits a block from now
        t_nx = tl.minimum(t0 + BLOCK_L, l - 1)
        rows = tl.where(d_mask, row, 0)[:, None]  # (BLOCK_D, 1) (a channel past d: row 0's)
        prefetch_run(u_ptr, rows + t_nx, BLOCK_L, rows + l - 1, L1_X)
        prefetch_run(delta_ptr, rows + t_nx, BLOCK_L, rows + l - 1, L1_X)
        if HAS_Z:
            prefetch_run(z_ptr, rows + t_nx, BLOCK_L, rows + l - 1, L1_X)
        ns = tl.minimum(ncols, N - 1)[:, None]  # (NP, 1) a row per state
        if VAR_B:
            prefetch_run(Bv_ptr, ns * stride_Bn + t_nx, BLOCK_L, ns * stride_Bn + l - 1, L1_BC)
        if VAR_C:
            prefetch_run(Cv_ptr, ns * stride_Cn + t_nx, BLOCK_L, ns * stride_Cn + l - 1, L1_BC)
    x = ld(u_ptr + offs, mask, EVEN).to(tl.float32)
    dt = ld(delta_ptr + offs, mask, EVEN).to(tl.float32)
    if HAS_BIAS:
        dt += bias_v[:, None]
    if SOFTPLUS:  # once per (d, l), shared by every state
        if FAST_SP:
            dt = softplus_fast(dt)
        else:
            dt = _softplus(dt)
    if not EVEN:
        dt = tl.where(mask, dt, 0.0)  # Δ = 0 past the end: Ā = 1, B̄x = 0, the state holds
    dtx = dt * x  # (BLOCK_D, BLOCK_L) Δ·x, shared by every state
    start = seq_start(seq_ptr + bi * l, t, l, HAS_SEQ)[None, :]  # (1, BLOCK_L)
    y = tl.zeros_like(x)  # (BLOCK_D, BLOCK_L) y = Σ_n C_n h_n, in registers
    t1 = t0 + BLOCK_L
    store_state = (t1 % CHUNK == 0) & (t1 < l)
    if UNROLL:  # small n: unrolled, every state's carry in registers
        for n in tl.static_range(N):
            # (A as a register tile read once per program costs a layout conversion per state;
            # this load is an L1 hit, or a shared-memory read if STAGES)
            A2_n = ld(A_ptr + d_idx * N + n, d_mask, EVEN_D) * LOG2E
            h, Cn, h_out = fwd_state(n, A2_n, column(H, ncols, n), dt, dtx, start, t, l,
                                     d_idx, d_mask, cols, B_ptr, Bv_ptr, C_ptr, Cv_ptr,
                                     stride_Bn, stride_Cn, N, BLOCK_L, VAR_B, VAR_C, HAS_SEQ,
                                     EVEN_L, EVEN_D)
            H = put_column(H, ncols, n, h_out)
            y += h * Cn
        if store_state:  # h before the next chunk, for the backward: one tile store (a store
            # per state inside the loop costs 2 BAR.SYNC per state and layout conversions)
            tl.store(states_ptr + st_row[:, None] + (t1 // CHUNK) * N + ncols[None, :], H,
                     mask=d_mask[:, None] & (ncols[None, :] < N))
    else:  # large n: a run-time loop (compile time), the carry kept in `last` (L1/L2)
        # state n + 1's loads are issued before state n's scan (without, the loop waits on
        # them; the last turn reloads N − 1)
        A2_n, h_in, Bn, Cn = _fwd_loads(0, A_ptr, last_ptr, bd_row, t, l, d_idx, d_mask, B_ptr,
                                        Bv_ptr, C_ptr, Cv_ptr, stride_Bn, stride_Cn, N, VAR_B,
                                        VAR_C, EVEN_L, EVEN_D)
        for n in tl.range(N, loop_unroll_factor=STATE_UNROLL):
            A2_nx, h_nx, B_nx, C_nx = _fwd_loads(tl.minimum(n + 1, N - 1), A_ptr, last_ptr,
                                                 bd_row, t, l, d_idx, d_mask, B_ptr, Bv_ptr,
                                                 C_ptr, Cv_ptr, stride_Bn, stride_Cn, N, VAR_B,
                                                 VAR_C, EVEN_L, EVEN_D)
            h, h_out = fwd_scan(A2_n, h_in, Bn, dt, dtx, start, cols, BLOCK_L, HAS_SEQ)
            tl.store(last_ptr + bd_row * N + n, h_out, mask=d_mask)
            if store_state:
                tl.store(states_ptr + st_row + (t1 // CHUNK) * N + n, h_out, mask=d_mask)
            y += h * Cn
            A2_n, h_in, Bn, Cn = A2_nx, h_nx, B_nx, C_nx
        tl.debug_barrier()  # the next block reads carries other threads may have written
    if HAS_D:
        y += x * D_v[:, None]
    if HAS_Z:
        zz = ld(z_ptr + offs, mask, EVEN).to(tl.float32)
        y *= zz * tl.sigmoid(zz)
    if EVEN:
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty))
    else:
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
    return H


@triton.jit
def _fwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr,  # inputs: u, delta (b, d, l); A (d, n); B, C
    D_ptr, z_ptr, bias_ptr, seq_ptr,  # optional inputs (unread where absent)
    out_ptr, states_ptr,  # outputs: out (b, d, l); states (b, d, c, n) fp32
    last_ptr,  # (S, b, d, n) fp32: in, the state entering each segment; out, the one leaving
               # it (h_{l−1} in the last); the run-time state loop keeps its carries there
    l, d, dpg, g,  # length, channels, channels per group, groups
    seg_len, bdn,  # steps a segment (a multiple of CHUNK; l if one), b·d·n (a slot of last)
    stride_Bb, stride_Bg, stride_Bn,  # B: (b, g, n, l) or fixed (d, n); 0 if absent
    stride_Cb, stride_Cg, stride_Cn,  # C: likewise
    N: tl.constexpr, NP: tl.constexpr,  # states, and n padded to a power of two
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,  # the tile: channels × steps
    CHUNK: tl.constexpr,  # steps between stored states (a multiple of BLOCK_L)
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
    HAS_H0: tl.constexpr,  # unrolled: start from the state in `last`, not from zeros
    UNROLL: tl.constexpr,  # states unrolled (carries in registers) or a run-time loop
    EVEN_L: tl.constexpr, EVEN_D: tl.constexpr,  # the tile divides l / dpg: no masks there
    STATE_UNROLL: tl.constexpr,  # run-time state loop: states per turn
    STAGES: tl.constexpr,  # > 0: a `for` over the time blocks whose loads Triton pipelines
                           # (STAGES deep, cp.async); 0: a `while` (the interpreter's path)
    L1_X: tl.constexpr, L1_BC: tl.constexpr,  # > 0: at each block's top the next block's
    # u, Δ, z rows and B, C rows are asked into L1 (`tile.prefetch_run`, that many sectors a row)
    FAST_SP: tl.constexpr,  # softplus from MUFU's ex2 and lg2 (`tile.softplus_fast`)
):
    pid_bg, pid_d, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bi, gi = pid_bg // g, pid_bg % g  # batch row, group of B/C
    t_lo = pid_s * seg_len  # this program's segment of the sequence: steps t_lo … t_hi − 1
    t_hi = tl.minimum(t_lo + seg_len, l)
    last_ptr += pid_s.to(tl.int64) * bdn  # its slot of `last`
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
    if HAS_H0:
        H = tl.load(last_ptr + bd_row[:, None] * N + ncols[None, :], mask=n_mask, other=0.0)
    bias_v = tl.zeros((BLOCK_D,), dtype=tl.float32)  # (BLOCK_D,) read once per program
    if HAS_BIAS:
        bias_v = ld(bias_ptr + d_idx, d_mask, EVEN_D)
    D_v = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_D:
        D_v = ld(D_ptr + d_idx, d_mask, EVEN_D)
    Bv_ptr = B_ptr + bi * stride_Bb + gi * stride_Bg  # this program's (n, l) slice of B
    Cv_ptr = C_ptr + bi * stride_Cb + gi * stride_Cg
    if STAGES > 0:  # compiled: Triton's pipeliner issues block i + 1's loads during block i
        for t0 in tl.range(t_lo, t_hi, BLOCK_L, num_stages=STAGES):
            H = _fwd_block(t0, H, bias_v, D_v, u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, z_ptr,
                           seq_ptr, out_ptr, states_ptr, last_ptr, Bv_ptr, Cv_ptr, l, bi, d_idx,
                           d_mask, bd_row, row, st_row, cols, ncols, stride_Bn, stride_Cn, N,
                           BLOCK_L, CHUNK, HAS_D, HAS_Z, HAS_BIAS,
                           SOFTPLUS, VAR_B, VAR_C, HAS_SEQ, UNROLL, EVEN_L, EVEN_D, STATE_UNROLL,
                           L1_X, L1_BC, FAST_SP)
    else:
        # (`while`, not `for t0 in range(0, l, BLOCK_L)`: Triton 3.6's interpreter cannot take
        # a runtime `range` bound with NumPy ≥ 2.4, triton-lang/triton#9171; see triton/scan.py.
        # Compiled, a `while` is never software-pipelined: every block waits for its loads.)
        t0 = t_lo
        while t0 < t_hi:
            t0 = tl.multiple_of(t0, BLOCK_L)  # a `while` hides that from the compiler
            H = _fwd_block(t0, H, bias_v, D_v, u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, z_ptr,
                           seq_ptr, out_ptr, states_ptr, last_ptr, Bv_ptr, Cv_ptr, l, bi, d_idx,
                           d_mask, bd_row, row, st_row, cols, ncols, stride_Bn, stride_Cn, N,
                           BLOCK_L, CHUNK, HAS_D, HAS_Z, HAS_BIAS,
                           SOFTPLUS, VAR_B, VAR_C, HAS_SEQ, UNROLL, EVEN_L, EVEN_D, STATE_UNROLL,
                           L1_X, L1_BC, FAST_SP)
            t0 += BLOCK_L
    if UNROLL:
        tl.store(last_ptr + bd_row[:, None] * N + ncols[None, :], H, mask=n_mask)


def forward(u, delta, A, B, C, D, z, delta_bias, flags, seq_idx, starts, seg_len, shape,
            config):
    """Launch the forward over S = len(starts) segments of ``seg_len`` steps, each from its
    entering state in ``starts`` (S, b, d, n) fp32 (`segments.forward_starts`; None: one
    segment from h = 0). Returns out (b, d, l), states (b, d, c, n) fp32, last (b, d, n)
    fp32."""
    b, d, l, n, g = shape
    fc, q, interp = config.forward, config.chunk, device.interpreted()
    u, delta, A = u.contiguous(), delta.contiguous(), A.contiguous()
    z = z.contiguous() if z is not None else None
    Bk, Ck = bc_layout(B, upcast=True), bc_layout(C, upcast=True)  # fp32 (b, g, n, l) or (d, n)
    sB, sC = bc_strides(Bk), bc_strides(Ck)
    out = torch.empty_like(u)
    states = torch.empty((b, d, triton.cdiv(l, q), n), device=u.device, dtype=torch.float32)
    # `last`: the state entering each segment, then the one leaving it (the run-time state loop
    # carries each state in it, so it starts as zeros when nothing is given)
    last = starts if starts is not None else \
        torch.zeros((1, b, d, n), device=u.device, dtype=torch.float32)
    states[:, :, 0] = last[0]  # h_{−1}; the kernel writes every later chunk's
    even_l, even_d = cfgs.even_flags(fc.even, l, d // g, fc.block_l, fc.block_d)
    _fwd_kernel[(b * g, triton.cdiv(d // g, fc.block_d), last.shape[0])](
        u, delta, A, Bk, Ck,  # inputs
        D if D is not None else A,  # optional inputs: A stands in for absent ones (unread)
        z if z is not None else A,
        delta_bias if delta_bias is not None else A,
        seq_idx if seq_idx is not None else A,
        out, states,  # outputs
        last,  # the state entering each segment in, the one leaving it out
        l, d, d // g, g,  # length, channels, channels per group, groups
        seg_len, b * d * n,  # steps a segment, a slot of `last`
        sB.b, sB.g, sB.n,  # strides of B (zeros if fixed (d, n): contiguous)
        sC.b, sC.g, sC.n,  # strides of C
        N=n, NP=triton.next_power_of_2(n), BLOCK_D=fc.block_d, BLOCK_L=fc.block_l, CHUNK=q,
        **flags,  # HAS_D … HAS_SEQ, resolved once (``args.flags``)
        HAS_H0=starts is not None, UNROLL=fc.unroll, EVEN_L=even_l, EVEN_D=even_d,
        STATE_UNROLL=fc.state_unroll, STAGES=cfgs.stages(fc.stages, interp),
        L1_X=l1_sectors(fc.block_l, 8 * u.element_size()) if fc.l1_prefetch else 0,
        L1_BC=l1_sectors(fc.block_l) if fc.l1_prefetch else 0, FAST_SP=fc.fast_softplus,
        num_warps=fc.num_warps, **cfgs.compile_options(fc.maxnreg, interp))
    return out, states, last[-1]
