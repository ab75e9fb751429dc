"""The run-time-loop backward kernel of the tuned Mamba-1 selective scan (chapter 09).

    g_t = C_t dy_t + Ā_{t+1} g_{t+1}        (the adjoint of h, scanned backwards)
    dB_t = Σ_d g Δ x   dC_t = Σ_d dy h   dx = Σ_n g Δ B + D dy   dA = Σ_t g (h − B̄x) Δ
    dΔ   = Σ_n g ((h − B̄x) A + B x)      dz = dout · y · silu′(z)   dD = Σ dy x

Shapes: as the forward (``selective_scan_forward``), plus dout (b, d, l) and the gradients in the
shapes of the arguments; the per-row sums dA, fixed dB/dC (b, d, n) and dD, dbias (b, d) are fp32
and added over b by the launcher.

The kernel walks the chunks backwards. Per chunk it replays the forward from the stored chunk
state (pass 1, keeping the state entering each sub-block of BLOCK_L steps in a small scratch),
then per sub-block (backwards) and state it recomputes h (forward scan), runs the reverse scan of
the adjoint g (the gate shifted by one: Ā_{t+1} is recomputed from Δ_{t+1}), and forms every
gradient from g and h, using Ā_t h_{t−1} = h_t − B̄_t x_t so no shifted h is needed. dB/dC are
summed over the channel tile before the atomic add (one add per program, not per channel).

This kernel runs in the interpreter (CPU_BWD), for n > 16 (DEFAULT_BWD_LARGE_N) and for the
BWD_VARIANTS without LAYOUT; on the GPU at n ≤ 16 the default (DEFAULT_BWD, since 2026-11-30) is
the state-outer kernel of ``selective_scan_backward_state_outer``, which reuses `_reverse_scan`
and `_bwd_delta` from here. The launcher (`_backward`) lives in `mambalearn.triton.selective_scan`.
"""

import triton
import triton.language as tl

from mambalearn.triton.scan import combine_fn  # the ⊗ of chapter 03, jitted in chapter 08
from mambalearn.triton.selective_scan.forward import LOG2E, _fwd_state_fast, _ld, _load_bc, _st
from mambalearn.triton.selective_scan.tile import column as _column
from mambalearn.triton.selective_scan.tile import load_delta as _load_delta
from mambalearn.triton.selective_scan.tile import put_column as _put_column
from mambalearn.triton.selective_scan.tile import seq_start as _is_start
from mambalearn.triton.selective_scan.tile import softplus as _softplus


# ---------------------------------------------------------------------------------------------
# Helpers: the reverse scan (both backward kernels) and the forward replay of one state.
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
def _fwd_state(n, h_in, dt, dtx, start, t, l, d_idx, d_mask, cols, A_ptr, B_ptr, Bv_ptr, C_ptr,
               Cv_ptr, sB0, sB1, sB2, sC0, sC1, sC2, N: tl.constexpr, BLOCK_L: tl.constexpr,
               VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
               EVEN_L: tl.constexpr, EVEN_D: tl.constexpr):
    """One state n over one block: returns (C_n·h, h at the block's last step). The forward's
    `_fwd_state_fast` with A[:, n] loaded here (the backward's replay)."""
    A2_n = _ld(A_ptr + d_idx * N + n, d_mask, EVEN_D) * LOG2E  # (BLOCK_D,)
    h, Cn, h_last = _fwd_state_fast(n, A2_n, h_in, dt, dtx, start, t, l, d_idx, d_mask, cols,
                                    B_ptr, Bv_ptr, C_ptr, Cv_ptr, sB0, sB1, sB2, sC0, sC1, sC2,
                                    BLOCK_L, VAR_B, VAR_C, HAS_SEQ, EVEN_L, EVEN_D)
    return h * Cn, h_last


# ---------------------------------------------------------------------------------------------
# One state of one sub-block, backwards; the two passes of the run-time state loop; the kernel.
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
    # (a run-time `if`, not a mask `d_mask & (j > 0)`: a vector mask and-ed with a scalar
    # condition is an int32 array in the interpreter, which Triton ≥ 3.7 refuses as a mask)
    if j == 0:  # the chunk's first sub-block starts from the state the forward stored
        h_in = _ld(states_ptr + (bd_row * nchunks + c) * N + n, d_mask, EVEN_D)
        _st(scratch_ptr + sc_row + n, h_in, d_mask, EVEN_D)
    else:
        h_in = _ld(scratch_ptr + sc_row + j * N + n, d_mask, EVEN_D)
    _, h_out = _fwd_state(n, h_in, dt, dtx, start, t, l, d_idx, d_mask, cols, A_ptr, B_ptr,
                          Bv_ptr, C_ptr, Cv_ptr, sB0, sB1, sB2, sC0, sC1, sC2, N, BLOCK_L,
                          VAR_B, VAR_C, HAS_SEQ, EVEN_L, EVEN_D)
    if j + 1 < nsub:
        _st(scratch_ptr + sc_row + (j + 1) * N + n, h_out, d_mask, EVEN_D)


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
def _bwd_outputs(y, dx, ddt, x, dy, dout, zz, dt_raw, Dv, dD_acc, dbias_acc, offs, mask, du_ptr,
                 ddelta_ptr, dz_ptr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
                 SOFTPLUS: tl.constexpr, EVEN: tl.constexpr):
    """The per-step parts of both backward kernels, after the sums over states y = Σ C h,
    dx = Σ gΔB, ddt = Σ ∂/∂Δ: the D skip, the gate (dz), softplus′; stores du, dΔ, dz.
    Returns the updated row sums (dD_acc, dbias_acc)."""
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
    return dD_acc, dbias_acc


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
            dy, zz = dout, dout
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
            dD_acc, dbias_acc = _bwd_outputs(y, dx, ddt, x, dy, dout, zz, dt_raw, Dv, dD_acc,
                                             dbias_acc, offs, mask, du_ptr, ddelta_ptr, dz_ptr,
                                             HAS_D, HAS_Z, SOFTPLUS, EVEN)
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
