"""The fused Mamba-1 selective scan, forward and backward, written to be read (chapter 09).

    Δ_t = softplus(delta_t + delta_bias)      Ā_t = exp(Δ_t A)      B̄_t x_t = Δ_t B_t x_t
    h_t = Ā_t h_{t−1} + Δ_t B_t x_t           y_t = C_t h_t + D x_t  out_t = y_t · silu(z_t)

This is the version the chapter walks through line by line: plain loads, `tl.exp`, one fixed
tile, `tl.associative_scan(reverse=True)` for the backward. `mambalearn.triton.selective_scan`
holds the tuned kernels (measured tiles, exp2, B/C upcast once, a flip instead of reverse=True,
sub-blocks in the backward) and the shared plumbing (argument checks, the autograd Function).

The plan of both kernels, in one picture (one program = BLOCK_D channels of one batch row):

    time →   [ block 0 ][ block 1 ][ block 2 ] …      each block: a (BLOCK_D, BLOCK_L) tile
    for every block:           load x, Δ (once for all n states)
        for every state n:     Ā, B̄x  →  fold the carried h into step 0  →  scan along time
                               y += C_n·h;   carry h[:, last] to the next block
        write y·silu(z) + D·x  (the only write of size l)
    every CHUNK steps:         write h (b, d, n) — the backward restarts from there

Forward + backward with chunked recomputation (chapter 07) is exactly what the backward does: per
chunk it reloads the stored state, recomputes h inside the chunk, and scans the adjoint backwards.
"""

import torch
import triton
import triton.language as tl

from mambalearn import device
from mambalearn.triton.selective_scan import tuned
from mambalearn.triton.scan import combine_fn  # the ⊗ of chapter 03, jitted in chapter 08
from mambalearn.triton.selective_scan.tile import column, load_delta, put_column, seq_start, softplus  # noqa: F401

CHUNK = 32  # steps between stored states = the backward's time tile
GPU_FWD = dict(BLOCK_D=64, BLOCK_L=16, num_warps=4)  # one readable choice, not tuned
GPU_BWD = dict(BLOCK_D=16, num_warps=4)
CPU_FWD = dict(BLOCK_D=4, BLOCK_L=8, num_warps=1)  # interpreter: small tiles
CPU_BWD = dict(BLOCK_D=4, num_warps=1)
CPU_CHUNK = 8


@triton.jit
def load_bc(X_ptr, Xv_ptr, n, t, l, d_idx, d_mask, s0, s1, s2, VAR: tl.constexpr):
    """Row n of B (or C) as a tile factor: (1, BLOCK_L) if it varies in time, else (BLOCK_D, 1)."""
    if VAR:  # (b, g, n, l): the same B_t for every channel of the group
        return tl.load(Xv_ptr + n * s2 + t, mask=t < l, other=0.0).to(tl.float32)[None, :]
    else:  # (d, n): one number per channel
        return tl.load(X_ptr + d_idx * s0 + n * s1, mask=d_mask, other=0.0).to(tl.float32)[:, None]


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def selective_scan_fwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, seq_ptr,  # inputs
    out_ptr, states_ptr, last_ptr,  # out (b, d, l); states (b, d, chunks, n); last (b, d, n)
    l, d, dpg, g,  # steps, channels, channels per group of B/C, groups
    sB0, sB1, sB2, sC0, sC1, sC2,  # strides of B, C: (batch, group, state) or (channel, state, -)
    N: tl.constexpr, NP: tl.constexpr,  # state size n, and n rounded up to a power of two
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,  # the tile: channels × steps
    CHUNK: tl.constexpr,  # store the state every CHUNK steps (a multiple of BLOCK_L)
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
):
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
    Bv_ptr = B_ptr + bi * sB0 + gi * sB1  # this row's (n, l) slice of B (if it varies)
    Cv_ptr = C_ptr + bi * sC0 + gi * sC1
    # 2. the carried state: one column per state n. It lives in registers for the whole sequence.
    H = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # h_{−1} = 0
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
            a = tl.exp(dt * A_n[:, None])
            if HAS_SEQ:
                a = tl.where(start, 0.0, a)  # a new sequence: forget the state (Ā = 0)
            B_n = load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, sB0, sB1, sB2, VAR_B)
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
            C_n = load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, sC0, sC1, sC2, VAR_C)
            y += C_n * h
        # 9. skip connection and gate, then the block's only write
        if HAS_D:
            y += x * tl.load(D_ptr + d_idx, mask=d_mask, other=0.0)[:, None]
        if HAS_Z:
            zz = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            y *= zz * tl.sigmoid(zz)  # silu(z) = z σ(z)
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
        t0 = t1
    n_mask = d_mask[:, None] & (ncols[None, :] < N)
    tl.store(last_ptr + (bi * d + d_idx).to(tl.int64)[:, None] * N + ncols[None, :], H,
             mask=n_mask)


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------
@triton.jit
def selective_scan_bwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, seq_ptr, dout_ptr, states_ptr,
    du_ptr, ddelta_ptr, dA_ptr, dB_ptr, dC_ptr, dD_ptr, dz_ptr, dbias_ptr,  # gradients (dA, dB,
    l, d, dpg, g,  # dC, dD, dbias are fp32 and zeroed: programs add into them)
    sB0, sB1, sB2, sC0, sC1, sC2,
    dB0, dB1, dB2, dC0, dC1, dC2,  # strides of dB, dC
    N: tl.constexpr, NP: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
):
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
    Bv_ptr = B_ptr + bi * sB0 + gi * sB1
    Cv_ptr = C_ptr + bi * sC0 + gi * sC1
    G = tl.zeros((BLOCK_D, NP), dtype=tl.float32)  # the adjoint g = ∂L/∂h entering from later
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
            a = tl.exp(dt * A_n)  # Ā_t
            a_nx = tl.exp(dt_nx * A_n)  # Ā_{t+1}
            if HAS_SEQ:
                a = tl.where(start, 0.0, a)
                a_nx = tl.where(start_nx, 0.0, a_nx)
            B_n = load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, sB0, sB1, sB2, VAR_B)
            C_n = load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, sC0, sC1, sC2, VAR_C)
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
                tl.atomic_add(dB_ptr + bi * dB0 + gi * dB1 + n * dB2 + t,
                              tl.sum(gg * dt * x, axis=0), mask=t_ok, sem="relaxed")
            else:
                dB_acc = put_column(dB_acc, ncols, n,
                                    column(dB_acc, ncols, n) + tl.sum(gg * dt * x, axis=1))
            if VAR_C:
                tl.atomic_add(dC_ptr + bi * dC0 + gi * dC1 + n * dC2 + t,
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
    # 7. parameter gradients: this program's sums, added to the other batch rows'
    tl.atomic_add(dA_ptr + d_idx[:, None] * N + ncols[None, :], dA_acc, mask=n_mask, sem="relaxed")
    if not VAR_B:
        tl.atomic_add(dB_ptr + d_idx[:, None] * dB0 + ncols[None, :] * dB1, dB_acc, mask=n_mask,
                      sem="relaxed")
    if not VAR_C:
        tl.atomic_add(dC_ptr + d_idx[:, None] * dC0 + ncols[None, :] * dC1, dC_acc, mask=n_mask,
                      sem="relaxed")
    if HAS_D:
        tl.atomic_add(dD_ptr + d_idx, dD_acc, mask=d_mask, sem="relaxed")
    if HAS_BIAS:
        tl.atomic_add(dbias_ptr + d_idx, dbias_acc, mask=d_mask, sem="relaxed")


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------
def _chunk():
    return CPU_CHUNK if device.interpreted() else CHUNK


def _forward(u, delta, A, B, C, D, z, delta_bias, delta_softplus, seq_idx, shape):
    b, d, l, n, g = shape
    cfg = CPU_FWD if device.interpreted() else GPU_FWD
    u, delta, A = u.contiguous(), delta.contiguous(), A.contiguous()
    z = z.contiguous() if z is not None else None
    Bk, Ck = tuned.bc_layout(B), tuned.bc_layout(C)
    q = _chunk()
    out = torch.empty_like(u)
    states = torch.empty((b, d, triton.cdiv(l, q), n), device=u.device, dtype=torch.float32)
    states[:, :, 0] = 0.0  # the state before the first chunk is h_{−1} = 0
    last = torch.empty((b, d, n), device=u.device, dtype=torch.float32)
    grid = (b * g, triton.cdiv(d // g, cfg["BLOCK_D"]))
    selective_scan_fwd_kernel[grid](
        u, delta, A, Bk, Ck, *tuned.optional(D, z, delta_bias, seq_idx, dummy=A),
        out, states, last, l, d, d // g, g, *tuned._bc_strides(Bk), *tuned._bc_strides(Ck),
        N=n, NP=triton.next_power_of_2(n), CHUNK=q,
        **tuned.flags(D, z, delta_bias, delta_softplus, B, C, seq_idx), **cfg)
    return out, states, last


def _backward(dout, u, delta, A, B, C, D, z, delta_bias, delta_softplus, seq_idx, states, shape):
    b, d, l, n, g = shape
    cfg = CPU_BWD if device.interpreted() else GPU_BWD
    u, delta, A, dout = u.contiguous(), delta.contiguous(), A.contiguous(), dout.contiguous()
    z = z.contiguous() if z is not None else None
    Bk, Ck = tuned.bc_layout(B), tuned.bc_layout(C)
    f32 = dict(device=u.device, dtype=torch.float32)
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dz = torch.empty_like(z) if z is not None else None
    dA, dD, dbias = torch.zeros_like(A), torch.zeros(d, **f32), torch.zeros(d, **f32)
    dB, dC = torch.zeros(Bk.shape, **f32), torch.zeros(Ck.shape, **f32)
    grid = (b * g, triton.cdiv(d // g, cfg["BLOCK_D"]))
    selective_scan_bwd_kernel[grid](
        u, delta, A, Bk, Ck, *tuned.optional(D, z, delta_bias, seq_idx, dummy=A), dout, states,
        du, ddelta, dA, dB, dC, dD, *tuned.optional(dz, dummy=A), dbias,
        l, d, d // g, g, *tuned._bc_strides(Bk), *tuned._bc_strides(Ck),
        *tuned._bc_strides(dB), *tuned._bc_strides(dC),
        N=n, NP=triton.next_power_of_2(n), CHUNK=_chunk(),
        **tuned.flags(D, z, delta_bias, delta_softplus, B, C, seq_idx), **cfg)
    return tuned.finish_grads(du, ddelta, dA, dB, dC, dD, dz, dbias, B, C, D, delta_bias)


TEACHING = tuned.Kernels("teaching", _forward, _backward)


def selective_scan_teaching(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                            delta_softplus=False, return_last_state=False, seq_idx=None,
                            cu_seqlens=None):
    """out = (C·h + D·x)·silu(z),  h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t — the readable kernels.

    Shapes: exactly those of `mambalearn.triton.selective_scan_fn` (and of
    ``mamba_ssm.selective_scan_fn``): u, delta, z (b, d, l); A (d, n) fp32; B, C (b, n, l),
    (b, g, n, l) or (d, n); D, delta_bias (d,); seq_idx (b, l) or cu_seqlens (k + 1,).
    Differentiable: the backward kernel recomputes h per chunk of CHUNK steps.
    """
    return tuned.run(TEACHING, u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                     return_last_state, seq_idx, cu_seqlens)
