"""The fused Mamba-1 selective scan, forward and backward, written to be read (chapter 09).

    Δ_t = softplus(delta_t + delta_bias)      Ā_t = exp(Δ_t A)      B̄_t x_t = Δ_t B_t x_t
    h_t = Ā_t h_{t−1} + Δ_t B_t x_t           y_t = C_t h_t + D x_t  out_t = y_t · silu(z_t)

This is the version the chapter walks through line by line: plain loads, `tl.exp`, one fixed
tile, `tl.associative_scan(reverse=True)` for the backward. The tuned kernels (``api`` and
the modules it names: measured tiles, exp2, B/C upcast once, a flip instead of reverse=True, a
state-outer backward) share with it only ``args`` (argument checks, layouts, the autograd
Function) and chapter 08's ``combine_fn``.

The plan of both kernels, in one picture (one program = BLOCK_D channels of one batch row):

    time →   [ block 0 ][ block 1 ][ block 2 ] …      each block: a (BLOCK_D, BLOCK_L) tile
    for every block:           load x, Δ (once for all n states)
        for every state n:     Ā, B̄x  →  fold the carried h into step 0  →  scan along time
                               y += C_n·h;   carry h[:, last] to the next block
        write y·silu(z) + D·x  (the only write of size l)
    every CHUNK steps:         write h (b, d, n) — the backward restarts from there

Forward + backward with chunked recomputation (chapter 07) is exactly what the backward does: per
chunk it reloads the stored state, recomputes h inside the chunk, and scans the adjoint backwards.

Not deterministic on a GPU: its backward adds dA, dB, dC, dD and d bias over programs with atomic
adds, in whatever order the programs get there, and float addition is not associative, so two
runs may differ in the last bits. ``selective_scan_fn(..., deterministic=True)`` is the tuned
kernels' fixed-order alternative (``deterministic``).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mambalearn import device
from mambalearn.mamba1 import args as interface
from mambalearn.triton.common import softplus
from mambalearn.triton.config import LaunchConfig
from mambalearn.triton.scan import combine_fn  # the ⊗ of chapter 03, jitted in chapter 08


@dataclass(frozen=True)
class Tile(LaunchConfig):
    """The one fixed tile of a launch: ``block_d`` channels × ``block_l`` steps (the forward's;
    the backward walks a chunk of CHUNK steps), ``num_warps`` warps."""
    block_d: int
    block_l: int = 0
    num_warps: int = 4


CHUNK = 32  # steps between stored states = the backward's time tile
GPU_FWD = Tile(block_d=64, block_l=16, num_warps=4)  # one readable choice, not tuned
GPU_BWD = Tile(block_d=16, num_warps=4)
CPU_FWD = Tile(block_d=4, block_l=8, num_warps=1)  # interpreter: small tiles
CPU_BWD = Tile(block_d=4, num_warps=1)
CPU_CHUNK = 8


# ---------------------------------------------------------------------------------------------
# Helpers (Triton inlines them). A (BLOCK_D, BLOCK_L) tile holds BLOCK_D channels × BLOCK_L
# steps in registers; a register cannot be indexed by a run-time value, so a column is read or
# written with a mask — with a column index known at compile time that folds to register moves.
# ---------------------------------------------------------------------------------------------
@triton.jit
def column(X, cols, j):
    """X[:, j] of a register tile, as a vector: select with a mask and sum."""
    return tl.sum(tl.where(cols[None, :] == j, X, 0.0), axis=1)


@triton.jit
def put_column(X, cols, j, v):
    """X with column j replaced by the vector v."""
    return tl.where(cols[None, :] == j, v[:, None], X)


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
def load_bc(X_ptr, Xv_ptr, n, t, l, d_idx, d_mask, stride_X0, stride_X1, stride_X2,
            VAR: tl.constexpr):
    """Row n of B (or C) as a tile factor: (1, BLOCK_L) if it varies in time, else (BLOCK_D, 1).

    stride_X0..2: X's strides along its dimensions 0, 1, 2 — (b, g, n) of a (b, g, n, l) X,
    (d, n, 0) of a fixed (d, n) one (`interface.dim_strides`)."""
    if VAR:  # (b, g, n, l): the same B_t for every channel of the group; Xv_ptr: this (b, g)
        return tl.load(Xv_ptr + n * stride_X2 + t, mask=t < l, other=0.0).to(tl.float32)[None, :]
    else:  # (d, n): one number per channel
        return tl.load(X_ptr + d_idx * stride_X0 + n * stride_X1, mask=d_mask,
                       other=0.0).to(tl.float32)[:, None]


@triton.jit
def seq_start(seq_ptr, t, l, HAS_SEQ: tl.constexpr):
    """True at the steps where a new packed sequence begins (seq_idx changes)."""
    if HAS_SEQ:
        cur = tl.load(seq_ptr + t, mask=t < l, other=0)
        prev = tl.load(seq_ptr + t - 1, mask=(t >= 1) & (t < l), other=0)
        return (cur != prev) & (t >= 1)
    else:
        return t < 0  # no packing: never


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def selective_scan_fwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, seq_ptr,  # inputs
    out_ptr, states_ptr,  # out (b, d, l); states (b, d, chunks, n)
    last_ptr,  # (b, d, n): h_{l−1} out; h_{−1} in if HAS_H0 (the initial state)
    l, d, dpg, g,  # steps, channels, channels per group of B/C, groups
    stride_B0, stride_B1, stride_B2,  # B's strides, dims 0-2: (b, g, n) or fixed (d, n, 0)
    stride_C0, stride_C1, stride_C2,  # C's
    N: tl.constexpr, NP: tl.constexpr,  # state size n, and n rounded up to a power of two
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,  # the tile: channels × steps
    CHUNK: tl.constexpr,  # store the state every CHUNK steps (a multiple of BLOCK_L)
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr, HAS_H0: tl.constexpr,
):
    """h_t = Ā_t h_{t−1} + B̄_t x_t and out_t = (C_t·h_t + D x_t)·silu(z_t) for BLOCK_D channels
    of one batch row, every step; h stored every CHUNK steps for the backward.

    Shapes: u, delta, z, out (b, d, l); A (d, n) fp32; B, C (b, g, n, l) or (d, n); D, bias
    (d,); seq (b, l) int32; h0, last (b, d, n) fp32; states (b, d, ⌈l / CHUNK⌉, n) fp32.
    Grid: (b · g, ⌈(d / g) / BLOCK_D⌉).
    """
    # 1. which channels of which batch row this program owns
    bi = tl.program_id(0) // g  # batch row
    gi = tl.program_id(0) % g  # group of B/C (all channels of a tile share one group)
    d_loc = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # (BLOCK_D,) channel in group
    d_mask = d_loc < dpg
    d_idx = gi * dpg + d_loc  # (BLOCK_D,) channel index in 0..d-1
    row = (bi * d + d_idx).to(tl.int64) * l  # (BLOCK_D,) where each channel's sequence starts
    cols = tl.arange(0, BLOCK_L)  # (BLOCK_L,) step inside a block
    ncols = tl.arange(0, NP)  # (NP,) state index
    nchunks = tl.cdiv(l, CHUNK)
    Bv_ptr = B_ptr + bi * stride_B0 + gi * stride_B1  # this row's (n, l) slice of B (if it varies)
    Cv_ptr = C_ptr + bi * stride_C0 + gi * stride_C1
    n_mask = d_mask[:, None] & (ncols[None, :] < N)  # (BLOCK_D, NP)
    h_rows = (bi * d + d_idx).to(tl.int64)[:, None] * N + ncols[None, :]  # (BLOCK_D, NP)
    # 2. the carried state: one column per state n. It lives in registers for the whole sequence.
    H = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # h_{−1} = 0 …
    if HAS_H0:  # … or the initial state given
        H = tl.load(last_ptr + h_rows, mask=n_mask, other=0.0)
    t0 = 0
    while t0 < l:  # blocks of time, in order: each needs the state the previous one left
        t0 = tl.multiple_of(t0, BLOCK_L)  # tells the compiler loads are aligned (wide loads)
        t = t0 + cols  # (BLOCK_L,) the steps of this block
        mask = d_mask[:, None] & (t < l)[None, :]  # (BLOCK_D, BLOCK_L)
        offs = row[:, None] + t[None, :]  # (BLOCK_D, BLOCK_L)
        # 3. what every state shares: x and Δ, loaded and upcast to fp32 once per block
        x = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dt, _ = load_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS, SOFTPLUS)
        start = seq_start(seq_ptr + bi * l, t, l, HAS_SEQ)[None, :]  # (1, BLOCK_L)
        y = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
        t1 = t0 + BLOCK_L
        for n in tl.static_range(N):  # unrolled: H[:, n] must be a compile-time column
            # 4. discretize: Ā = exp(Δ A_n), B̄x = Δ B_n x          (BLOCK_D, BLOCK_L)
            A_n = tl.load(A_ptr + d_idx * N + n, mask=d_mask, other=0.0)  # (BLOCK_D,)
            A_n = tl.maximum(A_n, -1e30)  # A = −∞: 0 · (−∞) = NaN past l; exp(−1e30 Δ) is 0 too
            a = tl.exp(dt * A_n[:, None])
            if HAS_SEQ:
                a = tl.where(start, 0.0, a)  # a new sequence: forget the state (Ā = 0)
            B_n = load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, stride_B0, stride_B1,
                          stride_B2, VAR_B)
            bx = dt * x * B_n
            # 5. fold the carried state into step 0: (Ā₀, Ā₀h + B̄₀x₀) — then the scan gives h
            h_in = column(H, ncols, n)  # (BLOCK_D,)
            bx = tl.where(cols[None, :] == 0, a * h_in[:, None] + bx, bx)
            # 6. the scan along time, with the one ⊗ of chapter 03
            _, h = tl.associative_scan((a, bx), 1, combine_fn)  # (BLOCK_D, BLOCK_L)
            # 7. carry h at the block's last step to the next block
            h_out = column(h, cols, BLOCK_L - 1)
            H = put_column(H, ncols, n, h_out)
            if (t1 % CHUNK == 0) & (t1 < l):  # the state entering the next chunk, for backward
                tl.store(states_ptr + (bi * d + d_idx).to(tl.int64) * nchunks * N
                         + (t1 // CHUNK) * N + n, h_out, mask=d_mask)
            # 8. the output contracts the state: y += C_n h
            C_n = load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, stride_C0, stride_C1,
                          stride_C2, VAR_C)
            y += C_n * h
        # 9. skip connection and gate, then the block's only write
        if HAS_D:
            y += x * tl.load(D_ptr + d_idx, mask=d_mask, other=0.0)[:, None]
        if HAS_Z:
            zz = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            y *= zz * tl.sigmoid(zz)  # silu(z) = z σ(z)
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
        t0 = t1
    tl.store(last_ptr + h_rows, H, mask=n_mask)


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------
@triton.jit
def selective_scan_bwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, seq_ptr, dout_ptr, states_ptr,
    g_ptr,  # (b, d, n) fp32 if CARRY_G: in, the last state's gradient; out, the adjoint g_0
    du_ptr, ddelta_ptr, dA_ptr, dB_ptr, dC_ptr, dD_ptr, dz_ptr, dbias_ptr,  # gradients (dA, dB,
    l, d, dpg, g,  # dC, dD, dbias are fp32 and zeroed: programs add into them)
    stride_B0, stride_B1, stride_B2,  # B's strides, dims 0-2: (b, g, n) or fixed (d, n, 0)
    stride_C0, stride_C1, stride_C2,  # C's
    stride_dB0, stride_dB1, stride_dB2,  # dB's (B's layout)
    stride_dC0, stride_dC1, stride_dC2,  # dC's
    N: tl.constexpr, NP: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
    CARRY_G: tl.constexpr,  # the last state has a gradient or the initial state needs one
):
    """The gradients of the forward, chunk by chunk from the last: h recomputed from the stored
    state, the adjoint g_t = C_t dy_t + Ā_{t+1} g_{t+1} scanned backwards, then the chain rule.

    Shapes: as the forward, plus dout, du, ddelta, dz (b, d, l); dA (d, n), dD, dbias (d,) and
    dB, dC (B's and C's shapes) fp32 zeroed (programs add into them); g (b, d, n) fp32.
    Grid: (b · g, ⌈(d / g) / BLOCK_D⌉).
    """
    bi = tl.program_id(0) // g
    gi = tl.program_id(0) % g
    d_loc = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d_loc < dpg
    d_idx = gi * dpg + d_loc  # (BLOCK_D,)
    row = (bi * d + d_idx).to(tl.int64) * l
    cols = tl.arange(0, CHUNK)  # the time tile is one whole chunk
    ncols = tl.arange(0, NP)
    n_mask = d_mask[:, None] & (ncols[None, :] < N)  # (BLOCK_D, NP)
    nchunks = tl.cdiv(l, CHUNK)
    Bv_ptr = B_ptr + bi * stride_B0 + gi * stride_B1
    Cv_ptr = C_ptr + bi * stride_C0 + gi * stride_C1
    g_rows = (bi * d + d_idx).to(tl.int64)[:, None] * N + ncols[None, :]  # (BLOCK_D, NP) in g
    G = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # the adjoint g = ∂L/∂h entering from later
    if CARRY_G:  # past the end: the last state's gradient
        G = tl.load(g_ptr + g_rows, mask=n_mask, other=0.0)
    dA_acc = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # Σ over this row's steps
    dB_acc = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # (fixed B only)
    dC_acc = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # (fixed C only)
    dD_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dbias_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    c = nchunks - 1
    while c >= 0:  # chunks from last to first: the adjoint flows backwards in time
        t = c * CHUNK + cols  # (CHUNK,)
        t_ok = t < l
        mask = d_mask[:, None] & t_ok[None, :]
        offs = row[:, None] + t[None, :]
        # 1. per-step inputs; Δ_{t+1} too, because the reverse scan is gated by Ā_{t+1}
        x = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dt, dt_raw = load_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS, SOFTPLUS)
        nxt_mask = d_mask[:, None] & (t + 1 < l)[None, :]
        dt_nx, _ = load_delta(delta_ptr, bias_ptr, offs + 1, nxt_mask, d_idx, d_mask, HAS_BIAS,
                              SOFTPLUS)
        start = seq_start(seq_ptr + bi * l, t, l, HAS_SEQ)[None, :]
        start_nx = seq_start(seq_ptr + bi * l, t + 1, l, HAS_SEQ)[None, :]
        # 2. dout → dy: out = y·silu(z), so ∂out/∂y = silu(z)
        dout = tl.load(dout_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = dout
        if HAS_Z:
            zz = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            dy = dout * zz * tl.sigmoid(zz)
        y = tl.zeros((BLOCK_D, CHUNK), dtype=tl.float32)  # recomputed, for dz
        dx = tl.zeros((BLOCK_D, CHUNK), dtype=tl.float32)
        ddt = tl.zeros((BLOCK_D, CHUNK), dtype=tl.float32)
        # the state entering this chunk, stored by the forward (chunked recomputation)
        st_ptr = states_ptr + ((bi * d + d_idx).to(tl.int64) * nchunks + c) * N  # (BLOCK_D,)
        for n in tl.static_range(N):
            A_n = tl.load(A_ptr + d_idx * N + n, mask=d_mask, other=0.0)[:, None]  # (BLOCK_D, 1)
            A_n = tl.maximum(A_n, -1e30)  # A = −∞: Δ A = 0 · (−∞) = NaN past l, and A · 0 in dΔ
            a = tl.exp(dt * A_n)  # Ā_t
            a_nx = tl.exp(dt_nx * A_n)  # Ā_{t+1}
            if HAS_SEQ:
                a = tl.where(start, 0.0, a)
                a_nx = tl.where(start_nx, 0.0, a_nx)
            B_n = load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, stride_B0, stride_B1,
                          stride_B2, VAR_B)
            C_n = load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, stride_C0, stride_C1,
                          stride_C2, VAR_C)
            # 3. recompute h over the chunk from its stored state (as in the forward)
            bx = dt * x * B_n
            h_in = tl.load(st_ptr + n, mask=d_mask, other=0.0)
            _, h = tl.associative_scan(
                (a, tl.where(cols[None, :] == 0, a * h_in[:, None] + bx, bx)), 1, combine_fn)
            # 4. the adjoint runs backwards: g_t = C_t dy_t + Ā_{t+1} g_{t+1}; the g entering
            #    from the next chunk folds into the last step, as h_in did into the first
            beta = C_n * dy
            g_in = column(G, ncols, n)
            beta = tl.where(cols[None, :] == CHUNK - 1, beta + a_nx * g_in[:, None], beta)
            _, gg = tl.associative_scan((a_nx, beta), 1, combine_fn, reverse=True)
            G = put_column(G, ncols, n, column(gg, cols, 0))
            # 5. the chain rule, with Ā_t h_{t−1} = h_t − B̄_t x_t (no shifted h needed):
            #    ∂h_t/∂Δ_t = A Ā_t h_{t−1} + B_t x_t, ∂h_t/∂A = Δ_t Ā_t h_{t−1}, ∂h_t/∂x_t = Δ_t B_t
            ah = h - bx
            y += C_n * h
            dx += gg * dt * B_n
            ddt += gg * (ah * A_n + x * B_n)
            dA_acc = put_column(dA_acc, ncols, n,
                                column(dA_acc, ncols, n) + tl.sum(gg * ah * dt, axis=1))
            # dB_t = Σ_channels g Δ x, dC_t = Σ_channels dy h: summed over the tile's channels
            # first, then one atomic add per step (other programs add theirs)
            if VAR_B:
                tl.atomic_add(dB_ptr + bi * stride_dB0 + gi * stride_dB1 + n * stride_dB2 + t,
                              tl.sum(gg * dt * x, axis=0), mask=t_ok, sem="relaxed")
            else:
                dB_acc = put_column(dB_acc, ncols, n,
                                    column(dB_acc, ncols, n) + tl.sum(gg * dt * x, axis=1))
            if VAR_C:
                tl.atomic_add(dC_ptr + bi * stride_dC0 + gi * stride_dC1 + n * stride_dC2 + t,
                              tl.sum(dy * h, axis=0), mask=t_ok, sem="relaxed")
            else:
                dC_acc = put_column(dC_acc, ncols, n,
                                    column(dC_acc, ncols, n) + tl.sum(dy * h, axis=1))
        # 6. per-step terms: D skip, the gate (silu′(z) = σ(z)(1 + z(1 − σ(z)))), softplus′ = σ
        if HAS_D:
            D_v = tl.load(D_ptr + d_idx, mask=d_mask, other=0.0)[:, None]
            y += x * D_v
            dx += dy * D_v
            dD_acc += tl.sum(dy * x, axis=1)
        if HAS_Z:
            sig = tl.sigmoid(zz)
            tl.store(dz_ptr + offs, (dout * y * sig * (1.0 + zz * (1.0 - sig))).to(
                dz_ptr.dtype.element_ty), mask=mask)
        if SOFTPLUS:
            ddt *= tl.sigmoid(dt_raw)
        ddt = tl.where(mask, ddt, 0.0)
        dbias_acc += tl.sum(ddt, axis=1)
        tl.store(du_ptr + offs, dx.to(du_ptr.dtype.element_ty), mask=mask)
        tl.store(ddelta_ptr + offs, ddt.to(ddelta_ptr.dtype.element_ty), mask=mask)
        c -= 1
    # 7. parameter gradients: this program's sums, added to the other batch rows'; g_0 (for
    #    the initial state's gradient Ā_0 g_0)
    if CARRY_G:
        tl.store(g_ptr + g_rows, G, mask=n_mask)
    tl.atomic_add(dA_ptr + d_idx[:, None] * N + ncols[None, :], dA_acc, mask=n_mask, sem="relaxed")
    if not VAR_B:
        tl.atomic_add(dB_ptr + d_idx[:, None] * stride_dB0 + ncols[None, :] * stride_dB1, dB_acc,
                      mask=n_mask, sem="relaxed")
    if not VAR_C:
        tl.atomic_add(dC_ptr + d_idx[:, None] * stride_dC0 + ncols[None, :] * stride_dC1, dC_acc,
                      mask=n_mask, sem="relaxed")
    if HAS_D:
        tl.atomic_add(dD_ptr + d_idx, dD_acc, mask=d_mask, sem="relaxed")
    if HAS_BIAS:
        tl.atomic_add(dbias_ptr + d_idx, dbias_acc, mask=d_mask, sem="relaxed")


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------
def _chunk():
    return CPU_CHUNK if device.interpreted() else CHUNK


def _forward(u, delta, A, B, C, D, z, delta_bias, flags, seq_idx, initial_state, shape,
             config=None):
    """Launch the forward (``config`` unused: one fixed tile). Returns out, states, last."""
    b, d, l, n, g = shape
    cfg = CPU_FWD if device.interpreted() else GPU_FWD
    f32 = dict(device=u.device, dtype=torch.float32)
    Bk, Ck = interface.bc_layout(B), interface.bc_layout(C)  # (b, n, l) → (b, 1, n, l)
    sB, sC = interface.dim_strides(Bk), interface.dim_strides(Ck)
    q = _chunk()
    out = torch.empty_like(u)
    states = torch.empty((b, d, triton.cdiv(l, q), n), **f32)
    states[:, :, 0] = 0.0 if initial_state is None else initial_state  # h_{−1}
    last = torch.empty((b, d, n), **f32) if initial_state is None \
        else initial_state.clone()  # h_{−1} in, h_{l−1} out
    opt = lambda X: X if X is not None else A  # A stands in for absent inputs (never read)
    selective_scan_fwd_kernel[(b * g, triton.cdiv(d // g, cfg.block_d))](
        u, delta, A, Bk, Ck, opt(D), opt(z), opt(delta_bias), opt(seq_idx),  # inputs
        out, states,  # outputs
        last,  # h_{−1} in (if given), h_{l−1} out
        l, d, d // g, g,  # steps, channels, channels per group, groups
        *sB,  # B's strides along its dims 0, 1, 2
        *sC,  # C's
        N=n, NP=triton.next_power_of_2(n), CHUNK=q,
        **flags,  # HAS_D … HAS_SEQ: the call's switches, resolved once by ``run``
        HAS_H0=initial_state is not None, BLOCK_D=cfg.block_d, BLOCK_L=cfg.block_l,
        num_warps=cfg.num_warps)
    return out, states, last


def _backward(dout, dlast, u, delta, A, B, C, D, z, delta_bias, flags, seq_idx, states,
              shape, config=None, need_g0=False):
    """Launch the backward. Returns the eight gradients and g_0, the adjoint at step 0 (None
    unless ``need_g0`` or the last state has a gradient ``dlast``)."""
    b, d, l, n, g = shape
    cfg = CPU_BWD if device.interpreted() else GPU_BWD
    dout = dout.contiguous()  # (autograd's); the inputs came contiguous from ``args.run``
    Bk, Ck = interface.bc_layout(B), interface.bc_layout(C)
    f32 = dict(device=u.device, dtype=torch.float32)
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dz = torch.empty_like(z) if z is not None else None
    dA, dD, dbias = torch.zeros_like(A), torch.zeros(d, **f32), torch.zeros(d, **f32)
    dB, dC = torch.zeros(Bk.shape, **f32), torch.zeros(Ck.shape, **f32)
    carry_g = dlast is not None or need_g0
    g0 = torch.zeros((b, d, n), **f32) if dlast is None else dlast.float().clone(
        memory_format=torch.contiguous_format)  # in: the last state's gradient; out: g_0
    sB, sC = interface.dim_strides(Bk), interface.dim_strides(Ck)
    sdB, sdC = interface.dim_strides(dB), interface.dim_strides(dC)
    opt = lambda X: X if X is not None else A  # A stands in for absent tensors (never touched)
    selective_scan_bwd_kernel[(b * g, triton.cdiv(d // g, cfg.block_d))](
        u, delta, A, Bk, Ck, opt(D), opt(z), opt(delta_bias), opt(seq_idx),  # inputs
        dout, states, g0,  # upstream gradient, stored states, adjoint carry
        du, ddelta, dA, dB, dC, dD, opt(dz), dbias,  # gradients
        l, d, d // g, g,  # steps, channels, channels per group, groups
        *sB, *sC,  # B's and C's strides along their dims 0, 1, 2
        *sdB, *sdC,  # dB's and dC's
        N=n, NP=triton.next_power_of_2(n), CHUNK=_chunk(),
        **flags,  # HAS_D … HAS_SEQ: the call's switches, resolved once by ``run``
        CARRY_G=carry_g, BLOCK_D=cfg.block_d, num_warps=cfg.num_warps)
    return (*interface.finish_grads(du, ddelta, dA, dB, dC, dD, dz, dbias, B, C, D, delta_bias),
            g0 if carry_g else None)


TEACHING = interface.Kernels("teaching", _forward, _backward)


def selective_scan_teaching(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                            delta_softplus=False, return_last_state=False, seq_idx=None,
                            cu_seqlens=None, initial_state=None):
    """out = (C·h + D·x)·silu(z),  h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t — the readable kernels.

    Shapes: exactly those of `mambalearn.triton.selective_scan_fn` (and of
    ``mamba_ssm.selective_scan_fn``): u, delta, z (b, d, l); A (d, n) fp32; B, C (b, n, l),
    (b, g, n, l) or (d, n); D, delta_bias (d,); seq_idx (b, l) or cu_seqlens (k + 1,);
    initial_state (b, d, n) fp32 (h_{−1}, optional); out (b, d, l), last state (b, d, n) fp32.
    Differentiable (initial and last state included): the backward kernel recomputes h per
    chunk of CHUNK steps.
    """
    return interface.run(TEACHING, None, u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                         return_last_state, seq_idx, cu_seqlens, initial_state)
