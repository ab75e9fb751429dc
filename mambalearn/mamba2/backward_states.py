"""Steps 2–3 of the SSD backward (chapter 10): dstates, the gradient Y_off sends to the state
entering each chunk, and the state passing run backwards over the chunks. The derivation is the
docstring of ``mambalearn.mamba2.backward``.
"""

import torch
import triton
import triton.language as tl

from mambalearn.mamba2.backward_config import blocks, launch_args
from mambalearn.mamba2.common import bch_of, load_row, load_tile, load_tile_t, tile


# ---------------------------------------------------------------------------------------------
# 2. dstates: dH_c = Σ_t exp(a_t) dy_t C_tᵀ, what Y_off sends back to the state entering chunk c
@triton.jit
def _dstates_kernel(
    dy_ptr, C_ptr, dA_cs_ptr, seq_ptr,  # dy (b, l, h, p); C (b, l, g, n); dA_cs (b, h, c, q)
    dH_ptr,                             # out: (b, c, h, p, n) float32
    l, h, p, g, n, nchunks, heads_per_group,
    Q: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SEQ: tl.constexpr,
):
    pid_bch, pid_pn = tl.program_id(0), tl.program_id(1)  # (b, c, h) on the unlimited axis
    pid_p, pid_n = pid_pn // tl.cdiv(n, BLOCK_N), pid_pn % tl.cdiv(n, BLOCK_N)
    pid_b, pid_c, pid_h = bch_of(pid_bch, h, nchunks)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    bt0 = pid_b.to(tl.int64) * l + pid_c * Q  # the chunk's first step (64-bit: past 2³¹)
    dy_base = dy_ptr + bt0 * h * p + pid_h * p  # step k of the chunk: + k·h·p
    C_base = C_ptr + bt0 * g * n + (pid_h // heads_per_group) * n
    cs = dA_cs_ptr + ((pid_b.to(tl.int64) * h + pid_h) * nchunks + pid_c) * Q  # the chunk's a
    if HAS_SEQ:  # Y_off only reaches steps that continue the sequence of the entering state
        seq_prev = tl.load(seq_ptr + pid_b * l + pid_c * Q - 1, mask=pid_c > 0, other=0)
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, Q, BLOCK_K):  # reduce over the steps t of the chunk
        offs_k = k0 + tl.arange(0, BLOCK_K)
        t = pid_c * Q + offs_k
        ok = (offs_k < Q) & (t < l)
        scale = tl.exp(load_row(cs, offs_k, Q))  # exp(a_t)
        if HAS_SEQ:
            seq_t = tl.load(seq_ptr + pid_b * l + t, mask=ok, other=-1)
            scale = tl.where(seq_t == seq_prev, scale, 0.0)
        dyT = load_tile_t(dy_base, offs_k, ok, h * p, offs_p, p)  # (P, K)
        C_k = load_tile(C_base, offs_k, ok, g * n, offs_n, n)  # (K, N)
        acc += tl.dot((dyT.to(tl.float32) * scale[None, :]).to(C_k.dtype), C_k)  # (P, N)
    out = dH_ptr + (pid_bch.to(tl.int64) * p + offs_p[:, None]) * n + offs_n[None, :]
    tl.store(out, acc, mask=(offs_p[:, None] < p) & (offs_n[None, :] < n))


def dstates(dy, C, dA_cs, seq_idx=None, *, cfg):
    """Step 2. dH (b, c, h, p, n) float32: ∂loss/∂H_c through Y_off only."""
    dy, C = dy.contiguous(), C.contiguous()  # the kernels index contiguous tensors
    b, l, h, p = dy.shape
    g, n = C.shape[2], C.shape[3]
    c, q = dA_cs.shape[2], dA_cs.shape[3]
    dH = torch.empty(b, c, h, p, n, device=dy.device, dtype=torch.float32)
    BN, opts = launch_args(cfg.dstates, n)
    BP = tile(cfg.dstates_block_p, p)
    grid = (b * c * h, triton.cdiv(p, BP) * triton.cdiv(n, BN))
    _dstates_kernel[grid](dy, C, dA_cs, seq_idx if seq_idx is not None else dA_cs, dH,
                          l, h, p, g, n, c, h // g, Q=q, BLOCK_P=BP, BLOCK_N=BN,
                          BLOCK_K=blocks(q, cfg), HAS_SEQ=seq_idx is not None, **opts)
    return dH


# ---------------------------------------------------------------------------------------------
# 3. state passing reversed: 𝒢_c = dH_c + α_c 𝒢_{c+1}, a sequential scan over chunks backwards.
# At small b·h (one batch) the walk is the serial part, so it can be cut in S segments of the
# chunks, in two launches, as the forward's states walk is (``fused.states``), mirrored:
#   phase 1  the last segment walks from dfinal (writing dS, dlast); every other segment j walks
#            its chunks from 𝒢 = 0 reading only dH, leaving E_j = its local 𝒢 at its first chunk
#            and Γ_j = Π of its chunk decays α_c
#   phase 2  segment j < S − 1 starts from K_j = 𝒢 after its last chunk, folded from the right:
#            K_{S−2} = E_{S−1} (the last segment's true value), K_j = E_{j+1} + Γ_{j+1} K_{j+1},
#            and walks again writing dS, dlast (segment 0: dinitial_states)
# exact up to float32 summation order: 𝒢 is linear in the carry, and Γ multiplies it through.
@triton.jit(do_not_specialize=["seg_chunks", "nseg"])
def _state_passing_bwd_kernel(
    dS_ptr,             # in: dH (b, c, h, p·n) f32; out, in place: dS_c = 𝒢_{c+1}
    H_ptr, final_ptr,   # H_c entering each chunk (b, c, h, p·n), x's dtype; final (b, h, p·n) f32
    dA_cs_ptr, dfinal_ptr, seq_ptr,
    dinit_ptr,          # out: 𝒢_0 (b, h, p·n) f32
    dlast_ptr,          # out: (b, h, c, nblocks) f32: this block's share of ⟨α_c H_c, 𝒢_{c+1}⟩
    E_ptr, G_ptr,       # cut walks only: segment values E (b, h, S, p·n), decays Γ (b, h, S) f32
    l, h, dim, nchunks, nblocks, seg_chunks, nseg,
    Q: tl.constexpr, BLOCK: tl.constexpr,
    HAS_DFINAL: tl.constexpr, HAS_INIT: tl.constexpr, HAS_SEQ: tl.constexpr,
    PHASE: tl.constexpr,
):
    """PHASE 0: one walk over all chunks (one segment). PHASE 1 / 2 of a cut walk: the comment
    above. Masks, not branches, say what a program reads and writes (a masked load moves no
    bytes): a phase-1 program of a segment other than the last reads only dH and a_last."""
    pid, pid_b, pid_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if PHASE == 0:
        pid_d, j, c0, c1 = pid, 0, 0, nchunks
    else:  # (segment, block) on axis 0, the block fastest; chunks [c0, c1) walked backwards
        pid_d, j = pid % nblocks, pid // nblocks
        c0 = j * seg_chunks
        c1 = tl.minimum(c0 + seg_chunks, nchunks)
    offs = pid_d * BLOCK + tl.arange(0, BLOCK)
    ok = offs < dim
    if PHASE == 1:  # the last segment walks the true 𝒢 from dfinal, writing; the others only sum
        writes = j == nseg - 1
        okw = tl.where(writes, ok, False)  # where, not &: a block mask and a scalar stay a block
    else:
        okw = ok
    bh = pid_b.to(tl.int64) * h + pid_h
    E_base = E_ptr + bh * nseg * dim + offs  # segment i: + i · dim
    if PHASE == 2:  # 𝒢 after this segment's last chunk, folded from the segments after it
        G = tl.load(E_base + (nseg - 1) * dim, mask=ok, other=0.0)
        for k in range(0, nseg - 2 - j):  # segments i = S − 2, …, j + 1
            i = nseg - 2 - k
            G = tl.load(E_base + i * dim, mask=ok, other=0.0) + tl.load(G_ptr + bh * nseg + i) * G
    elif HAS_DFINAL:  # 𝒢 after the last chunk: the gradient of the final state
        G = tl.load(dfinal_ptr + bh * dim + offs, mask=okw, other=0.0).to(tl.float32)
    else:
        G = tl.zeros((BLOCK,), dtype=tl.float32)
    gamma = 1.0  # Γ: the product of the chunk decays walked so far
    c = c1 - 1
    row = ((pid_b * nchunks + c) * h + pid_h).to(tl.int64)  # (b, c, h) row of dS and H
    H_c = tl.load(H_ptr + row * dim + offs, mask=okw, other=0.0).to(tl.float32)
    dH = tl.load(dS_ptr + row * dim + offs, mask=ok, other=0.0)
    a_last = tl.load(dA_cs_ptr + (bh * nchunks + c) * Q + Q - 1)
    while c >= c0:  # `while`: the interpreter rejects range() over run-time bounds
        # chunk c − 1's loads go out before chunk c's arithmetic: they do not depend on 𝒢, so
        # the chain over chunks waits on one load latency in all, not one per chunk
        c_nx = tl.maximum(c - 1, c0)  # (never a chunk of another segment)
        row_nx = ((pid_b * nchunks + c_nx) * h + pid_h).to(tl.int64)
        H_nx = tl.load(H_ptr + row_nx * dim + offs, mask=okw, other=0.0).to(tl.float32)
        dH_nx = tl.load(dS_ptr + row_nx * dim + offs, mask=ok, other=0.0)
        a_nx = tl.load(dA_cs_ptr + (bh * nchunks + c_nx) * Q + Q - 1)
        tl.store(dS_ptr + row * dim + offs, G, mask=okw)  # dS_c = 𝒢_{c+1}
        alpha = tl.exp(a_last)  # α_c = exp(a_last of chunk c)
        if HAS_SEQ:  # the forward cut the chain where chunk c ends in a new sequence
            seq_end = tl.load(seq_ptr + pid_b * l + tl.minimum((c + 1) * Q, l) - 1)
            seq_before = tl.load(seq_ptr + pid_b * l + c * Q - 1, mask=c > 0, other=0)
            alpha = tl.where(seq_end == seq_before, alpha, 0.0)
        # a_last's path through α_c H_c (its path through S_c is step 7's Σ_s v_s)
        dlast = alpha * tl.sum(H_c * G, axis=0)
        if PHASE == 1:
            tl.store(dlast_ptr + (bh * nchunks + c) * nblocks + pid_d, dlast, mask=writes)
        else:
            tl.store(dlast_ptr + (bh * nchunks + c) * nblocks + pid_d, dlast)
        G = dH + alpha * G  # 𝒢_c
        gamma *= alpha
        H_c, dH, a_last, row = H_nx, dH_nx, a_nx, row_nx
        c -= 1
    if PHASE == 1:  # E_j: the segment's 𝒢 at its first chunk (the true one for the last)
        tl.store(E_base + j * dim, G, mask=ok)
        tl.store(G_ptr + bh * nseg + j, gamma, mask=pid_d == 0)
    elif HAS_INIT:  # segment 0 (phase 0: the one walk)
        if PHASE == 0:
            tl.store(dinit_ptr + bh * dim + offs, G, mask=ok)
        else:
            tl.store(dinit_ptr + bh * dim + offs, G, mask=tl.where(j == 0, ok, False))


def state_passing_backward(dS, H, final, dA_cs, dfinal=None, seq_idx=None, l=None,
                           has_init=False, *, cfg):
    """Step 3, in place: dS (b, c, h, p, n) holds dH on entry and dS_c = 𝒢_{c+1} on return.

    Returns (dlast (b, h, c) float32 = ⟨α_c H_c, 𝒢_{c+1}⟩, ∂loss/∂a_last of each chunk through
             α_c H_c (the part through S_c is Σ_s v_s of step 7),
             dinitial_states (b, h, p, n) float32, or None without initial states).
    ``final`` is not read (kept for the callers); H_c is the state entering chunk c; ``l`` the
    sequence length (None: c · q). ``cfg`` (a ``config.Backward``): ``passing_block`` values a
    program, ``passing_split`` segments the walk is cut into (1: one walk).
    """
    b, c, h, p, n = dS.shape
    q, dim = dA_cs.shape[-1], p * n
    BLOCK = cfg.passing_block  # one warp, 8 values a thread: the block's sum needs no barrier
    nblocks = triton.cdiv(dim, BLOCK)
    seg = triton.cdiv(c, min(cfg.passing_split, c))
    nseg = triton.cdiv(c, seg)  # no empty segment
    dlast = torch.empty(b, h, c, nblocks, device=dS.device, dtype=torch.float32)
    dinit = torch.empty(b, h, p, n, device=dS.device, dtype=torch.float32) if has_init else None
    dfin = dfinal.contiguous() if dfinal is not None else None
    E = torch.empty(b, h, nseg, dim, device=dS.device, dtype=torch.float32) if nseg > 1 else dS
    G = torch.empty(b, h, nseg, device=dS.device, dtype=torch.float32) if nseg > 1 else dS
    for phase, segs in ((0, 1),) if nseg == 1 else ((1, nseg), (2, nseg - 1)):
        _state_passing_bwd_kernel[(nblocks * segs, b, h)](
            dS, H, final, dA_cs, dfin if dfin is not None else dS,
            seq_idx if seq_idx is not None else dS, dinit if has_init else dS, dlast, E, G,
            l if l is not None else c * q, h, dim, c, nblocks, seg, nseg,
            Q=q, BLOCK=BLOCK, HAS_DFINAL=dfin is not None, HAS_INIT=has_init,
            HAS_SEQ=seq_idx is not None, PHASE=phase, num_warps=cfg.passing_warps)
    return dlast.sum(-1), dinit
