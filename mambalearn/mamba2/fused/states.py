"""Chunk states in one kernel (chapter 11): chapter 10's stages 3 and 4, the state in registers.

Chapter 10 computes each chunk's state S_c in one kernel, writes it to memory in float32, and runs
the short scan over chunks in another:

    S_c     = Σ_s w_s x_s B_sᵀ,   w_s = exp(a_last − a_s) Δ_s         (chunk state, (p, n))
    H_{c+1} = exp(a_last) H_c + S_c                                    (state passing)

Here one program owns a (BLOCK_P, BLOCK_N) tile of the state of one (batch, head) and walks the
chunks in order: it forms S_c with the tensor cores, adds it to the state it holds in float32
registers, and writes out only what the output kernel reads, the state entering each chunk (in
x's dtype, as chapter 10 does, since the output kernel's product takes it in that dtype). The
float32 S_c never reaches memory, and the chain over chunks needs no other program: no ordering,
no atomics. Δ and a = dA_cs come from chapter 10's ``chunk_cumsum`` (a launch of a few µs: forming
them here would cost each program a softplus and a log per step, ~40 instructions each).
(The FLA library splits its chunked linear attention the same way: ``chunk_fwd_h`` walks the
chunks for the states, ``chunk_fwd_o`` computes the outputs of all chunks in parallel.)

The tile is held transposed, (n, p): the product (w ∘ Bᵀ) x then has the n rows as its M side,
the operand scaled by w sits in registers and x goes straight to shared memory. Rounding is
chapter 10's: w B_s is rounded to x's dtype before the product, as ``chunk_state`` does, so both
kernels agree to float32 summation order.

The parallelism is b · h · ⌈p/BLOCK_P⌉ · ⌈n/BLOCK_N⌉ programs (b1 h80 p64 n128 with 64 × 64 tiles:
160), each looping over l / BLOCK_K blocks; their loads do not depend on the state, so the
software pipeline keeps the next blocks' loads in flight while the product runs.

Two kernels do this. ``_chunk_states_kernel`` (pointer loads, BLOCK_K steps a loop trip) is the
one the backward's recompute uses. ``_chunk_states_tma_kernel`` (``config.States.tma``, the fused
forward's) takes a whole chunk a trip through tensor descriptors (no masks, no chunk-edge
branches; the entering state leaves by a TMA store) and fits in 96 registers, five programs an SM.
Each program's time is the length of its walk, so with few (batch, head) pairs (b1) the walk is
cut into S = ``config.States.split`` segments (``config.split_walk`` chooses S from the shape and
the SM count), in two launches, exactly (both kernels; the backward's recompute cuts its walk
with ``config.Backward.states.split``):

    phase 1   segment 0 walks from H_0 (writing H); segment j > 0 walks from 0 without writing:
              its end state E_j and Γ_j = Π of its chunk decays exp(a_last)
    phase 2   segment j ≥ 1 starts from K_j = Γ_{j−1} K_{j−1} + E_{j−1} (K_1 = E_0) and walks
              again, writing H; the last one writes the final state

— (2S − 1)/S of the work in 2/S of the time, chapter 14's context parallelism inside one GPU; the
stored states are still bf16 of the float32 state, as chapter 10 rounds them. Measurements:
bench/NOTES_ssd.md.
"""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from mambalearn.mamba2.common import (
    check_dot_k,
    check_fused_chunk,
    launch_options,
    stages,
    tile,
)
from mambalearn.mamba2.fused.outputs import tma_ok
from mambalearn.triton.common import LOG2E, exp2_ftz


@triton.jit
def _entering_state(init_ptr, E_base, G_ptr, pid_bh, j, p, nseg, ok_np, np_offs,
                    N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr,
                    HAS_INIT: tl.constexpr, PHASE: tl.constexpr):
    """The float32 (BLOCK_N, BLOCK_P) state a program's walk starts from. PHASE 2: the carry
    into segment j, K_j = Γ_{j−1} K_{j−1} + E_{j−1} (K_1 = E_0), folded from the segments'
    end states at ``E_base`` (segment i: + i · p · N) and decays Γ. Otherwise H_0 (the state
    entering chunk 0; it belongs to sequence 0) for segment 0 and zero for the others — or zero
    without an initial state."""
    if PHASE == 2:
        H = tl.load(E_base, mask=ok_np, other=0.0)
        for i in range(1, j):
            H = tl.load(G_ptr + pid_bh * nseg + i) * H + tl.load(E_base + i * p * N, mask=ok_np,
                                                                 other=0.0)
    elif HAS_INIT:
        if PHASE == 0:
            first = ok_np
        else:  # (where, not &: a block mask with a scalar condition stays a boolean block)
            first = tl.where(j == 0, ok_np, False)
        H = tl.load(init_ptr + pid_bh.to(tl.int64) * p * N + np_offs, mask=first,
                    other=0.0).to(tl.float32)
    else:
        H = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)
    return H


@triton.jit(do_not_specialize=["seg_chunks", "nseg"])
def _chunk_states_kernel(
    x_ptr, B_ptr, dtc_ptr, dacs_ptr, init_ptr, seq_ptr,  # x, B: mamba_ssm's; Δ, dA_cs (b, h, c, q)
    H_ptr,              # out: (b, c, h, p, n), the state entering each chunk, in H's dtype
    final_ptr,          # out: (b, h, p, n) float32, the state after the last chunk
    E_ptr, G_ptr,       # split only: segment end states (b·h·S, p, n), decays Γ (b·h·S,) fp32
    l, h, p, nchunks, heads_per_group, seg_chunks, nseg,
    stride_xb, stride_xl, stride_xh, stride_xp,
    stride_Bb, stride_Bl, stride_Bg, stride_Bn,
    stride_seqb, stride_seql,
    N: tl.constexpr, Q: tl.constexpr,           # state size; chunk length
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_INIT: tl.constexpr, HAS_SEQ: tl.constexpr, EVEN: tl.constexpr, PHASE: tl.constexpr,
):
    """PHASE 0: one program walks all chunks. PHASE 1 / 2: the walk cut in ``nseg`` segments of
    ``seg_chunks`` chunks, as ``_chunk_states_tma_kernel``'s (the module doc)."""
    # program → (batch·head, segment, p-block, n-block), n-block fastest: neighbours read the
    # same x
    pid = tl.program_id(0)
    n_nb, n_pb = tl.cdiv(N, BLOCK_N), tl.cdiv(p, BLOCK_P)
    pid_n, pid_p, pid_rest = pid % n_nb, (pid // n_nb) % n_pb, pid // (n_nb * n_pb)
    if PHASE == 0:
        pid_bh, j = pid_rest, 0
        c0, c1 = 0, nchunks
    else:
        if PHASE == 1:
            pid_bh, j = pid_rest // nseg, pid_rest % nseg
        else:
            pid_bh, j = pid_rest // (nseg - 1), 1 + pid_rest % (nseg - 1)
        c0 = j * seg_chunks  # this program's chunks: [c0, c1)
        c1 = tl.minimum(c0 + seg_chunks, nchunks)
    pid_b, pid_h = pid_bh // h, pid_bh % h
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok_np = (offs_n[:, None] < N) & (offs_p[None, :] < p)
    np_offs = offs_p[None, :] * N + offs_n[:, None]  # (BLOCK_N, BLOCK_P) inside one (p, n) state
    E_base = E_ptr + pid_bh.to(tl.int64) * nseg * p * N + np_offs  # segment i: + i · p · N
    H = _entering_state(init_ptr, E_base, G_ptr, pid_bh, j, p, nseg, ok_np, np_offs, N, BLOCK_N,
                        BLOCK_P, HAS_INIT, PHASE)
    if PHASE == 1:  # only the first segment publishes the states it walks through
        ok_pub = tl.where(j == 0, ok_np, False)
    else:
        ok_pub = ok_np
    S = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)  # Sᵀ of the current chunk
    x_base = x_ptr + pid_b.to(tl.int64) * stride_xb + pid_h * stride_xh
    B_base = B_ptr + pid_b.to(tl.int64) * stride_Bb + (pid_h // heads_per_group) * stride_Bg
    seq_base = seq_ptr + pid_b.to(tl.int64) * stride_seqb
    KB: tl.constexpr = Q // BLOCK_K  # blocks per chunk
    a_last = 0.0  # dA_cs at the chunk's last step (Δ = 0 past l, so index q − 1 is the end)
    seq_last = 0  # the sequence running at the chunk's end (seq_idx)
    seq_prev = 0  # … and at the previous chunk's end; H_0 belongs to sequence 0
    if HAS_SEQ:
        if PHASE != 0:
            seq_prev = tl.load(seq_base + (c0 * Q - 1) * stride_seql, mask=c0 > 0, other=0)
    gamma = 1.0  # Γ: the product of the chunk decays so far (a cut walk)
    for it in range(c0 * KB, c1 * KB):  # one flat loop over (chunk, block): one pipeline
        c = it // KB
        kk = it % KB
        cs = (pid_bh * nchunks + c).to(tl.int64) * Q  # this chunk's row of Δ and dA_cs
        if kk == 0:  # a new chunk: publish the state entering it
            H_row = ((pid_b * nchunks + c) * h + pid_h).to(tl.int64) * p * N
            tl.store(H_ptr + H_row + np_offs, H.to(H_ptr.dtype.element_ty), mask=ok_pub)
            a_last = tl.load(dacs_ptr + cs + Q - 1)
            if HAS_SEQ:
                seq_last = tl.load(seq_base + (tl.minimum((c + 1) * Q, l) - 1) * stride_seql)
        # this block's share of S_cᵀ: (w ∘ Bᵀ) x, w = decay to the chunk's end times Δ
        offs_k = kk * BLOCK_K + tl.arange(0, BLOCK_K)
        t = c * Q + offs_k
        ok = t < l
        w = tl.exp(tl.minimum(a_last - tl.load(dacs_ptr + cs + offs_k), 0.0))
        w *= tl.load(dtc_ptr + cs + offs_k)
        if HAS_SEQ:  # only steps of the sequence running at the chunk's end count
            seq_k = tl.load(seq_base + t * stride_seql, mask=ok, other=-1)
            w = tl.where(seq_k == seq_last, w, 0.0)
        t0 = (c * Q + kk * BLOCK_K).to(tl.int64)  # the block's first step (64-bit: past 2³¹)
        offs_b = tl.arange(0, BLOCK_K)
        B_ptrs = B_base + t0 * stride_Bl + offs_b[None, :] * stride_Bl + offs_n[:, None] * stride_Bn
        x_ptrs = x_base + t0 * stride_xl + offs_b[:, None] * stride_xl + offs_p[None, :] * stride_xp
        if EVEN:  # no tile reaches past l, n or p
            BT = tl.load(B_ptrs)  # (BLOCK_N, BLOCK_K)
            xk = tl.load(x_ptrs)  # (BLOCK_K, BLOCK_P)
        else:
            BT = tl.load(B_ptrs, mask=ok[None, :] & (offs_n[:, None] < N), other=0.0)
            xk = tl.load(x_ptrs, mask=ok[:, None] & (offs_p[None, :] < p), other=0.0)
        S += tl.dot((BT.to(tl.float32) * w[None, :]).to(xk.dtype), xk)
        if kk == KB - 1:  # the chunk is done: H_{c+1} = exp(a_last) H_c + S_c
            alpha = tl.exp(a_last)
            if HAS_SEQ:  # a new sequence ends this chunk: the old state must not leak into it
                alpha = tl.where(seq_last == seq_prev, alpha, 0.0)
                seq_prev = seq_last
            H = alpha * H + S
            S = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)
            gamma *= alpha
    if PHASE == 1:
        tl.store(E_base + j * p * N, H, mask=ok_np)
        tl.store(G_ptr + pid_bh * nseg + j, gamma)
    elif PHASE == 0:
        tl.store(final_ptr + pid_bh.to(tl.int64) * p * N + np_offs, H, mask=ok_np)
    else:
        tl.store(final_ptr + pid_bh.to(tl.int64) * p * N + np_offs, H,
                 mask=tl.where(j == nseg - 1, ok_np, False))


@triton.jit(do_not_specialize=["l", "nchunks", "seg_chunks", "nseg"])
def _chunk_states_tma_kernel(
    x_desc, B_desc,     # tensor descriptors of x (b, l, h, p) and B (b, l, g, n): one chunk a tile
    dtc_ptr, dacs_ptr, init_ptr, seq_ptr,  # Δ, dA_cs (b, h, c, q); H_0 (b, h, p, n); seq_idx
    H_desc,             # out: (b·c·h, p, n), the state entering each chunk, in H's dtype
    final_ptr,          # out: (b, h, p, n) float32, the state after the last chunk
    E_ptr, G_ptr,       # split only: segment end states (b·h·S, p, n), decays Γ (b·h·S,) fp32
    l, h, p, nchunks, heads_per_group, seg_chunks, nseg, stride_seqb, stride_seql,
    N: tl.constexpr, Q: tl.constexpr,           # state size; chunk length
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    N_TILES: tl.constexpr, P_TILES: tl.constexpr,  # state tiles along n and p
    HAS_INIT: tl.constexpr, HAS_SEQ: tl.constexpr, PHASE: tl.constexpr,
):
    """One chunk per loop trip: H_{c+1} = exp(a_last) H_c + (w ∘ B_cᵀ) x_c, the product's
    accumulator seeded with exp(a_last) H_c (the same sum in another float32 order).
    PHASE 0: one program walks all chunks. PHASE 1 (of a split into nseg segments of seg_chunks
    chunks): segment 0 walks its chunks from H_0, every other one sums its chunks from a zero
    state without writing H; each leaves its end state E_j and Γ_j (the product of its chunk
    decays). PHASE 2: segment j ≥ 1 starts from K_j = Γ_{j-1} K_{j-1} + E_{j-1} (K_1 = E_0),
    walks its chunks writing H, and the last one writes the final state."""
    # one grid axis (up to 2³¹ − 1 programs), the n tile fastest: neighbours read the same x
    pid = tl.program_id(0)
    pid_n, pid_p, pid_rest = pid % N_TILES, (pid // N_TILES) % P_TILES, pid // (N_TILES * P_TILES)
    if PHASE == 0:
        pid_bh, j = pid_rest, 0
    elif PHASE == 1:
        pid_bh, j = pid_rest // nseg, pid_rest % nseg
    else:
        pid_bh, j = pid_rest // (nseg - 1), 1 + pid_rest % (nseg - 1)
    pid_b, pid_h = pid_bh // h, pid_bh % h
    pid_g = pid_h // heads_per_group
    c0 = j * seg_chunks  # this program's chunks: [c0, c1)
    c1 = tl.minimum(c0 + seg_chunks, nchunks)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_q = tl.arange(0, Q)
    ok_np = (offs_n[:, None] < N) & (offs_p[None, :] < p)
    np_offs = offs_p[None, :] * N + offs_n[:, None]  # (BLOCK_N, BLOCK_P) inside one (p, n) state
    E_base = E_ptr + pid_bh.to(tl.int64) * nseg * p * N + np_offs  # segment i: + i · p · N
    H = _entering_state(init_ptr, E_base, G_ptr, pid_bh, j, p, nseg, ok_np, np_offs, N, BLOCK_N,
                        BLOCK_P, HAS_INIT, PHASE)
    row = pid_bh.to(tl.int64) * nchunks * Q  # this head's rows of Δ and dA_cs
    seq_base = seq_ptr + pid_b.to(tl.int64) * stride_seqb
    seq_prev = 0  # the sequence running at the previous chunk's end; H_0 belongs to sequence 0
    if HAS_SEQ:
        seq_prev = tl.load(seq_base + (c0 * Q - 1) * stride_seql, mask=c0 > 0, other=0)
    a_last = tl.load(dacs_ptr + row + c0 * Q + Q - 1)  # the chunk's last dA_cs, a trip ahead
    gamma = 1.0  # Γ: the product of the chunk decays so far
    for c in range(c0, c1):
        if PHASE != 1 or j == 0:  # publish the state entering chunk c
            H_desc.store([(pid_b * nchunks + c) * h + pid_h, pid_p * BLOCK_P, pid_n * BLOCK_N],
                         H.T.to(H_desc.dtype).reshape(1, BLOCK_P, BLOCK_N))
        a_next = tl.load(dacs_ptr + row + (tl.minimum(c + 1, nchunks - 1) * Q + Q - 1))
        cs = row + c * Q
        w = exp2_ftz(tl.minimum(a_last - tl.load(dacs_ptr + cs + offs_q), 0.0) * LOG2E)
        w *= tl.load(dtc_ptr + cs + offs_q)  # (Q,) decay to the chunk's end times Δ
        alpha = exp2_ftz(a_last * LOG2E)
        if HAS_SEQ:  # only steps of the sequence running at the chunk's end count
            t = c * Q + offs_q
            seq_k = tl.load(seq_base + t * stride_seql, mask=t < l, other=-1)
            seq_last = tl.load(seq_base + (tl.minimum((c + 1) * Q, l) - 1) * stride_seql)
            w = tl.where(seq_k == seq_last, w, 0.0)
            alpha = tl.where(seq_last == seq_prev, alpha, 0.0)  # a new sequence: no leak
            seq_prev = seq_last
        BT = B_desc.load([pid_b, c * Q, pid_g, pid_n * BLOCK_N]).reshape(Q, BLOCK_N).T
        xk = x_desc.load([pid_b, c * Q, pid_h, pid_p * BLOCK_P]).reshape(Q, BLOCK_P)
        H = tl.dot((BT.to(tl.float32) * w[None, :]).to(xk.dtype), xk, acc=alpha * H)
        gamma *= alpha
        a_last = a_next
    if PHASE == 1:
        tl.store(E_base + j * p * N, H, mask=ok_np)
        tl.store(G_ptr + pid_bh * nseg + j, gamma)
    elif PHASE == 0 or j == nseg - 1:
        tl.store(final_ptr + pid_bh.to(tl.int64) * p * N + np_offs, H, mask=ok_np)


def chunk_states(x, B, dt_c, dA_cs, initial_states=None, seq_idx=None, H_dtype=None, *,
                 config):
    """H_{c+1} = exp(a_last,c) H_c + Σ_s exp(a_last,c − a_s) Δ_s x_s B_sᵀ over chunks, one kernel.

    Shapes: x (b, l, h, p); B (b, l, g, n); Δ, dA_cs (b, h, c, q) float32 (from
    ``forward.chunk_cumsum``); initial_states (b, h, p, n); seq_idx (b, l). Returns (H (b, c, h,
    p, n) in ``H_dtype`` (x's dtype by default): the state entering each chunk; final (b, h, p, n)
    float32) — what chapter 10's ``chunk_state`` and ``state_passing`` return together.
    ``config``: a ``config.States`` (its ``split``: segments each sequence's walk is cut into,
    in either kernel).
    """
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    c, q = dA_cs.shape[2], dA_cs.shape[3]
    check_fused_chunk(q, "chunk_states")
    cfg = config
    BP, BN = tile(cfg.block_p, p), tile(cfg.block_n, n)
    H = torch.empty(b, c, h, p, n, device=x.device, dtype=H_dtype or x.dtype)
    final = torch.empty(b, h, p, n, device=x.device, dtype=torch.float32)
    init = initial_states.contiguous() if initial_states is not None else None
    seq_st = seq_idx.stride() if seq_idx is not None else (0, 0)
    if cfg.tma and tma_ok(x, B, H):
        _launch_tma(x, B, dt_c, dA_cs, init, seq_idx, H, final, BP, BN, cfg)
        return H, final
    BK = check_dot_k(min(cfg.pointer_block_k, q), "config.states.pointer_block_k")  # steps a
    # trip (the K of Bᵀ x): divides the chunk, both powers of two
    tiles = triton.cdiv(p, BP) * triton.cdiv(n, BN)
    seg, nseg, E, G = _segments(b * h, p, n, c, cfg.split, x.device, final)
    for phase, segs in ((0, 1),) if nseg == 1 else ((1, nseg), (2, nseg - 1)):
        _chunk_states_kernel[(b * h * segs * tiles,)](
            x, B, dt_c, dA_cs, init if init is not None else dt_c,
            seq_idx if seq_idx is not None else dt_c, H, final, E, G, l, h, p, c, h // g,
            seg, nseg, *x.stride(), *B.stride(), *seq_st,
            N=n, Q=q, BLOCK_P=BP, BLOCK_N=BN, BLOCK_K=BK, HAS_INIT=init is not None,
            HAS_SEQ=seq_idx is not None, EVEN=l % q == 0 and n % BN == 0 and p % BP == 0,
            PHASE=phase, num_warps=cfg.num_warps, num_stages=stages(cfg.pointer_stages))
    return H, final


def _segments(bh, p, n, c, split, device, final):
    """(chunks a segment, segments, E, Γ) of a walk over ``c`` chunks cut in ``split``: no empty
    segment; E (b·h·S, p, n) and Γ (b·h·S,) float32 where cut (else ``final``, not read)."""
    seg = triton.cdiv(c, min(split, c))
    nseg = triton.cdiv(c, seg)
    if nseg == 1:
        return seg, 1, final, final
    return (seg, nseg, torch.empty(bh * nseg, p, n, device=device, dtype=torch.float32),
            torch.empty(bh * nseg, device=device, dtype=torch.float32))


def _launch_tma(x, B, dt_c, dA_cs, init, seq_idx, H, final, BP, BN, cfg):
    """The tensor-descriptor kernel: one launch (PHASE 0), or two for a split sequence."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    c, q = dA_cs.shape[2], dA_cs.shape[3]
    tiles = (triton.cdiv(n, BN), triton.cdiv(p, BP))
    seg, nseg, E, G = _segments(b * h, p, n, c, cfg.split, x.device, final)
    desc = lambda t, k: TensorDescriptor.from_tensor(t, [1, q, 1, k])
    for phase, segs in ((0, 1),) if nseg == 1 else ((1, nseg), (2, nseg - 1)):
        _chunk_states_tma_kernel[(b * h * segs * tiles[0] * tiles[1],)](
            desc(x, BP), desc(B, BN), dt_c, dA_cs, init if init is not None else dt_c,
            seq_idx if seq_idx is not None else dt_c,
            TensorDescriptor.from_tensor(H.view(b * c * h, p, n), [1, BP, BN]), final, E, G,
            l, h, p, c, h // g, seg, nseg,
            *(seq_idx.stride() if seq_idx is not None else (0, 0)),
            N=n, Q=q, BLOCK_P=BP, BLOCK_N=BN, N_TILES=tiles[0], P_TILES=tiles[1],
            HAS_INIT=init is not None,
            HAS_SEQ=seq_idx is not None, PHASE=phase, num_warps=cfg.num_warps,
            num_stages=stages(cfg.stages),
            **launch_options(cfg.maxnreg if x.element_size() == 2 else None))
