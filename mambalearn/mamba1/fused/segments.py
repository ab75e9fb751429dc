"""A sequence cut into segments that run side by side (chapter 09's last step): the summaries and
the carry of chapters 06 and 14, inside one GPU.

At batch one the tuned kernels have too few programs to fill the GPU: they are parallel over
(batch, channels) and walk the whole sequence. Cut it into S segments of whole chunks instead:

1. summarise every segment but the last, from a zero state (the forward) or a zero adjoint
   (the backward), into one ⊗ element per (b, d, n) — the affine map the segment applies:

       forward   h_end = P_s h_start + E_s,   P_s = Π_{t ∈ s} Ā_t = exp(A Σ_{t ∈ s} Δ_t),
                                               E_s = the state at the segment's end from h = 0
       backward  g_s0 = P'_s g_next + G_s,   P'_s = Π_{t ∈ (s0, e + 1]} Ā_t,
                                               G_s = the adjoint at its first step s0 from g = 0
                                               (g_t = C_t dy_t + Ā_{t+1} g_{t+1}, dy = dout·silu(z))

2. carry: the state entering each segment folds the summaries before it with ⊗ (chapter 14's
   ring pass inside one GPU, a few dozen multiply-adds a value: `tile.fold_summaries`, in one
   small launch for the forward, `_fold_kernel`, and at the top of each backward program);
3. finish: the forward and backward kernels run every segment at once from its carried start.

The summaries may be finer than the segments (each summarised segment cut into k pieces,
`config.summary_split`): their one-warp programs need more of them to fill the GPU than the
finishing kernels do; the fold then runs over the pieces. Each Ā is computed twice in every
segment but the last (its summary and its finish): the price of filling the machine. A packed
sequence starting inside a segment zeroes its P (the kernels' Ā_t = 0 at a start).

The summary kernels use the recurrent layout (``recurrent``): one channel a thread, all
its n states in registers, step by step — per (step, state) one exp2 and three multiply-adds —
with the next tile's inputs and the next step's B (C) row loaded ahead.

Two switches of `config.Summary` (off by default; the GPU scripts time them): ``l1_prefetch`` asks
for the next tile's B rows in L1 at each tile's top (`tile.prefetch_run`: the per-step loads then
hit L1, not L2), ``fast_softplus`` computes Δ's softplus from the exp unit's 2ˣ and log₂
(`tile.softplus_fast`). The finishing kernels take the same two in `config.Forward`.

Shapes: u, delta, z, dout (b, d, l); A (d, n) fp32; B, C fp32 (b, g, l, n) (the recurrent
layout) or fixed (d, n); summaries (M, b, d, n) fp32, M = (S − 1)·k.
"""

import torch
import triton
import triton.language as tl

from mambalearn.mamba1.fused.recurrent import bt_layout
from mambalearn.mamba1.fused.tile import (
    column,
    floor_A,
    fold_summaries,
    l1_sectors,
    ld,
    load_step,
    prefetch_run,
    seq_start,
    softplus_fast,
)
from mambalearn.triton.common import LOG2E, softplus


@triton.jit
def _channels(pid_bg, pid_d, d, dpg, g, BLOCK_D: tl.constexpr, NP: tl.constexpr,
              V: tl.constexpr):
    """A program's channels and its state tile's index: (bi, gi, d_idx, d_mask, bd_row, n3,
    zero3); the tile is (BLOCK_D, NP / V, V) with every state of a channel in one thread."""
    bi, gi = pid_bg // g, pid_bg % g  # batch row, group of B/C
    d_loc = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)  # (BLOCK_D,) channel inside its group
    d_mask = d_loc < dpg
    d_idx = gi * dpg + d_loc  # (BLOCK_D,)
    n3 = tl.arange(0, NP // V)[None, :, None] * V + tl.arange(0, V)[None, None, :]  # (1, NP/V, V)
    zero3 = 0 * d_idx[:, None, None]  # (BLOCK_D, 1, 1)
    bd_row = (bi * d + d_idx).to(tl.int64)  # (BLOCK_D,) the (b, d) row
    return bi, gi, d_idx, d_mask, bd_row, n3, zero3


@triton.jit
def _state_summary_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, bias_ptr, seq_ptr,  # inputs: u, Δ (b, d, l); A; B
    E_ptr, P_ptr,  # outputs (M, b, d, n) fp32: E_s and P_s of the pieces 0 … M − 1
    l, d, dpg, g, seg_len, bdn,  # length, channels, per group, groups, a piece's steps, b·d·n
    stride_Bb, stride_Bg, stride_Bl,  # B transposed (b, g, l, n); fixed (d, n): contiguous
    N: tl.constexpr, NP: tl.constexpr, V: tl.constexpr,  # states, NS padded, vector width
    NS: tl.constexpr,  # states a program: N, or N / k with k programs a channel tile
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,  # channels (one a thread) × steps a tile
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, VAR_B: tl.constexpr,
    HAS_SEQ: tl.constexpr, EVEN_D: tl.constexpr, PREFETCH: tl.constexpr,
    FAST_SP: tl.constexpr,  # softplus from MUFU's ex2 and lg2 (`tile.softplus_fast`)
    L1_SECTORS: tl.constexpr,  # > 0: at each tile's top the next tile's B rows are asked into L1
):                           # (`tile.prefetch_run`, that many sectors); 0: not
    s = tl.program_id(2)  # the piece (never in the last segment: it is whole, inside l)
    pid_d = tl.program_id(1)
    if NS < N:  # a channel tile's states cut over N / NS programs (they are independent here)
        n0 = (pid_d % (N // NS)) * NS  # this program's first state
        pid_d = pid_d // (N // NS)
    bi, gi, d_idx, d_mask, bd_row, n3, zero3 = _channels(
        tl.program_id(0), pid_d, d, dpg, g, BLOCK_D, NP, V)
    nn = n3  # (1, NP/V, V) the state indices
    if NS < N:
        nn = n3 + n0
    EVEN_N: tl.constexpr = EVEN_D and NS == NP
    n_mask = d_mask[:, None, None] & (n3 < NS)  # (BLOCK_D, NP/V, V)
    cols = tl.arange(0, BLOCK_L)
    # A·log2 e, A floored (``tile.floor_A``): A = −∞ times a Δ of 0 (past l) is no NaN
    A2 = floor_A(ld(A_ptr + d_idx[:, None, None] * N + nn, n_mask, EVEN_N)) * LOG2E
    bias_v = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_BIAS:
        bias_v = ld(bias_ptr + d_idx, d_mask, EVEN_D)
    Bt = tl.zeros((BLOCK_D, NP // V, V), dtype=tl.float32)
    if not VAR_B:  # fixed (d, n): one tile for every step
        Bt = ld(B_ptr + d_idx[:, None, None] * N + nn, n_mask, EVEN_N)
    Bv3 = B_ptr + bi * stride_Bb + gi * stride_Bg + nn + zero3  # this program's (l, n) of B
    t_lo = s * seg_len
    B_nx = Bt
    if PREFETCH and VAR_B:
        B_nx = load_step(Bv3, t_lo, stride_Bl, l, zero3, n3, NS, NP, True)
    H = tl.zeros((BLOCK_D, NP // V, V), dtype=tl.float32)  # the state from h = 0
    sum_dt = tl.zeros((BLOCK_D,), dtype=tl.float32)  # Σ Δ over the segment
    fresh = tl.zeros((BLOCK_D,), dtype=tl.float32)  # > 0 once a packed sequence starts in it
    row = (bd_row * l)[:, None] + cols[None, :]  # (BLOCK_D, BLOCK_L) a tile's offsets at step 0
    mask = d_mask[:, None] & (cols < BLOCK_L)[None, :]  # (time is inside l: a whole piece)
    t_end = t_lo + seg_len
    x_nx = ld(u_ptr + row + t_lo, mask, EVEN_D)  # the tile's inputs one tile ahead
    dt_nx = ld(delta_ptr + row + t_lo, mask, EVEN_D)
    t0 = t_lo
    while t0 < t_end:  # (`while`: triton-lang/triton#9171, see ``forward``)
        t0 = tl.multiple_of(t0, BLOCK_L)
        t = t0 + cols  # (BLOCK_L,)
        x, dt = x_nx.to(tl.float32), dt_nx.to(tl.float32)
        nxt = tl.minimum(t0 + BLOCK_L, t_end - BLOCK_L)  # (the last tile reloads itself)
        x_nx = ld(u_ptr + row + nxt, mask, EVEN_D)
        dt_nx = ld(delta_ptr + row + nxt, mask, EVEN_D)
        if L1_SECTORS > 0 and VAR_B:  # the next tile's rows of B: L1 hits a tile from now
            prefetch_run(B_ptr + bi * stride_Bb + gi * stride_Bg, (t0 + BLOCK_L) * stride_Bl,
                          BLOCK_L * stride_Bl, (l - 1) * stride_Bl + N - 1, L1_SECTORS)
        if HAS_BIAS:
            dt += bias_v[:, None]
        if SOFTPLUS:
            if FAST_SP:
                dt = softplus_fast(dt)
            else:
                dt = softplus(dt)
        dtx = dt * x  # (BLOCK_D, BLOCK_L)
        sum_dt += tl.sum(dt, axis=1)
        if HAS_SEQ:  # (BLOCK_D, BLOCK_L) 1.0 where a packed sequence starts
            start = seq_start(seq_ptr + bi * l + 0 * d_idx[:, None], t[None, :], l,
                              HAS_SEQ).to(tl.float32)
            fresh += tl.sum(start, axis=1)
        for k in tl.static_range(BLOCK_L):  # h_t = Ā_t h_{t−1} + Δ_t B_t x_t, every state
            if VAR_B:
                if PREFETCH:  # step t + 1's row now (within the segment: t_lo + seg_len ≤ l)
                    nxt = tl.minimum(t0 + k + 1, t_lo + seg_len - 1)
                    Bt, B_nx = B_nx, load_step(Bv3, nxt, stride_Bl, l, zero3, n3, NS, NP, True)
                else:
                    Bt = load_step(Bv3, t0 + k, stride_Bl, l, zero3, n3, NS, NP, True)
            a = tl.exp2(column(dt, cols, k)[:, None, None] * A2)  # Ā_t
            if HAS_SEQ:
                a = tl.where(column(start, cols, k)[:, None, None] > 0, 0.0, a)
            H = a * H + column(dtx, cols, k)[:, None, None] * Bt
        t0 += BLOCK_L
    P = tl.exp2(sum_dt[:, None, None] * A2)  # Π Ā = exp(A Σ Δ)
    if HAS_SEQ:
        P = tl.where(fresh[:, None, None] > 0, 0.0, P)  # a start forgets what came before
    at = s.to(tl.int64) * bdn + bd_row[:, None, None] * N + nn  # in (M, b, d, n)
    tl.store(E_ptr + at, H, mask=n_mask)
    tl.store(P_ptr + at, P, mask=n_mask)


@triton.jit
def _load_dt(delta_ptr, bias_v, offs, mask, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """Δ = softplus(δ + bias) at ``offs``, 0 where masked (past the end: Ā = 1)."""
    dt = tl.load(delta_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        dt += bias_v
    if SOFTPLUS:
        dt = softplus(dt)
    return tl.where(mask, dt, 0.0)


@triton.jit
def _adjoint_summary_kernel(
    delta_ptr, A_ptr, C_ptr, z_ptr, bias_ptr, seq_ptr, dout_ptr,  # inputs
    G_ptr, P_ptr,  # outputs (M, b, d, n) fp32: G_s and P'_s of pieces first … first + M − 1
    l, d, dpg, g, seg_len, bdn, first,  # length, channels, per group, groups, a piece's
                                        # steps, b·d·n, the first piece (segment 0's: none)
    stride_Cb, stride_Cg, stride_Cl,  # C transposed (b, g, l, n); fixed (d, n): contiguous
    N: tl.constexpr, NP: tl.constexpr, V: tl.constexpr,  # states, padded, vector width
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,  # channels (one a thread) × steps a tile
    HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, VAR_C: tl.constexpr,
    HAS_SEQ: tl.constexpr, EVEN_D: tl.constexpr, PREFETCH: tl.constexpr,
):
    j = tl.program_id(2)
    s = j + first  # the piece (none in the first segment: nothing comes before to carry into)
                   # (a piece past l is empty: G = 0, P' = 1, the ⊗ identity)
    bi, gi, d_idx, d_mask, bd_row, n3, zero3 = _channels(
        tl.program_id(0), tl.program_id(1), d, dpg, g, BLOCK_D, NP, V)
    EVEN_N: tl.constexpr = EVEN_D and N == NP
    n_mask = d_mask[:, None, None] & (n3 < N)
    cols = tl.arange(0, BLOCK_L)
    A2 = floor_A(ld(A_ptr + d_idx[:, None, None] * N + n3, n_mask, EVEN_N)) * LOG2E  # as above
    bias_v = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_BIAS:
        bias_v = ld(bias_ptr + d_idx, d_mask, EVEN_D)
    Ct = tl.zeros((BLOCK_D, NP // V, V), dtype=tl.float32)
    if not VAR_C:
        Ct = ld(C_ptr + d_idx[:, None, None] * N + n3, n_mask, EVEN_N)
    Cv3 = C_ptr + bi * stride_Cb + gi * stride_Cg + n3 + zero3
    row = bd_row * l
    t_lo = s * seg_len
    t_hi = tl.minimum(t_lo + seg_len, l)
    # Δ_{t+1} and "a sequence starts at t + 1" for the segment's last step: the next segment's
    # first (Δ = 0 past the end)
    dt_nx = _load_dt(delta_ptr, bias_v, row + t_hi, tl.where(t_hi < l, d_mask, False), HAS_BIAS,
                     SOFTPLUS)
    st_nx = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_SEQ:
        st_nx = seq_start(seq_ptr + bi * l, t_hi + 0 * d_idx, l, HAS_SEQ).to(tl.float32)
    last_t = t_hi - 1
    C_nx = Ct
    if PREFETCH and VAR_C:
        C_nx = load_step(Cv3, last_t, stride_Cl, l, zero3, n3, N, NP, False)
    G = tl.zeros((BLOCK_D, NP // V, V), dtype=tl.float32)  # the adjoint from g = 0
    sum_dt = tl.zeros((BLOCK_D,), dtype=tl.float32)  # Σ Δ_τ over τ ∈ (s0, e + 1]
    fresh = tl.zeros((BLOCK_D,), dtype=tl.float32)  # > 0 once a start lies in (s0, e + 1]
    t0 = (last_t // BLOCK_L) * BLOCK_L
    while t0 >= t_lo:  # tiles from the last to the first
        t0 = tl.multiple_of(t0, BLOCK_L)
        t = t0 + cols
        offs = row[:, None] + t[None, :]
        mask = d_mask[:, None] & (t < l)[None, :]
        dy = tl.load(dout_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_Z:
            zz = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            dy = dy * zz * tl.sigmoid(zz)  # ∂out/∂y = silu(z)
        dt = _load_dt(delta_ptr, bias_v[:, None], offs, mask, HAS_BIAS, SOFTPLUS)
        start = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
        if HAS_SEQ:
            start = seq_start(seq_ptr + bi * l + 0 * d_idx[:, None], t[None, :], l,
                              HAS_SEQ).to(tl.float32)
        for kk in tl.static_range(BLOCK_L):  # g_t = C_t dy_t + Ā_{t+1} g_{t+1}, backwards
            k = BLOCK_L - 1 - kk
            ok = t0 + k < l  # (the last tile of the row may end past l: nothing there)
            if VAR_C:
                if PREFETCH:  # step t − 1's row now (the first step reloads its own)
                    Ct, C_nx = C_nx, load_step(Cv3, tl.maximum(t0 + k - 1, t_lo), stride_Cl, l,
                                               zero3, n3, N, NP, False)
                else:
                    Ct = load_step(Cv3, t0 + k, stride_Cl, l, zero3, n3, N, NP, False)
            a_nx = tl.exp2(dt_nx[:, None, None] * A2)  # Ā_{t+1}
            if HAS_SEQ:
                a_nx = tl.where(st_nx[:, None, None] > 0, 0.0, a_nx)
            G_new = a_nx * G + column(dy, cols, k)[:, None, None] * Ct
            G = tl.where(ok, G_new, G)
            sum_dt += tl.where(ok, dt_nx, 0.0)
            fresh += tl.where(ok, st_nx, 0.0)
            dt_nx = tl.where(ok, column(dt, cols, k), dt_nx)  # Δ_t is the next step's Δ_{t+1}
            st_nx = tl.where(ok, column(start, cols, k), st_nx)
        t0 -= BLOCK_L
    P = tl.exp2(sum_dt[:, None, None] * A2)  # Π_{(s0, e+1]} Ā
    if HAS_SEQ:
        P = tl.where(fresh[:, None, None] > 0, 0.0, P)
    at = j.to(tl.int64) * bdn + bd_row[:, None, None] * N + n3  # in (M, b, d, n)
    tl.store(G_ptr + at, G, mask=n_mask)
    tl.store(P_ptr + at, P, mask=n_mask)


@triton.jit
def _fold_kernel(
    E_ptr, P_ptr,  # (M, b, d, n) fp32: the summaries of the pieces of segments 0 … S − 2
    starts_ptr,  # (S, b, d, n) fp32: slot 0 holds h_{−1} (untouched); slots 1 … S − 1 written
    bdn, pieces,  # b·d·n (a slot), pieces a segment
    BLOCK: tl.constexpr,
):
    """starts[s] = the pieces 0 … s·k − 1 folded with ⊗ (h_{−1} is in piece 0 already)."""
    s = tl.program_id(1) + 1  # the segment
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,) in a slot
    mask = at < bdn
    h = fold_summaries(E_ptr, P_ptr, at, mask, s * pieces, bdn)
    tl.store(starts_ptr + s.to(tl.int64) * bdn + at, h, mask=mask)


def _launch_args(u, d, g, n, summary, split=1):
    """(grid's first two axes, the tile's constexprs) shared by both summary launches; ``split``
    programs a channel tile, n / split states each (the forward's only)."""
    b = u.shape[0]
    np2 = triton.next_power_of_2(n // split)
    grid = (b * g, triton.cdiv(d // g, summary.block_d) * split)
    return grid, dict(N=n, NP=np2, V=min(4, np2), BLOCK_D=summary.block_d,
                      BLOCK_L=summary.block_l, EVEN_D=(d // g) % summary.block_d == 0,
                      PREFETCH=summary.prefetch, num_warps=summary.num_warps)


def _l1(summary, B, n):
    """L1_SECTORS of a summary launch: the sectors of a tile of B's rows, if ``l1_prefetch``."""
    return l1_sectors(summary.block_l * n) if summary.l1_prefetch and B.ndim > 2 else 0


def _pieces(like, shape, S, k):
    """M = (S − 1)·k and two empty (M, b, d, n) fp32 summaries on ``like``'s device."""
    b, d, l, n, g = shape
    M = (S - 1) * k
    X = torch.empty((M, b, d, n), device=like.device, dtype=torch.float32)
    return M, X, torch.empty_like(X)


def _strides(X):
    return (X.stride(0), X.stride(1), X.stride(2)) if X.ndim == 4 else (0, 0, 0)


def forward_starts(u, delta, A, B, delta_bias, flags, seq_idx, initial_state, shape, S,
                   seg_len, k, summary):
    """The state entering every segment, (S, b, d, n) fp32: h_{−1} (or 0) for the first, for
    the others the summaries (E, P) of the (S − 1)·k pieces before them, folded with ⊗ (h_{−1}
    folded into the first piece: E_0 ← P_0 h_{−1} + E_0)."""
    b, d, l, n, g = shape
    starts = torch.zeros((S, b, d, n), device=u.device, dtype=torch.float32)
    if initial_state is not None:
        starts[0] = initial_state
    if S == 1:
        return starts
    split = summary.state_split
    if not isinstance(split, int) or split < 1 or n % split:
        raise ValueError(f"summary.state_split must be an int ≥ 1 that divides n = {n}, got "
                         f"{split!r}")
    M, E, P = _pieces(u, shape, S, k)
    Bk = bt_layout(B)
    grid, tile = _launch_args(u, d, g, n, summary, split)
    f = flags  # the call's switches (``args.flags``): this kernel reads five
    _state_summary_kernel[(*grid, M)](
        u.contiguous(), delta.contiguous(), A.contiguous(), Bk,  # inputs
        delta_bias if delta_bias is not None else A,  # optional inputs (unread where absent)
        seq_idx if seq_idx is not None else A,
        E, P,  # outputs
        l, d, d // g, g, seg_len // k, b * d * n,  # length, channels, per group, groups, a
                                                   # piece's steps, a piece's slot
        *_strides(Bk),  # strides of the transposed B (b, g, l); zeros if fixed
        HAS_BIAS=f["HAS_BIAS"], SOFTPLUS=f["SOFTPLUS"], VAR_B=f["VAR_B"],
        HAS_SEQ=f["HAS_SEQ"], FAST_SP=summary.fast_softplus, L1_SECTORS=_l1(summary, B, n),
        NS=n // split, **tile)
    if initial_state is not None:
        E[0] += P[0] * initial_state
    BLOCK = 1024
    _fold_kernel[(triton.cdiv(b * d * n, BLOCK), S - 1)](
        E, P, starts, b * d * n, k, BLOCK=BLOCK, num_warps=4)
    return starts


def adjoint_summaries(dout, delta, A, C, z, delta_bias, flags, seq_idx, dlast, shape, S,
                      seg_len, k, summary):
    """(G, P) (M, b, d, n) fp32 of the M = (S − 1)·k pieces of segments 1 … S − 1, the last
    state's gradient folded into the last (G_{M−1} ← G_{M−1} + P_{M−1} dlast): what the
    backward kernel folds the adjoint entering each segment from."""
    b, d, l, n, g = shape
    M, G, P = _pieces(dout, shape, S, k)
    Ck = bt_layout(C)
    grid, tile = _launch_args(dout, d, g, n, summary)
    f = flags  # the call's switches (``args.flags``): this kernel reads five
    _adjoint_summary_kernel[(*grid, M)](
        delta.contiguous(), A.contiguous(), Ck,  # inputs
        z.contiguous() if z is not None else A,  # optional inputs (unread where absent)
        delta_bias if delta_bias is not None else A,
        seq_idx if seq_idx is not None else A,
        dout.contiguous(),
        G, P,  # outputs
        l, d, d // g, g, seg_len // k, b * d * n, k,  # length, channels, per group, groups,
                                                      # a piece, its slot, the first piece
        *_strides(Ck),  # strides of the transposed C (b, g, l); zeros if fixed
        HAS_Z=f["HAS_Z"], HAS_BIAS=f["HAS_BIAS"], SOFTPLUS=f["SOFTPLUS"], VAR_C=f["VAR_C"],
        HAS_SEQ=f["HAS_SEQ"], **tile)
    if dlast is not None:
        G[-1] += P[-1] * dlast
    return G, P
