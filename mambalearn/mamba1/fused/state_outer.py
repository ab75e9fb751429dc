"""The state-outer backward kernel of the tuned Mamba-1 selective scan (chapter 09), and its
launcher: the GPU default up to n = the chunk (formulas: ``gradients``).

One tile is a whole chunk (BLOCK_L = CHUNK), so the state entering it is the one the forward
stored: no replay pass, no scratch. The loop over the n states runs inside the chunk, once per
chunk and state: its loads (A_n, the stored h_n, the adjoint g_n the later chunk left in gbuf,
B_n, C_n) depend on no earlier state and are issued one state ahead; the row sums of dA (and of
fixed dB/dC) sit in column n of a (BLOCK_D, BLOCK_L) register tile (so n ≤ CHUNK). No state
iteration waits for a load-add-store of its own.

The adjoint carried from one chunk to the earlier one goes through gbuf, a (BLOCK_D,) load and
store per state; with REG_CARRY (``Backward.reg_carry``) it stays in a (BLOCK_D, BLOCK_L) register
tile instead, column n = state n (n ≤ CHUNK, as the row sums), and gbuf is read once before the
chunk loop and written once after it. In a one-warp program the two cost the same; once a tile's
channels span warps the store's (BLOCK_D,) layout is not the tile's, and each state paid a
shared-memory round trip with two barriers for it (``fused.gradients``).

Shapes: as the forward (``forward``), plus dout (b, d, l) and the buffers of `GradBuffers`;
gbuf (b, d, n) fp32 carries the adjoint between chunks (it starts as the last state's gradient).
"""

import torch
import triton
import triton.language as tl

from mambalearn import device
from mambalearn.mamba1 import config as cfgs
from mambalearn.mamba1.args import bc_strides
from mambalearn.mamba1.fused.gradients import bwd_outputs
from mambalearn.mamba1.fused.tile import (
    column,
    floor_A,
    fold_adjoints,
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


@triton.jit
def _so_state(h_in, g_in, A_n, B_n, C_n, C_r, dt, dtx, dt_nx, dy, dy_r, start, start_nx, cols,
              BLOCK_L: tl.constexpr, HAS_SEQ: tl.constexpr, REV_LOADS: tl.constexpr):
    """State n over one chunk: h (forward scan from the stored state h_in), the adjoint
    g_t = C_t dy_t + Ā_{t+1} g_{t+1} (reverse scan from the later chunk's g_in), and
    Ā_t h_{t−1} = h_t − B̄_t x_t. Each (BLOCK_D, BLOCK_L) in time order.

    REV_LOADS: dt_nx, dy_r, C_r come in reversed time order (column k = step BLOCK_L − 1 − k),
    so the reverse scan is a forward one and only g is flipped back: one flip instead of the
    three of `reverse_scan` (a flip across the lanes that hold the time axis costs a shuffle
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
        gg = reverse_scan(a_nx, beta)
    return h, gg, tl.where(a == 0.0, 0.0, h - bx)  # (tile.floor_A: exact where Ā_t = 0)


@triton.jit
def _so_load_state(n, st_c, g_c, G, cols, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, t, t_r, l, d_idx,
                   d_mask, stride_Bn, stride_Cn, N: tl.constexpr,
                   VAR_B: tl.constexpr, VAR_C: tl.constexpr, EVEN_L: tl.constexpr,
                   EVEN_D: tl.constexpr, REV_LOADS: tl.constexpr, REG_CARRY: tl.constexpr):
    """What state n reads in one chunk: A[:, n], the stored state entering the chunk, the
    adjoint leaving the later chunk (REG_CARRY: column n of the register tile G), B_n, C_n (and
    C_n reversed). Nothing here depends on an earlier state of this chunk, so the loop issues it
    one state ahead."""
    A_n = floor_A(ld(A_ptr + d_idx * N + n, d_mask, EVEN_D))  # (BLOCK_D,); A = −∞: no NaN
    h_n = ld(st_c + n, d_mask, EVEN_D)  # (BLOCK_D,)
    if REG_CARRY:
        g_n = column(G, cols, n)  # (BLOCK_D,) left by the later chunk (shuffles in a warp)
    else:
        g_n = ld(g_c + n, d_mask, EVEN_D)  # (BLOCK_D,) written in the later chunk
    B_n = load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, stride_Bn, N, VAR_B, EVEN_L,
                  EVEN_D)
    C_n = load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, stride_Cn, N, VAR_C, EVEN_L,
                  EVEN_D)
    C_r = C_n
    if REV_LOADS and VAR_C:  # a (BLOCK_L,) row read backwards: one layout conversion
        C_r = load_bc(C_ptr, Cv_ptr, n, t_r, l, d_idx, d_mask, stride_Cn, N, VAR_C,
                      EVEN_L, EVEN_D)
    return A_n, h_n, g_n, B_n, C_n, C_r


@triton.jit
def _so_stage(ptr, v, ROWS: tl.constexpr, SLOT: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_L: tl.constexpr):
    """Deterministic mode, ROWS > 0: the (BLOCK_D, BLOCK_L) tile ``v`` summed over each run of
    BLOCK_D / ROWS channels (the two channels a warp holds, at ROWS = warps) and stored as ROWS
    rows, SLOT floats apart, of this program's staging (``ptr``: its row 0 at these steps). No
    value crosses a warp here: the ROWS rows are added once per chunk (`_so_stage_sum`)."""
    part = tl.sum(tl.reshape(v, (ROWS, BLOCK_D // ROWS, BLOCK_L)), axis=1)  # (ROWS, BLOCK_L)
    rows = tl.arange(0, ROWS)
    tl.store(ptr[None, :] + rows[:, None] * SLOT, part)


@triton.jit
def _so_stage_sum(stage, slot, ROWS: tl.constexpr, SLOT: tl.constexpr,
                  TREE_BLOCK: tl.constexpr):
    """The chunk's ROWS staged rows added in row order (0, 1, …: fixed) into this program's slot
    of the tree (after a barrier: the rows were stored by every warp of the program)."""
    tl.debug_barrier()
    for off in tl.static_range(0, SLOT, TREE_BLOCK):
        o = off + tl.arange(0, TREE_BLOCK)
        m = o < SLOT
        acc = tl.load(stage + o, mask=m, other=0.0)
        for r in tl.static_range(1, ROWS):  # (unrolled: the loads are in flight together)
            acc += tl.load(stage + r * SLOT + o, mask=m, other=0.0)
        tl.store(slot + o, acc, mask=m)


@triton.jit
def _so_atomic(ptr, v, t_ok, EVEN_L: tl.constexpr, DET: tl.constexpr):
    """Relaxed atomic add of a (BLOCK_L,) row (acq_rel would add a fence per add); DET: a plain
    store into this program's slot (``deterministic``: a whole chunk's row, in bounds)."""
    if DET:
        tl.store(ptr, v)
    elif EVEN_L:
        tl.atomic_add(ptr, v, sem="relaxed")
    else:
        tl.atomic_add(ptr, v, mask=t_ok, sem="relaxed")


@triton.jit
def _bwd_so_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, seq_ptr, dout_ptr,
    states_ptr,  # (b, d, c, n) fp32: the state entering each chunk (from the forward)
    gbuf_ptr,  # (S, b, d, n) fp32: the adjoint leaving the later chunk, per state and segment
               # (in: the last state's gradient in slot S − 1, the others folded here)
    G_ptr, P_ptr,  # (M, b, d, n) fp32: the adjoint summaries of the pieces after segment 0
    du_ptr, ddelta_ptr, dz_ptr,  # (b, d, l) gradients
    dB_ptr, dC_ptr,  # (b, g, n, l) fp32 zeroed, if B / C vary with time (atomic adds)
    slots_ptr, counts_ptr,  # DET: the `TreeSum` of time-varying dB/dC, in place of the atomics
    stage_ptr,  # DET and ROWS > 0: (programs, ROWS, SLOT) fp32, each program's chunk partials
    dA_ptr, dBf_ptr, dCf_ptr, dD_ptr, dbias_ptr,  # fp32 sums per segment and batch row:
                                                  # (S·b, d, n) ×3, (S·b, d) ×2
    l, d, dpg, g,  # length, channels, channels per group, groups
    seg_len, bd, pieces, M,  # steps a segment (l if one), b·d (its rows), pieces a segment,
                        # all pieces
    groups, slot_rows,  # DET: b·g·chunks, the tree sums' groups; the tree's slots a group
    B_strides,  # (b, g, n) of B (b, g, n, l); zeros if fixed (d, n)
    C_strides,  # C's, likewise
    dB_strides, dC_strides,  # (b, g, n) of the time-varying dB and dC buffers
    N: tl.constexpr,  # states, ≤ BLOCK_L (the row sums live in the columns of a tile)
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,  # tile: channels × one whole chunk
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
    EVEN_L: tl.constexpr, EVEN_D: tl.constexpr,  # the tile divides l / dpg: no masks there
    REV_LOADS: tl.constexpr,  # adjoint inputs loaded time-reversed: 1 flip, not 3
    FOLD: tl.constexpr,  # S > 1: the segments before the last fold their adjoint carry
    DET: tl.constexpr,  # time-varying dB/dC through the fixed-order tree sum, not atomics
    SLOT: tl.constexpr, FAN: tl.constexpr, TREE_BLOCK: tl.constexpr,  # its slot, fan-in, tile
    ROWS: tl.constexpr,  # DET: rows of a program's staging (0: its channel sums into its slot)
    AFTER: tl.constexpr,  # DET: no tree here, a second kernel adds the slots (`TreeSum.after`)
    REG_CARRY: tl.constexpr,  # the adjoint carry in a register tile, gbuf read/written once
):
    EVEN: tl.constexpr = EVEN_L and EVEN_D
    stride_Bb, stride_Bg, stride_Bn = B_strides
    stride_Cb, stride_Cg, stride_Cn = C_strides
    stride_dBb, stride_dBg, stride_dBn = dB_strides
    stride_dCb, stride_dCg, stride_dCn = dC_strides
    pid_bg, pid_d, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bi, gi = pid_bg // g, pid_bg % g
    c_lo = pid_s * (seg_len // BLOCK_L)  # this program's segment: chunks c_lo … c_hi
    d_loc = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d_loc < dpg
    d_idx = gi * dpg + d_loc  # (BLOCK_D,)
    cols = tl.arange(0, BLOCK_L)  # (BLOCK_L,) step in the chunk; also the state of a row sum
    bd_row = (bi * d + d_idx).to(tl.int64)  # (BLOCK_D,)
    row = bd_row * l
    nchunks = tl.cdiv(l, BLOCK_L)
    c_hi = tl.minimum(c_lo + seg_len // BLOCK_L, nchunks) - 1
    sd_row = pid_s.to(tl.int64) * bd + bd_row  # (BLOCK_D,) these rows in the segment's sums
    g_c = gbuf_ptr + sd_row * N  # (BLOCK_D,) the adjoint carries of these rows
    Dv = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_D:
        Dv = ld(D_ptr + d_idx, d_mask, EVEN_D)
    # sums over time, column n = state n: dA (and dB/dC when those are fixed (d, n))
    dA_acc = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
    dBf_acc = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)  # fixed B only
    dCf_acc = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)  # fixed C only
    dD_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dbias_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if FOLD:
        if pid_s < tl.num_programs(2) - 1:  # g at the first step after this segment: the
            # pieces after it, folded with ⊗ from the right (column n = state n)
            n_tile = d_mask[:, None] & (cols[None, :] < N)
            at = bd_row[:, None] * N + cols[None, :]
            g_in = fold_adjoints(G_ptr, P_ptr, at, n_tile, pid_s * pieces, M, bd * N)
            tl.store(g_c[:, None] + cols[None, :], g_in, mask=n_tile)
            tl.debug_barrier()  # the chunk loop reads these per state, across threads
    n_mask = d_mask[:, None] & (cols[None, :] < N)  # (BLOCK_D, BLOCK_L): column n = state n
    G = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)  # REG_CARRY: the adjoint carry, column n
    if REG_CARRY:
        G = tl.load(g_c[:, None] + cols[None, :], mask=n_mask, other=0.0)
    Bv_ptr = B_ptr + bi * stride_Bb + gi * stride_Bg
    Cv_ptr = C_ptr + bi * stride_Cb + gi * stride_Cg
    dBv_ptr = dB_ptr + bi * stride_dBb + gi * stride_dBg
    dCv_ptr = dC_ptr + bi * stride_dCb + gi * stride_dCg
    c = c_hi
    while c >= c_lo:  # chunks from last to first
        dBv_c, dCv_c, sdBn, sdCn = dBv_ptr, dCv_ptr, stride_dBn, stride_dCn
        slot = slots_ptr
        if DET:  # this program's slot for (its batch row and group, chunk c): rows n, columns t
            slot = slot_of_grouped(slots_ptr, pid_d, pid_bg * nchunks + c, slot_rows, SLOT)
            dBv_c = slot - c * BLOCK_L
            if ROWS > 0:  # (or its staging's row 0, reused every chunk: an L2-resident buffer)
                prog = (pid_s * tl.num_programs(0) + pid_bg) * tl.num_programs(1) + pid_d
                dBv_c = stage_ptr + prog.to(tl.int64) * (ROWS * SLOT) - c * BLOCK_L
            dCv_c, sdBn, sdCn = dBv_c + VAR_B * N * BLOCK_L, BLOCK_L, BLOCK_L
        # 1. the chunk's tiles, shared by every state
        t = c * BLOCK_L + cols  # (BLOCK_L,)
        t_r = c * BLOCK_L + (BLOCK_L - 1 - cols)  # (BLOCK_L,) the same steps, reversed
        t_ok = t < l
        mask = d_mask[:, None] & t_ok[None, :]
        offs = row[:, None] + t[None, :]  # (BLOCK_D, BLOCK_L)
        x = ld(u_ptr + offs, mask, EVEN).to(tl.float32)
        dt, _ = load_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS, SOFTPLUS,
                           EVEN)
        dy = ld(dout_ptr + offs, mask, EVEN).to(tl.float32)
        if HAS_Z:
            zz = ld(z_ptr + offs, mask, EVEN).to(tl.float32)
            dy = dy * zz * tl.sigmoid(zz)  # ∂out/∂y = silu(z)
        start = seq_start(seq_ptr + bi * l, t, l, HAS_SEQ)[None, :]
        # the reverse scan's inputs Δ_{t+1} (masked: the last step of a row reads past it) and
        # dy, time-reversed once per chunk if REV_LOADS (contiguous loads, then a flip)
        nxt_mask = d_mask[:, None] & (t + 1 < l)[None, :]
        dt_nx, _ = load_delta(delta_ptr, bias_ptr, offs + 1, nxt_mask, d_idx, d_mask,
                              HAS_BIAS, SOFTPLUS, False)
        start_nx = seq_start(seq_ptr + bi * l, t + 1, l, HAS_SEQ)[None, :]
        dy_r = dy
        if REV_LOADS:
            dt_nx = tl.flip(dt_nx, 1)
            start_nx = seq_start(seq_ptr + bi * l, t_r + 1, l, HAS_SEQ)[None, :]
            dy_r = tl.flip(dy, 1)
        dtx = dt * x
        y = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)  # Σ_n C_n h_n
        gB = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)  # Σ_n g_n B_n  (dx = Δ·gB)
        gahA = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)  # Σ_n g_n Ā h_{t−1} A_n
        st_c = states_ptr + (bd_row * nchunks + c) * N  # (BLOCK_D,) this chunk's stored states
        A_n, h_n, g_n, B_n, C_n, C_r = _so_load_state(
            0, st_c, g_c, G, cols, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr, t, t_r, l, d_idx, d_mask,
            stride_Bn, stride_Cn, N, VAR_B, VAR_C, EVEN_L, EVEN_D,
            REV_LOADS, REG_CARRY)
        # 2. every state over the whole chunk
        for n in range(N):
            # state n + 1's loads in flight during state n (the last one reloads N − 1)
            # (REG_CARRY: column n + 1 of G, which state n leaves as it is)
            A_nx, h_nx, g_nx, B_nx, C_nx, C_rnx = _so_load_state(
                tl.minimum(n + 1, N - 1), st_c, g_c, G, cols, A_ptr, B_ptr, Bv_ptr, C_ptr, Cv_ptr,
                t, t_r, l, d_idx, d_mask, stride_Bn, stride_Cn, N, VAR_B,
                VAR_C, EVEN_L, EVEN_D, REV_LOADS, REG_CARRY)
            h, gg, ah = _so_state(h_n, g_n, A_n, B_n, C_n, C_r, dt, dtx, dt_nx, dy, dy_r, start,
                                  start_nx, cols, BLOCK_L, HAS_SEQ, REV_LOADS)
            if REG_CARRY:  # g at the chunk's first step, for the earlier chunk
                G = put_column(G, cols, n, column(gg, cols, 0))
            else:
                st(g_c + n, column(gg, cols, 0), d_mask, EVEN_D)
            p = gg * ah  # g_t Ā_t h_{t−1}
            dA_acc += tl.where(cols[None, :] == n, tl.sum(p * dt, axis=1)[:, None], 0.0)
            y += h * C_n
            gB += gg * B_n
            gahA += p * A_n[:, None]
            if VAR_B and DET and ROWS > 0:  # staged: summed within each warp only
                _so_stage(dBv_c + n * sdBn + t, gg * dtx, ROWS, SLOT, BLOCK_D, BLOCK_L)
            elif VAR_B:  # summed over the channel tile, one atomic add per step
                _so_atomic(dBv_c + n * sdBn + t, tl.sum(gg * dtx, axis=0), t_ok, EVEN_L, DET)
            else:
                dBf_acc += tl.where(cols[None, :] == n, tl.sum(gg * dtx, axis=1)[:, None], 0.0)
            if VAR_C and DET and ROWS > 0:
                _so_stage(dCv_c + n * sdCn + t, dy * h, ROWS, SLOT, BLOCK_D, BLOCK_L)
            elif VAR_C:
                _so_atomic(dCv_c + n * sdCn + t, tl.sum(dy * h, axis=0), t_ok, EVEN_L, DET)
            else:
                dCf_acc += tl.where(cols[None, :] == n, tl.sum(dy * h, axis=1)[:, None], 0.0)
            A_n, h_n, g_n, B_n, C_n, C_r = A_nx, h_nx, g_nx, B_nx, C_nx, C_rnx
        # 3. the per-step parts (x, dout, z, δ read again: L1/L2 hits, fewer live registers)
        x = ld(u_ptr + offs, mask, EVEN).to(tl.float32)
        dx = gB * dt  # Σ_n g Δ B_n
        ddt = gahA + gB * x  # Σ_n g (Ā h_{t−1} A_n + B_n x)
        dout, zz, dt_raw = dy, dy, dt
        if HAS_Z:
            dout = ld(dout_ptr + offs, mask, EVEN).to(tl.float32)
            zz = ld(z_ptr + offs, mask, EVEN).to(tl.float32)
        if SOFTPLUS:
            _, dt_raw = load_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS,
                                   SOFTPLUS, EVEN)
        dD_acc, dbias_acc = bwd_outputs(y, dx, ddt, x, dy, dout, zz, dt_raw, Dv, dD_acc,
                                        dbias_acc, offs, mask, du_ptr, ddelta_ptr, dz_ptr,
                                        HAS_D, HAS_Z, SOFTPLUS, EVEN)
        if DET:  # the chunk's dB/dC rows of every channel tile, added in tile order (here, after
            # the per-step parts: fewer values live than after the state loop)
            if ROWS > 0:  # the staged rows, added in row order, into this program's slot
                _so_stage_sum(dBv_c + c * BLOCK_L, slot, ROWS, SLOT, TREE_BLOCK)
            if not AFTER:
                tree_sum_grouped(slots_ptr, counts_ptr, pid_d, tl.num_programs(1),
                                 pid_bg * nchunks + c, groups, slot_rows, SLOT, FAN, TREE_BLOCK)
        if not REG_CARRY or ROWS > 0:  # the adjoints stored above are read by other threads next
            # chunk; the staging read above is rewritten by every warp next chunk
            tl.debug_barrier()
        c -= 1
    # 4. this program's sums over its segment of its batch row (the launcher adds the rows: no
    # atomics)
    pn = sd_row[:, None] * N + cols[None, :]  # (BLOCK_D, BLOCK_L), columns < N used
    if REG_CARRY:  # the adjoint at the segment's first step (segment 0: g_0)
        tl.store(g_c[:, None] + cols[None, :], G, mask=n_mask)
    tl.store(dA_ptr + pn, dA_acc, mask=n_mask)
    if not VAR_B:
        tl.store(dBf_ptr + pn, dBf_acc, mask=n_mask)
    if not VAR_C:
        tl.store(dCf_ptr + pn, dCf_acc, mask=n_mask)
    tl.store(dD_ptr + sd_row, dD_acc, mask=d_mask)
    tl.store(dbias_ptr + sd_row, dbias_acc, mask=d_mask)


def launch(dout, u, delta, A, Bk, Ck, D, z, delta_bias, flags, seq_idx, states, bufs,
           shape, config, B, C, plan):
    """Launch the state-outer backward into ``bufs`` (`GradBuffers`, one slot per segment of
    ``plan`` = (S, seg_len, k, G, P), G and P the adjoint summaries or None); Bk, Ck: kernel
    layouts. With ``config.deterministic`` the time-varying dB/dC go through ``bufs.tree``."""
    b, d, l, n, g = shape
    S, seg_len, k, G, P = plan
    bc, interp = config.backward, device.interpreted()
    tree = bufs.tree
    even_l, even_d = cfgs.even_flags(bc.even, l, d // g, config.chunk, bc.block_d)
    sB, sC = bc_strides(Bk), bc_strides(Ck)
    sdB, sdC = bufs.strides(bufs.dB, Bk.ndim == 4), bufs.strides(bufs.dC, Ck.ndim == 4)
    grid = (b * g, triton.cdiv(d // g, bc.block_d), bufs.gbuf.shape[0])
    rows = bc.tree_rows if tree is not None else 0
    stage = A
    if rows:  # one (rows, slot) staging per program, rewritten every chunk
        stage = torch.empty((grid[0] * grid[1] * grid[2], rows, tree.slots.shape[2]),
                            device=u.device, dtype=torch.float32)
    _bwd_so_kernel[grid](
        u, delta, A, Bk, Ck,  # inputs
        D if D is not None else A,  # optional inputs: A stands in for absent ones (unread)
        z if z is not None else A,
        delta_bias if delta_bias is not None else A,
        seq_idx if seq_idx is not None else A,
        dout, states, bufs.gbuf,  # upstream gradient, stored states, adjoint carry
        G if G is not None else bufs.gbuf, P if P is not None else bufs.gbuf,  # summaries
        bufs.du, bufs.ddelta, bufs.dz if z is not None else A,  # (b, d, l) gradients
        bufs.dB, bufs.dC,  # time-varying dB / dC (atomic adds)
        *(tree.slots, tree.counts) if tree is not None else (A, A),  # deterministic: the tree
        stage,  # deterministic, bc.tree_rows > 0: the programs' staged partials
        bufs.dA_rows, bufs.dBf_rows, bufs.dCf_rows, bufs.dD_rows, bufs.dbias_rows,  # row sums
        l, d, d // g, g,  # length, channels, channels per group, groups
        seg_len, b * d, k, (S - 1) * k,  # steps a segment, its rows, pieces a segment, all
        *(tree.groups, tree.rows) if tree is not None else (1, 1),  # its groups (b·g·chunks),
        # slots a group
        tuple(sB), tuple(sC),  # strides (b, g, n) of B and C (zeros if fixed (d, n))
        tuple(sdB), tuple(sdC),  # strides of the dB and dC buffers
        N=n, BLOCK_D=bc.block_d, BLOCK_L=config.chunk,
        **flags,  # HAS_D … HAS_SEQ, resolved once (``args.flags``)
        EVEN_L=even_l, EVEN_D=even_d, REV_LOADS=bc.rev_loads, FOLD=S > 1,
        **bufs.tree_constexprs(bc.num_warps, bc.tree_block),  # DET, SLOT, FAN, TREE_BLOCK, AFTER
        ROWS=rows, REG_CARRY=bc.reg_carry, num_warps=bc.num_warps,
        **cfgs.compile_options(bc.maxnreg, interp))
