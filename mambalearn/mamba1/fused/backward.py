"""The sub-block backward kernel of the tuned Mamba-1 selective scan (chapter 09), and its
launcher (formulas: ``gradients``).

Shapes: as the forward (``forward``), plus dout (b, d, l), the buffers of `GradBuffers`, and a
scratch (b, d, chunk / BLOCK_L, n) fp32: the state entering each sub-block of the current chunk.

The kernel walks the chunks backwards. Per chunk it replays the forward from the stored chunk
state (pass 1, keeping the state entering each sub-block of BLOCK_L steps in the scratch),
then per sub-block (backwards) and state it recomputes h (forward scan), runs the reverse scan of
the adjoint g (the gate shifted by one: Ā_{t+1} is recomputed from Δ_{t+1}), and forms every
gradient from g and h, using Ā_t h_{t−1} = h_t − B̄_t x_t so no shifted h is needed. dB/dC are
summed over the channel tile before the atomic add (one add per program, not per channel);
with DET (the deterministic mode) they are stored in this program's slot of a chunk instead and
added in tile order once the chunk is done (``deterministic``, `gradients.GradBuffers`).

It runs in the interpreter (the CPU default), for n > the chunk (where the state-outer kernel
cannot hold its row sums) and for the "sub-block" variants.
"""

import torch
import triton
import triton.language as tl

from mambalearn import device
from mambalearn.mamba1 import config as cfgs
from mambalearn.mamba1.args import bc_strides
from mambalearn.mamba1.fused.forward import fwd_state as _fwd_state_fast
from mambalearn.mamba1.fused.gradients import bwd_outputs
from mambalearn.mamba1.fused.tile import (
    column,
    floor_A,
    ld,
    load_bc,
    load_delta,
    put_column,
    reverse_scan,
    seq_start,
    st,
)
from mambalearn.triton.common import LOG2E
from mambalearn.triton.deterministic import slot_of_grouped, tree_sum_grouped
from mambalearn.triton.scan import combine_fn  # the ⊗ of chapter 03, jitted in chapter 08


# ---------------------------------------------------------------------------------------------
# The forward replay of one state.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _fwd_state(n, h_in, dt, dtx, start, t, l, d_idx, d_mask, cols, A_ptr, B_ptr, Bv_ptr, C_ptr,
               Cv_ptr, stride_Bn, stride_Cn, N: tl.constexpr,
               BLOCK_L: tl.constexpr, VAR_B: tl.constexpr, VAR_C: tl.constexpr,
               HAS_SEQ: tl.constexpr, EVEN_L: tl.constexpr, EVEN_D: tl.constexpr):
    """One state n over one block: returns (C_n·h, h at the block's last step). The forward's
    `fwd_state` with A[:, n] loaded here (the backward's replay)."""
    A2_n = ld(A_ptr + d_idx * N + n, d_mask, EVEN_D) * LOG2E  # (BLOCK_D,)
    h, Cn, h_last = _fwd_state_fast(n, A2_n, h_in, dt, dtx, start, t, l, d_idx, d_mask, cols,
                                    B_ptr, Bv_ptr, C_ptr, Cv_ptr, stride_Bn, stride_Cn, N,
                                    BLOCK_L, VAR_B, VAR_C, HAS_SEQ, EVEN_L, EVEN_D)
    return h * Cn, h_last


# ---------------------------------------------------------------------------------------------
# One state of one sub-block, backwards; the two passes of the run-time state loop; the kernel.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _bwd_state(n, h_in, g_in, x, dt, dtx, dt_nx, dy, start, start_nx, t, t_ok, l, d_idx, d_mask,
               cols, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, dBv_ptr, dCv_ptr,
               stride_Bn, stride_Cn, stride_dBn, stride_dCn,
               N: tl.constexpr, BLOCK_L: tl.constexpr, VAR_B: tl.constexpr, VAR_C: tl.constexpr,
               HAS_SEQ: tl.constexpr, EVEN_L: tl.constexpr, EVEN_D: tl.constexpr,
               DET: tl.constexpr):
    """One state n over one sub-block, backwards. Returns the tile terms C·h, ∂x, ∂Δ, the adjoint
    at the first step (carried to the earlier block), and the (BLOCK_D,) sums for dA, dB, dC."""
    A_n = floor_A(ld(A_ptr + d_idx * N + n, d_mask, EVEN_D))[:, None]  # (BLOCK_D, 1), floored
    a = tl.exp2(dt * (A_n * LOG2E))  # Ā_t
    a_nx = tl.exp2(dt_nx * (A_n * LOG2E))  # Ā_{t+1}
    if HAS_SEQ:
        a = tl.where(start, 0.0, a)
        a_nx = tl.where(start_nx, 0.0, a_nx)
    Bn = load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, stride_Bn, N, VAR_B, EVEN_L,
                 EVEN_D)
    Cn = load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, stride_Cn, N, VAR_C, EVEN_L,
                 EVEN_D)
    # h over the sub-block from the state replayed in step 1
    bx = dtx * Bn
    bx0 = tl.where(cols[None, :] == 0, a * h_in[:, None] + bx, bx)
    _, h = tl.associative_scan((a, bx0), 1, combine_fn)
    # the adjoint, g_t = C_t dy_t + Ā_{t+1} g_{t+1}, scanned backwards; g_in folds into the end
    beta = Cn * dy
    beta = tl.where(cols[None, :] == BLOCK_L - 1, beta + a_nx * g_in[:, None], beta)
    gg = reverse_scan(a_nx, beta)
    # gradients from g and h; Ā_t h_{t−1} = h_t − B̄_t x_t, exactly 0 where Ā_t is (tile.floor_A)
    ah = tl.where(a == 0.0, 0.0, h - bx)
    gdt = gg * dt
    dB_c = tl.sum(gdt * x, axis=1)  # (BLOCK_D,): fixed B's gradient
    dC_c = tl.sum(dy * h, axis=1)
    if VAR_B and DET:  # into this program's slot (in bounds: the chunk's columns)
        tl.store(dBv_ptr + n * stride_dBn + t, tl.sum(gdt * x, axis=0))
    elif VAR_B:  # summed over the channel tile, then one atomic add per step
        if EVEN_L:
            tl.atomic_add(dBv_ptr + n * stride_dBn + t, tl.sum(gdt * x, axis=0), sem="relaxed")
        else:
            tl.atomic_add(dBv_ptr + n * stride_dBn + t, tl.sum(gdt * x, axis=0), mask=t_ok,
                          sem="relaxed")
    if VAR_C and DET:
        tl.store(dCv_ptr + n * stride_dCn + t, tl.sum(dy * h, axis=0))
    elif VAR_C:
        if EVEN_L:
            tl.atomic_add(dCv_ptr + n * stride_dCn + t, tl.sum(dy * h, axis=0), sem="relaxed")
        else:
            tl.atomic_add(dCv_ptr + n * stride_dCn + t, tl.sum(dy * h, axis=0), mask=t_ok,
                          sem="relaxed")
    return (h * Cn, gdt * Bn, gg * (ah * A_n + x * Bn), column(gg, cols, 0),
            tl.sum(gg * ah * dt, axis=1), dB_c, dC_c)


@triton.jit
def _bwd_replay_state(n, j, nsub, c, nchunks, dt, dtx, start, t, l, bd_row, sc_row, d_idx, d_mask,
                      cols, states_ptr, scratch_ptr, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr,
                      stride_Bn, stride_Cn, N: tl.constexpr,
                      BLOCK_L: tl.constexpr, VAR_B: tl.constexpr, VAR_C: tl.constexpr,
                      HAS_SEQ: tl.constexpr, EVEN_L: tl.constexpr, EVEN_D: tl.constexpr):
    """Pass 1, run-time state loop, state n of sub-block j: keep the state entering the
    sub-block in the scratch, replay it to the sub-block's end (the next slot)."""
    # (a run-time `if`, not a mask `d_mask & (j > 0)`: a vector mask and-ed with a scalar
    # condition is an int32 array in the interpreter, which Triton ≥ 3.7 refuses as a mask)
    if j == 0:  # the chunk's first sub-block starts from the state the forward stored
        h_in = ld(states_ptr + (bd_row * nchunks + c) * N + n, d_mask, EVEN_D)
        st(scratch_ptr + sc_row + n, h_in, d_mask, EVEN_D)
    else:
        h_in = ld(scratch_ptr + sc_row + j * N + n, d_mask, EVEN_D)
    _, h_out = _fwd_state(n, h_in, dt, dtx, start, t, l, d_idx, d_mask, cols, A_ptr, B_ptr,
                          Bv_ptr, C_ptr, Cv_ptr, stride_Bn, stride_Cn, N,
                          BLOCK_L, VAR_B, VAR_C, HAS_SEQ, EVEN_L, EVEN_D)
    if j + 1 < nsub:
        st(scratch_ptr + sc_row + (j + 1) * N + n, h_out, d_mask, EVEN_D)


@triton.jit
def _bwd_grad_state(n, j, x, dt, dtx, dt_nx, dy, start, start_nx, t, t_ok, l, bd_row, sc_row,
                    d_idx, d_mask, cols, scratch_ptr, gbuf_ptr, dA_ptr, dBf_ptr, dCf_ptr,
                    A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, dBv_ptr, dCv_ptr,
                    stride_Bn, stride_Cn, stride_dBn, stride_dCn,
                    N: tl.constexpr, BLOCK_L: tl.constexpr, VAR_B: tl.constexpr,
                    VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr, EVEN_L: tl.constexpr,
                    EVEN_D: tl.constexpr, DET: tl.constexpr):
    """Pass 2, run-time state loop, state n of sub-block j: carries (g, row sums of dA and of
    fixed dB/dC) in memory. Returns the tile terms C·h, ∂x, ∂Δ."""
    h_in = ld(scratch_ptr + sc_row + j * N + n, d_mask, EVEN_D)
    g_in = ld(gbuf_ptr + bd_row * N + n, d_mask, EVEN_D)
    yc, dxc, ddtc, g_out, dA_c, dB_c, dC_c = _bwd_state(
        n, h_in, g_in, x, dt, dtx, dt_nx, dy, start, start_nx,
        t, t_ok, l, d_idx, d_mask, cols, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr,
        dBv_ptr, dCv_ptr, stride_Bn, stride_Cn, stride_dBn, stride_dCn, N,
        BLOCK_L, VAR_B, VAR_C, HAS_SEQ, EVEN_L, EVEN_D, DET)
    st(gbuf_ptr + bd_row * N + n, g_out, d_mask, EVEN_D)
    p = bd_row * N + n  # (BLOCK_D,) this row's partial sums
    st(dA_ptr + p, ld(dA_ptr + p, d_mask, EVEN_D) + dA_c, d_mask, EVEN_D)
    if not VAR_B:
        st(dBf_ptr + p, ld(dBf_ptr + p, d_mask, EVEN_D) + dB_c, d_mask, EVEN_D)
    if not VAR_C:
        st(dCf_ptr + p, ld(dCf_ptr + p, d_mask, EVEN_D) + dC_c, d_mask, EVEN_D)
    return yc, dxc, ddtc


@triton.jit
def _bwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, seq_ptr, dout_ptr, states_ptr,
    scratch_ptr,  # (b, d, SCR, n) fp32: the state entering each sub-block of the current chunk
    gbuf_ptr,  # (b, d, n) fp32: the adjoint carry (starts as the last state's gradient)
    du_ptr, ddelta_ptr, dz_ptr,  # (b, d, l) gradients
    dB_ptr, dC_ptr,  # (b, g, n, l) fp32 zeroed, if B / C vary with time (atomic adds)
    slots_ptr, counts_ptr,  # DET: the `TreeSum` of time-varying dB/dC, in place of the atomics
    dA_ptr, dBf_ptr, dCf_ptr, dD_ptr, dbias_ptr,  # fp32 sums per batch row: (b,d,n) ×3, (b,d) ×2
    l, d, dpg, g,  # length, channels, channels per group, groups
    groups, slot_rows,  # DET: b·g·chunks, the tree sums' groups; the tree's slots a group
    B_strides,  # (b, g, n) of B (b, g, n, l); zeros if fixed (d, n)
    C_strides,  # C's, likewise
    dB_strides, dC_strides,  # (b, g, n) of the time-varying dB and dC buffers
    N: tl.constexpr, NP: tl.constexpr,  # states, and n padded to a power of two
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,  # tile: channels × steps of one sub-block
    CHUNK: tl.constexpr, SCR: tl.constexpr,  # steps between stored states; scratch slots
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
    UNROLL: tl.constexpr,  # states unrolled (carries in registers) or a run-time loop
    EVEN_L: tl.constexpr, EVEN_D: tl.constexpr,  # the tile divides l / dpg: no masks there
    STAGES: tl.constexpr,  # > 0: the run-time state loop is a `tl.range` Triton pipelines
                           # (the next state's loads issued during this one); 0: `range`
    DET: tl.constexpr,  # time-varying dB/dC through the fixed-order tree sum, not atomics
    SLOT: tl.constexpr, FAN: tl.constexpr, TREE_BLOCK: tl.constexpr,  # its slot, fan-in, tile
    AFTER: tl.constexpr,  # DET: no tree here, a second kernel adds the slots (`TreeSum.after`)
):
    EVEN: tl.constexpr = EVEN_L and EVEN_D
    stride_Bb, stride_Bg, stride_Bn = B_strides
    stride_Cb, stride_Cg, stride_Cn = C_strides
    stride_dBb, stride_dBg, stride_dBn = dB_strides
    stride_dCb, stride_dCg, stride_dCn = dC_strides
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
        Dv = ld(D_ptr + d_idx, d_mask, EVEN_D)
    G = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # adjoint g entering from the later block
    if UNROLL:  # (the run-time loop reads and writes it in gbuf)
        G = tl.load(gbuf_ptr + bd_row[:, None] * N + ncols[None, :], mask=n_mask, other=0.0)
    dA_acc = tl.zeros((BLOCK_D, NP), dtype=tl.float32)
    dB_acc = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # fixed B only
    dC_acc = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # fixed C only
    dD_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dbias_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    Bv_ptr = B_ptr + bi * stride_Bb + gi * stride_Bg
    Cv_ptr = C_ptr + bi * stride_Cb + gi * stride_Cg
    dBv_ptr = dB_ptr + bi * stride_dBb + gi * stride_dBg
    dCv_ptr = dC_ptr + bi * stride_dCb + gi * stride_dCg
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
            x = ld(u_ptr + offs, mask, EVEN).to(tl.float32)
            dt, _ = load_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS,
                               SOFTPLUS, EVEN)
            dtx = dt * x
            start = seq_start(seq_ptr + bi * l, t, l, HAS_SEQ)[None, :]
            if UNROLL:
                for n in tl.static_range(N):
                    h_in = column(H, ncols, n)
                    st(scratch_ptr + sc_row + j * N + n, h_in, d_mask, EVEN_D)
                    _, h_out = _fwd_state(n, h_in, dt, dtx, start, t, l, d_idx, d_mask, cols,
                                          A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, stride_Bn, stride_Cn,
                                          N, BLOCK_L, VAR_B, VAR_C, HAS_SEQ,
                                          EVEN_L, EVEN_D)
                    H = put_column(H, ncols, n, h_out)
            elif STAGES > 0:  # pipelined: state n + 1's loads in flight during state n
                for n in tl.range(0, N, num_stages=STAGES):
                    _bwd_replay_state(n, j, nsub, c, nchunks, dt, dtx, start, t, l, bd_row,
                                      sc_row, d_idx, d_mask, cols, states_ptr, scratch_ptr,
                                      A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, stride_Bn,
                                      stride_Cn, N, BLOCK_L, VAR_B, VAR_C,
                                      HAS_SEQ, EVEN_L, EVEN_D)
                tl.debug_barrier()
            else:
                for n in range(N):
                    _bwd_replay_state(n, j, nsub, c, nchunks, dt, dtx, start, t, l, bd_row,
                                      sc_row, d_idx, d_mask, cols, states_ptr, scratch_ptr,
                                      A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, stride_Bn,
                                      stride_Cn, N, BLOCK_L, VAR_B, VAR_C,
                                      HAS_SEQ, EVEN_L, EVEN_D)
                tl.debug_barrier()
            j += 1
        tl.debug_barrier()  # scratch written above is read below, possibly by other threads
        dBv_c, dCv_c, sdBn, sdCn = dBv_ptr, dCv_ptr, stride_dBn, stride_dCn
        if DET:  # this program's slot for (its batch row and group, chunk c): rows n, columns t
            grp = pid_bg * nchunks + c
            slot = slot_of_grouped(slots_ptr, pid_d, grp, slot_rows, SLOT) - c * CHUNK
            dBv_c, dCv_c, sdBn, sdCn = slot, slot + VAR_B * N * CHUNK, CHUNK, CHUNK
        # 2. sub-blocks backwards: recompute h, reverse-scan g, form the gradients
        j = nsub - 1
        while j >= 0:
            t = c * CHUNK + j * BLOCK_L + cols  # (BLOCK_L,)
            t_ok = t < l
            mask = d_mask[:, None] & t_ok[None, :]
            offs = row[:, None] + t[None, :]
            x = ld(u_ptr + offs, mask, EVEN).to(tl.float32)
            dt, dt_raw = load_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS,
                                    SOFTPLUS, EVEN)
            # Δ_{t+1}: the reverse scan's gate is Ā_{t+1}
            nxt_mask = d_mask[:, None] & (t + 1 < l)[None, :]
            dt_nx, _ = load_delta(delta_ptr, bias_ptr, offs + 1, nxt_mask, d_idx, d_mask,
                                  HAS_BIAS, SOFTPLUS, False)
            start = seq_start(seq_ptr + bi * l, t, l, HAS_SEQ)[None, :]
            start_nx = seq_start(seq_ptr + bi * l, t + 1, l, HAS_SEQ)[None, :]
            dout = ld(dout_ptr + offs, mask, EVEN).to(tl.float32)
            dy, zz = dout, dout
            if HAS_Z:
                zz = ld(z_ptr + offs, mask, EVEN).to(tl.float32)
                dy = dout * zz * tl.sigmoid(zz)  # ∂out/∂y = silu(z)
            dtx = dt * x
            y = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
            dx = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
            ddt = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
            if UNROLL:
                for n in tl.static_range(N):
                    h_in = ld(scratch_ptr + sc_row + j * N + n, d_mask, EVEN_D)
                    yc, dxc, ddtc, g_out, dA_c, dB_c, dC_c = _bwd_state(
                        n, h_in, column(G, ncols, n), x, dt, dtx, dt_nx, dy, start, start_nx,
                        t, t_ok, l, d_idx, d_mask, cols, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr,
                        dBv_c, dCv_c, stride_Bn, stride_Cn,
                        sdBn, sdCn, N, BLOCK_L, VAR_B, VAR_C, HAS_SEQ, EVEN_L,
                        EVEN_D, DET)
                    G = put_column(G, ncols, n, g_out)
                    dA_acc = put_column(dA_acc, ncols, n, column(dA_acc, ncols, n) + dA_c)
                    if not VAR_B:
                        dB_acc = put_column(dB_acc, ncols, n, column(dB_acc, ncols, n) + dB_c)
                    if not VAR_C:
                        dC_acc = put_column(dC_acc, ncols, n, column(dC_acc, ncols, n) + dC_c)
                    y += yc
                    dx += dxc
                    ddt += ddtc
            elif STAGES > 0:  # pipelined: state n + 1's loads in flight during state n
                for n in tl.range(0, N, num_stages=STAGES):
                    yc, dxc, ddtc = _bwd_grad_state(
                        n, j, x, dt, dtx, dt_nx, dy, start, start_nx, t, t_ok, l, bd_row, sc_row,
                        d_idx, d_mask, cols, scratch_ptr, gbuf_ptr, dA_ptr, dBf_ptr, dCf_ptr,
                        A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, dBv_c, dCv_c, stride_Bn,
                        stride_Cn, sdBn, sdCn, N, BLOCK_L,
                        VAR_B, VAR_C, HAS_SEQ, EVEN_L, EVEN_D, DET)
                    y += yc
                    dx += dxc
                    ddt += ddtc
                tl.debug_barrier()
            else:
                for n in range(N):
                    yc, dxc, ddtc = _bwd_grad_state(
                        n, j, x, dt, dtx, dt_nx, dy, start, start_nx, t, t_ok, l, bd_row, sc_row,
                        d_idx, d_mask, cols, scratch_ptr, gbuf_ptr, dA_ptr, dBf_ptr, dCf_ptr,
                        A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, dBv_c, dCv_c, stride_Bn,
                        stride_Cn, sdBn, sdCn, N, BLOCK_L,
                        VAR_B, VAR_C, HAS_SEQ, EVEN_L, EVEN_D, DET)
                    y += yc
                    dx += dxc
                    ddt += ddtc
                tl.debug_barrier()
            # 3. the per-step parts: D skip, gate, softplus
            dD_acc, dbias_acc = bwd_outputs(y, dx, ddt, x, dy, dout, zz, dt_raw, Dv, dD_acc,
                                             dbias_acc, offs, mask, du_ptr, ddelta_ptr, dz_ptr,
                                             HAS_D, HAS_Z, SOFTPLUS, EVEN)
            j -= 1
        if DET and not AFTER:  # the chunk's dB/dC rows of every channel tile, added in tile order
            tree_sum_grouped(slots_ptr, counts_ptr, pid_d, tl.num_programs(1), grp, groups,
                             slot_rows, SLOT, FAN, TREE_BLOCK)
        tl.debug_barrier()  # the next chunk's step 1 overwrites the scratch
        c -= 1
    # 4. this program's sums over its batch row (the launcher adds the rows: no atomics)
    if UNROLL:
        pn = bd_row[:, None] * N + ncols[None, :]
        tl.store(gbuf_ptr + pn, G, mask=n_mask)  # g_0, for the initial state's gradient
        tl.store(dA_ptr + pn, dA_acc, mask=n_mask)
        if not VAR_B:
            tl.store(dBf_ptr + pn, dB_acc, mask=n_mask)
        if not VAR_C:
            tl.store(dCf_ptr + pn, dC_acc, mask=n_mask)
    tl.store(dD_ptr + bd_row, dD_acc, mask=d_mask)
    tl.store(dbias_ptr + bd_row, dbias_acc, mask=d_mask)


def launch(dout, u, delta, A, Bk, Ck, D, z, delta_bias, flags, seq_idx, states, bufs,
           shape, config, B, C, plan=None):
    """Launch the sub-block backward into ``bufs`` (`GradBuffers` with one segment: this kernel
    walks the whole sequence, ``plan`` is not used); Bk, Ck: kernel layouts."""
    if bufs.gbuf.shape[0] != 1:
        raise ValueError("the sub-block backward runs one segment (its sequence is not cut)")
    b, d, l, n, g = shape
    bc, interp = config.backward, device.interpreted()
    tree = bufs.tree
    scr = config.chunk // bc.block_l  # sub-blocks in a chunk
    scratch = torch.empty((b, d, scr, n), device=u.device, dtype=torch.float32)
    even_l, even_d = cfgs.even_flags(bc.even, l, d // g, bc.block_l, bc.block_d)
    sB, sC = bc_strides(Bk), bc_strides(Ck)
    sdB, sdC = bufs.strides(bufs.dB, Bk.ndim == 4), bufs.strides(bufs.dC, Ck.ndim == 4)
    _bwd_kernel[(b * g, triton.cdiv(d // g, bc.block_d))](
        u, delta, A, Bk, Ck,  # inputs
        D if D is not None else A,  # optional inputs: A stands in for absent ones (unread)
        z if z is not None else A,
        delta_bias if delta_bias is not None else A,
        seq_idx if seq_idx is not None else A,
        dout, states, scratch, bufs.gbuf,  # upstream gradient, stored states, scratch, carry
        bufs.du, bufs.ddelta, bufs.dz if z is not None else A,  # (b, d, l) gradients
        bufs.dB, bufs.dC,  # time-varying dB / dC (atomic adds)
        *(tree.slots, tree.counts) if tree is not None else (A, A),  # deterministic: the tree
        bufs.dA_rows, bufs.dBf_rows, bufs.dCf_rows, bufs.dD_rows, bufs.dbias_rows,  # row sums
        l, d, d // g, g,  # length, channels, channels per group, groups
        *(tree.groups, tree.rows) if tree is not None else (1, 1),  # its groups (b·g·chunks),
        # slots a group
        tuple(sB), tuple(sC),  # strides (b, g, n) of B and C (zeros if fixed (d, n))
        tuple(sdB), tuple(sdC),  # strides of the dB and dC buffers
        N=n, NP=triton.next_power_of_2(n), BLOCK_D=bc.block_d, BLOCK_L=bc.block_l,
        CHUNK=config.chunk, SCR=scr,
        **flags,  # HAS_D … HAS_SEQ, resolved once (``args.flags``)
        UNROLL=bc.unroll, EVEN_L=even_l, EVEN_D=even_d, STAGES=cfgs.stages(bc.stages, interp),
        **bufs.tree_constexprs(bc.num_warps, bc.tree_block),  # DET, SLOT, FAN, TREE_BLOCK, AFTER
        num_warps=bc.num_warps, **cfgs.compile_options(bc.maxnreg, interp))
