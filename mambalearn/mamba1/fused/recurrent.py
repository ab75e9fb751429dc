"""The recurrent forward kernel of the tuned Mamba-1 selective scan (chapter 09), and its launcher.

    Ā_t = exp(Δ_t A)      h_t = Ā_t h_{t−1} + Δ_t B_t x_t      y_t = C_t h_t + D x_t
    out_t = y_t · silu(z_t)

Another tile axis than ``forward``'s: no scan along time at all. Each thread owns one channel
and holds all its n states in registers; it walks time step by step, h ← Ā_t h + B̄_t x_t, one
FFMA per (step, state) on a chain that the n independent states interleave (n-way ILP instead of
a parallel scan's extra work and shuffles), and y_t = Σ_n C_t,n h_n is a sum inside the thread.
Per (step, state): one exp2, two FMUL, two FFMA — the floor is the exp unit, not the scan.
Inputs come in (BLOCK_D, BLOCK_L) tiles: a thread's BLOCK_L steps of u, Δ, z are one vector
load and column k of the tile is a register, so nothing crosses lanes; B_t and C_t (b, g, l, n)
are transposed once by the launcher so that a thread reads its n values as 16-byte vectors (every
lane of a warp the same address: one L1 broadcast).

Layout trick (Triton picks layouts from the loads): the state tile is (BLOCK_D, NP / V, V) with
V states contiguous in memory along the last axis only, so the coalescing puts the 32 lanes along
the channels and every state of a channel in one thread; B_t, C_t are loaded with the same 3-D
pointer shape (a zero offset along the channels) so they land in that layout, not a new one.

Shapes: u, delta, z, out (b, d, l); A (d, n) fp32; B, C fp32 (b, g, l, n) (transposed) or fixed
(d, n); D, bias (d,); states (b, d, c, n) fp32, the state entering each chunk; last (b, d, n) fp32:
h_{−1} in (zeros unless an initial state is given), h_{l−1} out. Needs CHUNK a multiple of
BLOCK_L. Figures: NOTES.
"""

import torch
import triton
import triton.language as tl

from mambalearn import device
from mambalearn.mamba1 import config as cfgs
from mambalearn.mamba1.fused.tile import (
    column,
    l1_sectors,
    ld,
    load_step,
    prefetch_run,
    seq_start,
    softplus_fast,
    st,
)
from mambalearn.triton.common import LOG2E, softplus


@triton.jit
def _load_tile(u_ptr, delta_ptr, z_ptr, row, cols, t0, l, d_mask, HAS_Z: tl.constexpr,
               EVEN: tl.constexpr):
    """u, delta, z (if HAS_Z, else delta again) of the tile at step t0, as stored (BLOCK_D,
    BLOCK_L)."""
    offs = row[:, None] + t0 + cols[None, :]
    mask = d_mask[:, None] & (t0 + cols < l)[None, :]
    x = ld(u_ptr + offs, mask, EVEN)
    dt = ld(delta_ptr + offs, mask, EVEN)
    zz = dt
    if HAS_Z:
        zz = ld(z_ptr + offs, mask, EVEN)
    return x, dt, zz


@triton.jit
def _fwd_rec_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr,  # inputs: u, delta (b, d, l); A (d, n); B, C
    D_ptr, z_ptr, bias_ptr, seq_ptr,  # optional inputs (unread where absent)
    out_ptr, states_ptr,  # outputs: out (b, d, l); states (b, d, c, n) fp32
    last_ptr,  # (S, b, d, n) fp32: in, the state entering each segment (zeros if none is
               # given); out, the state leaving it (h_{l−1} in the last)
    l, d, dpg, g,  # length, channels, channels per group, groups
    seg_len, bdn,  # steps a segment (a multiple of CHUNK; l if one), b·d·n (a slot of last)
    stride_Bb, stride_Bg, stride_Bl,  # B transposed (b, g, l, n); fixed (d, n) B: contiguous
    stride_Cb, stride_Cg, stride_Cl,  # C: likewise
    N: tl.constexpr, NP: tl.constexpr, V: tl.constexpr,  # states, padded, and the vector width
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,  # channels (one per thread) × steps per tile
    CHUNK: tl.constexpr,  # steps between stored states (a multiple of BLOCK_L)
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_SEQ: tl.constexpr,
    EVEN_L: tl.constexpr, EVEN_D: tl.constexpr,  # the tile divides l / dpg: no masks there
    PREFETCH: tl.constexpr,  # load each step's B and C rows one step ahead
    FAST_SP: tl.constexpr,  # softplus from MUFU's ex2 and lg2 (`tile.softplus_fast`)
    L1_SECTORS: tl.constexpr,  # > 0: at each tile's top the next tile's B and C rows are asked
):                           # into L1 (`tile.prefetch_run`, that many sectors each); 0: not
    EVEN: tl.constexpr = EVEN_L and EVEN_D
    EVEN_N: tl.constexpr = EVEN_D and N == NP  # the state tile needs no mask
    pid_bg, pid_d, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bi, gi = pid_bg // g, pid_bg % g  # batch row, group of B/C
    t_lo = pid_s * seg_len  # this program's segment of the sequence: steps t_lo … t_hi − 1
    t_hi = tl.minimum(t_lo + seg_len, l)
    last_ptr += pid_s.to(tl.int64) * bdn  # its slot of `last`
    d_loc = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)  # (BLOCK_D,) channel inside its group
    d_mask = d_loc < dpg
    d_idx = gi * dpg + d_loc  # (BLOCK_D,) channel index
    cols = tl.arange(0, BLOCK_L)  # (BLOCK_L,) step inside the tile
    n3 = tl.arange(0, NP // V)[None, :, None] * V + tl.arange(0, V)[None, None, :]  # (1, NP/V, V)
    d3 = d_idx[:, None, None]  # (BLOCK_D, 1, 1)
    zero3 = 0 * d3  # (BLOCK_D, 1, 1): gives the per-step B_t, C_t loads the state tile's shape
    n_mask = d_mask[:, None, None] & (n3 < N)  # (BLOCK_D, NP/V, V)
    bd_row = (bi * d + d_idx).to(tl.int64)  # (BLOCK_D,) index of each (b, d) row
    row = bd_row * l  # (BLOCK_D,) start of each row of u/delta/z/out
    nchunks = tl.cdiv(l, CHUNK)
    st3 = bd_row[:, None, None] * nchunks * N + n3  # (BLOCK_D, NP/V, V) in states, chunk 0
    last3 = bd_row[:, None, None] * N + n3  # (BLOCK_D, NP/V, V) in last
    A2 = ld(A_ptr + d3 * N + n3, n_mask, EVEN_N) * LOG2E  # (BLOCK_D, NP/V, V) A·log2 e
    # h, every state of a channel, from `last` (zeros or the initial state). (Read even when it
    # is zeros: the sm_90 build that starts from tl.zeros schedules the B/C loads a median 7
    # instructions before their use and ran 3.5× slower on the H200; see NOTES.)
    H = ld(last_ptr + last3, n_mask, EVEN_N)
    Bt = tl.zeros((BLOCK_D, NP // V, V), dtype=tl.float32)
    if not VAR_B:  # fixed (d, n): one tile for every step
        Bt = ld(B_ptr + d3 * N + n3, n_mask, EVEN_N)
    Ct = tl.zeros((BLOCK_D, NP // V, V), dtype=tl.float32)
    if not VAR_C:
        Ct = ld(C_ptr + d3 * N + n3, n_mask, EVEN_N)
    Bv3 = B_ptr + bi * stride_Bb + gi * stride_Bg + n3 + zero3  # this program's (l, n) of B
    Cv3 = C_ptr + bi * stride_Cb + gi * stride_Cg + n3 + zero3
    bias_v = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_BIAS:
        bias_v = ld(bias_ptr + d_idx, d_mask, EVEN_D)
    D_v = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_D:
        D_v = ld(D_ptr + d_idx, d_mask, EVEN_D)
    # the tiles' inputs are loaded one tile ahead: a `while` is not software-pipelined, and
    # with one warp per scheduler nothing else would hide the DRAM latency at each tile's top
    last_t0 = ((t_hi - 1) // BLOCK_L) * BLOCK_L  # the last tile (prefetched again at the end)
    x_nx, dt_nx, z_nx = _load_tile(u_ptr, delta_ptr, z_ptr, row, cols, t_lo, l, d_mask, HAS_Z,
                                   EVEN)
    B_nx = Bt  # (PREFETCH: the next step's rows of B and C)
    C_nx = Ct
    if PREFETCH and VAR_B:
        B_nx = load_step(Bv3, t_lo, stride_Bl, l, zero3, n3, N, NP, EVEN_L)
    if PREFETCH and VAR_C:
        C_nx = load_step(Cv3, t_lo, stride_Cl, l, zero3, n3, N, NP, EVEN_L)
    t0 = t_lo
    while t0 < t_hi:  # (`while`: triton-lang/triton#9171, see ``forward``)
        t0 = tl.multiple_of(t0, BLOCK_L)
        # 1. the tile's inputs, shared by every state: one vector load per thread and tensor
        t = t0 + cols  # (BLOCK_L,)
        mask = d_mask[:, None] & (t < l)[None, :]  # (BLOCK_D, BLOCK_L)
        offs = row[:, None] + t[None, :]
        x, dt, zz = x_nx.to(tl.float32), dt_nx.to(tl.float32), z_nx.to(tl.float32)
        x_nx, dt_nx, z_nx = _load_tile(u_ptr, delta_ptr, z_ptr, row, cols,
                                       tl.minimum(t0 + BLOCK_L, last_t0), l, d_mask, HAS_Z, EVEN)
        if L1_SECTORS > 0:  # the next tile's rows of B and C: L1 hits a tile from now
            if VAR_B:
                prefetch_run(B_ptr + bi * stride_Bb + gi * stride_Bg, (t0 + BLOCK_L) * stride_Bl,
                              BLOCK_L * stride_Bl, (l - 1) * stride_Bl + N - 1, L1_SECTORS)
            if VAR_C:
                prefetch_run(C_ptr + bi * stride_Cb + gi * stride_Cg, (t0 + BLOCK_L) * stride_Cl,
                              BLOCK_L * stride_Cl, (l - 1) * stride_Cl + N - 1, L1_SECTORS)
        if HAS_BIAS:
            dt += bias_v[:, None]
        if SOFTPLUS:
            if FAST_SP:
                dt = softplus_fast(dt)
            else:
                dt = softplus(dt)
        if not EVEN:
            dt = tl.where(mask, dt, 0.0)  # Δ = 0 past the end: Ā = 1, B̄x = 0, the state holds
        dtx = dt * x  # (BLOCK_D, BLOCK_L)
        if HAS_SEQ:  # (BLOCK_D, BLOCK_L): the same in every row, in the tile's layout
            start = seq_start(seq_ptr + bi * l + 0 * d_loc[:, None], t[None, :], l, HAS_SEQ)
        y = tl.zeros_like(x)  # (BLOCK_D, BLOCK_L)
        # 2. the recurrence, one step at a time, every state of the channel in this thread
        for k in tl.static_range(BLOCK_L):
            dt_k = column(dt, cols, k)[:, None, None]  # (BLOCK_D, 1, 1): a register
            dtx_k = column(dtx, cols, k)[:, None, None]
            if VAR_B:
                if PREFETCH:  # step t + 1's row now, used next step (the last one reads l − 1)
                    Bt, B_nx = B_nx, load_step(Bv3, tl.minimum(t0 + k + 1, l - 1), stride_Bl, l,
                                                zero3, n3, N, NP, EVEN_L)
                else:
                    Bt = load_step(Bv3, t0 + k, stride_Bl, l, zero3, n3, N, NP, EVEN_L)
            if VAR_C:
                if PREFETCH:
                    Ct, C_nx = C_nx, load_step(Cv3, tl.minimum(t0 + k + 1, l - 1), stride_Cl, l,
                                                zero3, n3, N, NP, EVEN_L)
                else:
                    Ct = load_step(Cv3, t0 + k, stride_Cl, l, zero3, n3, N, NP, EVEN_L)
            a = tl.exp2(dt_k * A2)  # Ā_t = 2^(Δ·A·log2 e): the one exp per (step, state)
            if HAS_SEQ:
                a = tl.where(column(start.to(tl.float32), cols, k)[:, None, None] > 0, 0.0, a)
            H = a * H + dtx_k * Bt  # h_t = Ā_t h_{t−1} + Δ_t B_t x_t
            y_k = tl.sum(tl.sum(H * Ct, axis=2), axis=1)  # (BLOCK_D,) C_t·h_t, in the thread
            y = tl.where(cols[None, :] == k, y_k[:, None], y)
        # 3. skip, gate, the tile's only write; every CHUNK steps the state for the backward
        if HAS_D:
            y += x * D_v[:, None]
        if HAS_Z:
            y *= zz * tl.sigmoid(zz)
        st(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask, EVEN)
        t1 = t0 + BLOCK_L
        if (t1 % CHUNK == 0) & (t1 < l):
            st(states_ptr + st3 + (t1 // CHUNK) * N, H, n_mask, EVEN_N)
        t0 = t1
    st(last_ptr + last3, H, n_mask, EVEN_N)


def bt_layout(X):
    """B or C for this kernel: fp32, time-varying ones transposed to (b, g, l, n), contiguous."""
    if X.ndim == 2:
        return X.float().contiguous()  # fixed (d, n)
    X = X[:, None] if X.ndim == 3 else X  # (b, 1, n, l)
    return X.float().transpose(-1, -2).contiguous()  # (b, g, l, n)


def forward(u, delta, A, B, C, D, z, delta_bias, flags, seq_idx, starts, seg_len, shape,
            config):
    """Launch the recurrent forward over S = len(starts) segments of ``seg_len`` steps, each
    from its entering state in ``starts`` (S, b, d, n) fp32 (None: one segment from h = 0).
    Returns out, states (b, d, c, n) and last (b, d, n) fp32."""
    b, d, l, n, g = shape
    fc, q, interp = config.forward, config.chunk, device.interpreted()
    u, delta, A = u.contiguous(), delta.contiguous(), A.contiguous()
    z = z.contiguous() if z is not None else None
    Bk, Ck = bt_layout(B), bt_layout(C)  # fp32 (b, g, l, n) or (d, n)
    sB = (Bk.stride(0), Bk.stride(1), Bk.stride(2)) if Bk.ndim == 4 else (0, 0, 0)
    sC = (Ck.stride(0), Ck.stride(1), Ck.stride(2)) if Ck.ndim == 4 else (0, 0, 0)
    np2 = triton.next_power_of_2(n)
    out = torch.empty_like(u)
    states = torch.empty((b, d, triton.cdiv(l, q), n), device=u.device, dtype=torch.float32)
    # the state entering each segment in, the one leaving it out (zeros when nothing is given)
    last = starts if starts is not None else \
        torch.zeros((1, b, d, n), device=u.device, dtype=torch.float32)
    states[:, :, 0] = last[0]  # h_{−1}
    even_l, even_d = cfgs.even_flags(fc.even, l, d // g, fc.block_l, fc.block_d)
    _fwd_rec_kernel[(b * g, triton.cdiv(d // g, fc.block_d), last.shape[0])](
        u, delta, A, Bk, Ck,  # inputs
        D if D is not None else A,  # optional inputs: A stands in for absent ones (unread)
        z if z is not None else A,
        delta_bias if delta_bias is not None else A,
        seq_idx if seq_idx is not None else A,
        out, states,  # outputs
        last,  # the state entering each segment in, the one leaving it out
        l, d, d // g, g,  # length, channels, channels per group, groups
        seg_len, b * d * n,  # steps a segment, a slot of `last`
        *sB,  # strides of the transposed B (b, g, l); zeros if fixed
        *sC,  # strides of the transposed C
        N=n, NP=np2, V=min(4, np2), BLOCK_D=fc.block_d, BLOCK_L=fc.block_l, CHUNK=q,
        **flags,  # HAS_D … HAS_SEQ, resolved once (``args.flags``)
        EVEN_L=even_l, EVEN_D=even_d, PREFETCH=fc.prefetch,
        FAST_SP=fc.fast_softplus, L1_SECTORS=l1_sectors(fc.block_l * n) if fc.l1_prefetch else 0,
        num_warps=fc.num_warps, **cfgs.compile_options(fc.maxnreg, interp))
    return out, states, last[-1]
