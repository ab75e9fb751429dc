"""Mamba-2 SSD in five Triton stages, the forward of ``mamba_chunk_scan_combined`` (chapter 10).

The chunked algorithm of ``mambalearn.mamba2.reference.ssd_chunked``, one kernel per stage:

    1. chunk cumsum   Δ = softplus(dt + dt_bias); dA_cs[c, t] = Σ_{s≤t in c} Δ_s A     (b, h, c, q)
    2. bmm            CB[c] = C_c B_cᵀ, the q×q "attention scores" of each chunk  (b, c, g, q, q)
    3. chunk state    S_c = Σ_s exp(dA_cs[c, end] − dA_cs[c, s]) Δ_s x_s B_sᵀ    (b, c, h, p, n)
    4. state passing  H_{c+1} = exp(dA_cs[c, end]) H_c + S_c, a scan over chunks (b, c, h, p, n)
    5. chunk scan     y_t = Σ_{s≤t} CB_ts exp(dA_cs_t − dA_cs_s) Δ_s x_s           (diagonal)
                            + exp(dA_cs_t) C_t H_c  + D x_t,  out = y · silu(z)  (off-diagonal)

Stages 2, 3 and 5 are matrix products (``tl.dot``) of q-long tiles: that is why SSD runs on the
tensor cores while the Mamba-1 scan does not. Layouts and semantics (seq_idx, initial_states, the
initial state belonging to sequence 0, tails shorter than a chunk) are mamba_ssm's.

The public function with its autograd (backward, the fused forward of chapter 11) is
``mambalearn.mamba2.api.mamba_chunk_scan_combined``.
"""

import torch
import triton
import triton.language as tl

from mambalearn.mamba2.common import INTERP, delta_of, log_decay, p2, stages, tile
from mambalearn.mamba2.config import defaults


# ---------------------------------------------------------------------------------------------
# 1. chunk cumsum: Δ and the in-chunk cumulative log-decay
@triton.jit
def _chunk_cumsum_kernel(
    dt_ptr, A_ptr, bias_ptr,            # dt (b, l, h), A (h,), dt_bias (h,) or dummy
    dt_out_ptr, dA_cs_ptr,              # outputs, both (b, h, c, q) float32 contiguous
    l, h, nchunks, dt_min, dt_max,      # sizes; clamp limits of Δ
    stride_dtb, stride_dtl, stride_dth,
    Q: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_Q: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_LIMIT: tl.constexpr,
):
    # chunks on grid axis 0 (up to 2³¹ − 1 programs; axes 1 and 2 stop at 65 535)
    pid_c, pid_b, pid_h = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)  # heads of this program
    offs_t = tl.arange(0, BLOCK_Q)  # steps inside the chunk
    t_glob = pid_c * Q + offs_t
    mask = (offs_h[:, None] < h) & (offs_t[None, :] < Q) & (t_glob[None, :] < l)
    ptrs = (dt_ptr + pid_b * stride_dtb + (pid_c * Q).to(tl.int64) * stride_dtl
            + offs_t[None, :] * stride_dtl + offs_h[:, None] * stride_dth)
    dt = tl.load(ptrs, mask=mask, other=0.0)  # (BLOCK_H, BLOCK_Q)
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_h, mask=offs_h < h, other=0.0).to(tl.float32)[:, None]
    dt = delta_of(dt, bias, dt_min, dt_max, HAS_BIAS, SOFTPLUS, HAS_LIMIT)  # Δ, float32
    dt = tl.where(mask, dt, 0.0)  # padded steps: Δ = 0, i.e. decay 1 and no input
    A = tl.load(A_ptr + offs_h, mask=offs_h < h, other=0.0).to(tl.float32)
    # (BLOCK_H, BLOCK_Q): Σ_{s≤t} Δ_s A, each term floored (A = −∞ gives decays, not NaN)
    dA_cs = tl.cumsum(log_decay(dt, A[:, None], mask), axis=1)
    out = ((pid_b * h + offs_h[:, None]) * nchunks + pid_c) * Q + offs_t[None, :]  # int64
    m_out = (offs_h[:, None] < h) & (offs_t[None, :] < Q)
    tl.store(dt_out_ptr + out, dt, mask=m_out)
    tl.store(dA_cs_ptr + out, dA_cs, mask=m_out)


def chunk_cumsum(dt, A, chunk_size, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                 *, heads):
    """Stage 1. Returns (Δ, dA_cs), both (b, h, c, q) float32; Δ = 0 past the end of l.
    ``heads``: heads per program (``config.Stages.cumsum_heads``)."""
    b, l, h = dt.shape
    q, c = chunk_size, triton.cdiv(l, chunk_size)
    dt_out = torch.empty(b, h, c, q, device=dt.device, dtype=torch.float32)
    dA_cs = torch.empty_like(dt_out)
    BLOCK_H = tile(heads, h, 1)
    grid = (c, b, triton.cdiv(h, BLOCK_H))
    has_limit = tuple(dt_limit) != (0.0, float("inf"))
    _chunk_cumsum_kernel[grid](
        dt, A, dt_bias if dt_bias is not None else A, dt_out, dA_cs, l, h, c,
        float(dt_limit[0]), float(dt_limit[1]), *dt.stride(),
        Q=q, BLOCK_H=BLOCK_H, BLOCK_Q=p2(q, 1), HAS_BIAS=dt_bias is not None,
        SOFTPLUS=dt_softplus, HAS_LIMIT=has_limit)
    return dt_out, dA_cs


# ---------------------------------------------------------------------------------------------
# 2. bmm: CB = C Bᵀ inside each chunk
@triton.jit
def _bmm_kernel(
    C_ptr, B_ptr, CB_ptr,               # C, B (b, l, g, n); CB (b, c, g, q, q) float32
    l, g, nchunks,
    stride_Cb, stride_Cl, stride_Cg, stride_Cn,      # strides of C
    stride_Bb, stride_Bl, stride_Bg, stride_Bn,      # strides of B
    N: tl.constexpr, Q: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # (b, c, g) on grid axis 0: up to 2³¹ − 1 programs (axes 1 and 2 stop at 65 535)
    pid_bcg, pid_m, pid_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    pid_g = pid_bcg % g
    pid_c = (pid_bcg // g) % nchunks
    pid_b = (pid_bcg // (g * nchunks)).to(tl.int64)
    if pid_n * BLOCK_N >= (pid_m + 1) * BLOCK_M:
        return  # strictly above the diagonal: causal, never read
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rows t (C), inside the chunk
    offs_s = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # columns s (B)
    ok_m = (offs_m < Q) & (pid_c * Q + offs_m < l)
    ok_s = (offs_s < Q) & (pid_c * Q + offs_s < l)
    t0 = (pid_c * Q).to(tl.int64)  # the chunk's first step: 64-bit offsets reach past 2³¹
    C_base = C_ptr + pid_b * stride_Cb + t0 * stride_Cl + pid_g * stride_Cg
    B_base = B_ptr + pid_b * stride_Bb + t0 * stride_Bl + pid_g * stride_Bg
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, N, BLOCK_K):  # reduce over the state dimension n
        offs_k = k0 + tl.arange(0, BLOCK_K)
        Ct = tl.load(C_base + offs_m[:, None] * stride_Cl + offs_k[None, :] * stride_Cn,
                     mask=ok_m[:, None] & (offs_k[None, :] < N), other=0.0)  # (BLOCK_M, BLOCK_K)
        Bt = tl.load(B_base + offs_s[None, :] * stride_Bl + offs_k[:, None] * stride_Bn,
                     mask=ok_s[None, :] & (offs_k[:, None] < N), other=0.0)  # (BLOCK_K, BLOCK_N)
        acc += tl.dot(Ct, Bt)
    out = CB_ptr + (pid_bcg.to(tl.int64) * Q + offs_m[:, None]) * Q + offs_s[None, :]
    tl.store(out, acc, mask=(offs_m[:, None] < Q) & (offs_s[None, :] < Q))


def bmm_chunk(C, B, chunk_size, cfg):
    """Stage 2. CB (b, c, g, q, q) float32, CB[b, c, g, t, s] = C_t · B_s (t ≥ s blocks only).
    ``cfg``: a ``config.Stages``."""
    b, l, g, n = C.shape
    q, c = chunk_size, triton.cdiv(l, chunk_size)
    CB = torch.empty(b, c, g, q, q, device=C.device, dtype=torch.float32)
    BM = BN = tile(cfg.bmm_block_q, q)
    BK = tile(cfg.bmm.block_n, n)
    grid = (b * c * g, triton.cdiv(q, BM), triton.cdiv(q, BN))
    _bmm_kernel[grid](C, B, CB, l, g, c, *C.stride(), *B.stride(),
                      N=n, Q=q, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
                      num_warps=cfg.bmm.num_warps, num_stages=stages(cfg.bmm.num_stages))
    return CB


# ---------------------------------------------------------------------------------------------
# 3. chunk state: each chunk's contribution to the state at its last step
@triton.jit
def _chunk_state_kernel(
    x_ptr, B_ptr, dt_ptr, dA_cs_ptr, seq_ptr, S_ptr,   # S: (b, c, h, p, n) float32
    l, h, p, n, nchunks, heads_per_group,
    stride_xb, stride_xl, stride_xh, stride_xp,
    stride_Bb, stride_Bl, stride_Bg, stride_Bn,
    stride_seqb, stride_seql,
    Q: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SEQ: tl.constexpr,
):
    # (b, c, h) on grid axis 0: up to 2³¹ − 1 programs (axes 1 and 2 stop at 65 535)
    pid_bch, pid_pn = tl.program_id(0), tl.program_id(1)
    n_blocks_n = tl.cdiv(n, BLOCK_N)
    pid_p, pid_n = pid_pn // n_blocks_n, pid_pn % n_blocks_n
    pid_h = pid_bch % h
    pid_c = (pid_bch // h) % nchunks
    pid_b = (pid_bch // (h * nchunks)).to(tl.int64)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cs_off = ((pid_b * h + pid_h) * nchunks + pid_c) * Q  # this chunk's (q,) row of Δ and dA_cs
    dA_last = tl.load(dA_cs_ptr + cs_off + Q - 1)  # Δ = 0 on padding, so index q−1 is the true end
    t_end = tl.minimum((pid_c + 1) * Q, l) - 1
    if HAS_SEQ:
        seq_last = tl.load(seq_ptr + pid_b * stride_seqb + t_end * stride_seql)
    t0 = (pid_c * Q).to(tl.int64)  # the chunk's first step: 64-bit offsets reach past 2³¹
    x_base = x_ptr + pid_b * stride_xb + t0 * stride_xl + pid_h * stride_xh
    B_base = (B_ptr + pid_b * stride_Bb + t0 * stride_Bl
              + (pid_h // heads_per_group) * stride_Bg)
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, Q, BLOCK_K):  # reduce over the steps s of the chunk
        offs_k = k0 + tl.arange(0, BLOCK_K)
        t = pid_c * Q + offs_k
        ok = (offs_k < Q) & (t < l)
        xT = tl.load(x_base + offs_k[None, :] * stride_xl + offs_p[:, None] * stride_xp,
                     mask=ok[None, :] & (offs_p[:, None] < p), other=0.0)  # (BLOCK_P, BLOCK_K)
        Bk = tl.load(B_base + offs_k[:, None] * stride_Bl + offs_n[None, :] * stride_Bn,
                     mask=ok[:, None] & (offs_n[None, :] < n), other=0.0)  # (BLOCK_K, BLOCK_N)
        dA = tl.load(dA_cs_ptr + cs_off + offs_k, mask=offs_k < Q, other=0.0)
        dt = tl.load(dt_ptr + cs_off + offs_k, mask=offs_k < Q, other=0.0)
        w = tl.exp(tl.minimum(dA_last - dA, 0.0)) * dt  # decay to the chunk end, times Δ_s
        if HAS_SEQ:  # only steps of the sequence that is running at the chunk's end count
            seq = tl.load(seq_ptr + pid_b * stride_seqb + t * stride_seql, mask=ok, other=-1)
            w = tl.where(seq == seq_last, w, 0.0)
        Bk = (Bk.to(tl.float32) * w[:, None]).to(xT.dtype)
        acc += tl.dot(xT, Bk)  # (BLOCK_P, BLOCK_N): Σ_s x_s (w_s B_s)ᵀ
    out = S_ptr + (pid_bch.to(tl.int64) * p + offs_p[:, None]) * n + offs_n[None, :]
    tl.store(out, acc, mask=(offs_p[:, None] < p) & (offs_n[None, :] < n))


def chunk_state(x, B, dt_c, dA_cs, seq_idx, cfg):
    """Stage 3. S (b, c, h, p, n) float32: the state each chunk alone leaves at its last step.
    ``seq_idx`` (b, l) or None; ``cfg``: a ``config.Stages``."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    q, c = dA_cs.shape[-1], dA_cs.shape[2]
    S = torch.empty(b, c, h, p, n, device=x.device, dtype=torch.float32)
    BP = tile(cfg.chunk_state_block_p, p)
    BN = tile(cfg.chunk_state.block_n, n)
    BK = tile(cfg.chunk_state_block_k, q)
    grid = (b * c * h, triton.cdiv(p, BP) * triton.cdiv(n, BN))
    sq = seq_idx if seq_idx is not None else dt_c
    _chunk_state_kernel[grid](
        x, B, dt_c, dA_cs, sq, S, l, h, p, n, c, h // g, *x.stride(), *B.stride(),
        *((seq_idx.stride(0), seq_idx.stride(1)) if seq_idx is not None else (0, 0)),
        Q=q, BLOCK_P=BP, BLOCK_N=BN, BLOCK_K=BK, HAS_SEQ=seq_idx is not None,
        num_warps=cfg.chunk_state.num_warps, num_stages=stages(cfg.chunk_state.num_stages))
    return S


# ---------------------------------------------------------------------------------------------
# 4. state passing: a sequential scan over chunks, parallel over (b, h, p·n)
@triton.jit
def _state_passing_kernel(
    S_ptr, dA_cs_ptr, init_ptr, seq_ptr,   # S (b, c, h, p·n) f32; init (b, h, p·n)
    Hin_ptr, final_ptr,                    # Hin (b, c, h, p·n): entering states; final (b, h, p·n)
    l, h, dim, nchunks,
    stride_ib, stride_ih, stride_id,       # strides of init viewed as (b, h, p·n)
    stride_seqb, stride_seql,
    Q: tl.constexpr, BLOCK: tl.constexpr, HAS_INIT: tl.constexpr, HAS_SEQ: tl.constexpr,
):
    pid_d, pid_b, pid_h = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    offs = pid_d * BLOCK + tl.arange(0, BLOCK)
    ok = offs < dim
    if HAS_INIT:  # H_0: the state entering chunk 0 (belongs to sequence 0)
        H = tl.load(init_ptr + pid_b * stride_ib + pid_h * stride_ih + offs * stride_id,
                    mask=ok, other=0.0).to(tl.float32)
    else:
        H = tl.zeros((BLOCK,), dtype=tl.float32)
    seq_prev = tl.full([], 0, tl.int64)  # int64: seq_idx's values are compared as loaded
    c = 0
    while c < nchunks:  # a while loop: Triton's interpreter rejects range() over a runtime bound
        row = (pid_b * nchunks + c) * h + pid_h
        tl.store(Hin_ptr + row * dim + offs, H.to(Hin_ptr.dtype.element_ty), mask=ok)
        a = tl.exp(tl.load(dA_cs_ptr + ((pid_b * h + pid_h) * nchunks + c) * Q + Q - 1))
        if HAS_SEQ:  # a new sequence ends this chunk: the old state must not leak into it
            t_end = tl.minimum((c + 1) * Q, l) - 1
            seq_new = tl.load(seq_ptr + pid_b * stride_seqb + t_end * stride_seql).to(tl.int64)
            a = tl.where(seq_new == seq_prev, a, 0.0)  # (int64 either way: a loop variable whose
            # type changed with seq_idx's dtype is a program the GPU's compiler refuses)
            seq_prev = seq_new
        H = a * H + tl.load(S_ptr + row * dim + offs, mask=ok, other=0.0)  # H_{c+1} = a H_c + S_c
        c += 1
    tl.store(final_ptr + (pid_b * h + pid_h) * dim + offs, H, mask=ok)


def state_passing(S, dA_cs, initial_states=None, seq_idx=None, l=None, out_dtype=torch.float32,
                  *, cfg):
    """Stage 4. (Hin (b, c, h, p, n) in ``out_dtype``, final (b, h, p, n) float32).
    ``cfg``: a ``config.Stages``."""
    b, c, h, p, n = S.shape
    q = dA_cs.shape[-1]
    dim = p * n
    Hin = torch.empty(b, c, h, p, n, device=S.device, dtype=out_dtype)
    final = torch.empty(b, h, p, n, device=S.device, dtype=torch.float32)
    init = initial_states.reshape(b, h, dim) if initial_states is not None else None
    BLOCK = tile(cfg.passing_block, dim)
    grid = (triton.cdiv(dim, BLOCK), b, h)
    _state_passing_kernel[grid](
        S, dA_cs, init if init is not None else S, seq_idx if seq_idx is not None else S, Hin,
        final,
        l if l is not None else c * q, h, dim, c,
        *(init.stride() if init is not None else (0, 0, 0)),
        *((seq_idx.stride(0), seq_idx.stride(1)) if seq_idx is not None else (0, 0)),
        Q=q, BLOCK=BLOCK, HAS_INIT=init is not None, HAS_SEQ=seq_idx is not None,
        num_warps=cfg.passing_warps)
    return Hin, final


# ---------------------------------------------------------------------------------------------
# 5. chunk scan: outputs = diagonal block + off-diagonal block (+ D x, · silu(z))
@triton.jit
def _diag_block(acc, k0, x_base, CB_base, dA_row, dt_row, seq_row, seq_m, dA_m, offs_m, offs_p,
                pid_c, l, p, stride_xl, stride_xp, stride_seql,
                Q: tl.constexpr, BLOCK_K: tl.constexpr, HAS_SEQ: tl.constexpr):
    """acc += (CB ∘ exp(dA_cs_t − dA_cs_s) Δ_s)[rows, k0:k0+BLOCK_K] @ x[k0:k0+BLOCK_K]: one step of
    the diagonal block's product, masked to s ≤ t (and to one sequence)."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    t_k = pid_c * Q + offs_k
    ok_k = (offs_k < Q) & (t_k < l)
    cb = tl.load(CB_base + offs_m[:, None] * Q + offs_k[None, :],
                 mask=(offs_m[:, None] < Q) & (offs_k[None, :] < Q), other=0.0)  # (M, K) f32
    dA_k = tl.load(dA_row + offs_k, mask=offs_k < Q, other=0.0)
    dt_k = tl.load(dt_row + offs_k, mask=offs_k < Q, other=0.0)
    causal = offs_m[:, None] >= offs_k[None, :]
    if HAS_SEQ:
        seq_k = tl.load(seq_row + t_k * stride_seql, mask=ok_k, other=-2)
        causal = causal & (seq_m[:, None] == seq_k[None, :])
    # the exponent is ≤ 0 on the causal part; clamp so the masked part cannot overflow
    decay = tl.exp(tl.minimum(dA_m[:, None] - dA_k[None, :], 0.0))
    cb = tl.where(causal, cb * decay * dt_k[None, :], 0.0)
    xk = tl.load(x_base + offs_k[:, None] * stride_xl + offs_p[None, :] * stride_xp,
                 mask=ok_k[:, None] & (offs_p[None, :] < p), other=0.0)  # (K, P)
    return acc + tl.dot(cb.to(xk.dtype), xk)


@triton.jit
def _chunk_scan_kernel(
    x_ptr, z_ptr, D_ptr, C_ptr, CB_ptr, dt_ptr, dA_cs_ptr, Hin_ptr, seq_ptr, out_ptr,
    l, h, p, g, nchunks, heads_per_group,
    stride_xb, stride_xl, stride_xh, stride_xp,
    stride_zb, stride_zl, stride_zh, stride_zp,
    stride_Cb, stride_Cl, stride_Cg, stride_Cn,
    stride_ob, stride_ol, stride_oh, stride_op,
    stride_seqb, stride_seql, stride_Dh, stride_Dp,
    N: tl.constexpr, Q: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr, INTERP: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_SEQ: tl.constexpr,
):
    # (b, c, h) on grid axis 0: up to 2³¹ − 1 programs (axes 1 and 2 stop at 65 535)
    pid_bch, pid_mp = tl.program_id(0), tl.program_id(1)
    n_blocks_p = tl.cdiv(p, BLOCK_P)
    pid_m, pid_p = pid_mp // n_blocks_p, pid_mp % n_blocks_p
    pid_h = pid_bch % h
    pid_c = (pid_bch // h) % nchunks
    pid_b = (pid_bch // (h * nchunks)).to(tl.int64)
    pid_g = pid_h // heads_per_group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # output steps t in the chunk
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    t_m = pid_c * Q + offs_m
    ok_m = (offs_m < Q) & (t_m < l)
    t0 = (pid_c * Q).to(tl.int64)  # the chunk's first step: 64-bit offsets reach past 2³¹
    cs_base = ((pid_b * h + pid_h) * nchunks + pid_c) * Q
    dA_m = tl.load(dA_cs_ptr + cs_base + offs_m, mask=offs_m < Q, other=0.0)  # (BLOCK_M,)
    # off-diagonal: exp(dA_cs_t) · C_t H_c, the state entering the chunk read out by C
    scale_m = tl.exp(dA_m)
    if HAS_SEQ:
        seq_m = tl.load(seq_ptr + pid_b * stride_seqb + t_m * stride_seql, mask=ok_m, other=-1)
        seq_prev = tl.load(seq_ptr + pid_b * stride_seqb + (pid_c * Q - 1) * stride_seql,
                           mask=pid_c > 0, other=0)
        scale_m = tl.where(seq_m == seq_prev, scale_m, 0.0)
    C_base = C_ptr + pid_b * stride_Cb + t0 * stride_Cl + pid_g * stride_Cg
    H_base = Hin_ptr + (pid_bch.to(tl.int64) * p) * N
    acc = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        Cm = tl.load(C_base + offs_m[:, None] * stride_Cl + offs_n[None, :] * stride_Cn,
                     mask=ok_m[:, None] & (offs_n[None, :] < N), other=0.0)  # (BLOCK_M, BLOCK_N)
        HT = tl.load(H_base + offs_p[None, :] * N + offs_n[:, None],
                     mask=(offs_p[None, :] < p) & (offs_n[:, None] < N), other=0.0)  # (N, P)
        acc += tl.dot(Cm, HT.to(Cm.dtype))
    acc *= scale_m[:, None]
    # diagonal block: Σ_{s ≤ t} CB_ts exp(dA_cs_t − dA_cs_s) Δ_s x_s, only blocks s ≤ t
    x_base = x_ptr + pid_b * stride_xb + t0 * stride_xl + pid_h * stride_xh
    CB_base = CB_ptr + ((pid_b * nchunks + pid_c) * g + pid_g) * Q * Q
    if not HAS_SEQ:
        seq_m = offs_m  # unused placeholder
    if INTERP:  # the interpreter needs compile-time loop bounds; the causal mask does the rest
        for k0 in range(0, Q, BLOCK_K):
            acc = _diag_block(acc, k0, x_base, CB_base, dA_cs_ptr + cs_base, dt_ptr + cs_base,
                              seq_ptr + pid_b * stride_seqb, seq_m, dA_m, offs_m, offs_p, pid_c,
                              l, p, stride_xl, stride_xp, stride_seql, Q, BLOCK_K, HAS_SEQ)
    else:  # only blocks left of (and on) the diagonal: the rest of L is zero
        for k0 in range(0, tl.minimum((pid_m + 1) * BLOCK_M, Q), BLOCK_K):
            acc = _diag_block(acc, k0, x_base, CB_base, dA_cs_ptr + cs_base, dt_ptr + cs_base,
                              seq_ptr + pid_b * stride_seqb, seq_m, dA_m, offs_m, offs_p, pid_c,
                              l, p, stride_xl, stride_xp, stride_seql, Q, BLOCK_K, HAS_SEQ)
    ok_out = ok_m[:, None] & (offs_p[None, :] < p)
    if HAS_D:  # skip connection D x_t, D per head or per (head, p)
        Dv = tl.load(D_ptr + pid_h * stride_Dh + offs_p * stride_Dp, mask=offs_p < p, other=0.0)
        xm = tl.load(x_base + offs_m[:, None] * stride_xl + offs_p[None, :] * stride_xp,
                     mask=ok_out, other=0.0)
        acc += Dv.to(tl.float32)[None, :] * xm.to(tl.float32)
    if HAS_Z:  # gate: y · silu(z)
        zm = tl.load(z_ptr + pid_b * stride_zb + t0 * stride_zl + offs_m[:, None] * stride_zl
                     + pid_h * stride_zh + offs_p[None, :] * stride_zp, mask=ok_out,
                     other=0.0).to(tl.float32)
        acc *= zm * tl.sigmoid(zm)
    o = (out_ptr + pid_b * stride_ob + t0 * stride_ol + offs_m[:, None] * stride_ol
         + pid_h * stride_oh + offs_p[None, :] * stride_op)
    tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=ok_out)


def chunk_scan(x, C, CB, dt_c, dA_cs, Hin, D, z, seq_idx, cfg):
    """Stage 5. out (b, l, h, p) in x's dtype; D, z, seq_idx may be None. ``cfg``: a
    ``config.Stages``."""
    b, l, h, p = x.shape
    g, n = C.shape[2], C.shape[3]
    c, q = dA_cs.shape[2], dA_cs.shape[3]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    BM = tile(cfg.chunk_scan_block_m, q)
    BK = tile(cfg.chunk_scan_block_k, q)
    BP = tile(cfg.chunk_scan_block_p, p)
    BN = tile(cfg.chunk_scan.block_n, n)
    grid = (b * c * h, triton.cdiv(q, BM) * triton.cdiv(p, BP))
    Dst = (0, 0) if D is None else ((D.stride(0), 0) if D.ndim == 1 else tuple(D.stride()))
    _chunk_scan_kernel[grid](
        x, z if z is not None else x, D if D is not None else x, C, CB, dt_c, dA_cs, Hin,
        seq_idx if seq_idx is not None else x, out, l, h, p, g, c, h // g,
        *x.stride(), *(z.stride() if z is not None else (0, 0, 0, 0)), *C.stride(), *out.stride(),
        *((seq_idx.stride(0), seq_idx.stride(1)) if seq_idx is not None else (0, 0)), *Dst,
        N=n, Q=q, BLOCK_M=BM, BLOCK_P=BP, BLOCK_K=BK, BLOCK_N=BN, INTERP=INTERP,
        HAS_D=D is not None, HAS_Z=z is not None, HAS_SEQ=seq_idx is not None,
        num_warps=cfg.chunk_scan.num_warps, num_stages=stages(cfg.chunk_scan.num_stages))
    return out


# ---------------------------------------------------------------------------------------------
def ssd_forward(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                seq_idx=None, dt_softplus=False, dt_limit=(0.0, float("inf")), cfg=None):
    """The five stages in order. Returns (out (b, l, h, p), final states (b, h, p, n) float32).
    ``cfg``: a ``config.Stages``: the package's callers pass the one their entry point resolved;
    None (a direct call, as in the chapters) takes the device's."""
    if cfg is None:
        cfg = defaults(x.device).stages
    dt_c, dA_cs = chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit,
                               heads=cfg.cumsum_heads)  # (b, h, c, q)
    return ssd_stages(x, B, C, dt_c, dA_cs, D, z, initial_states, seq_idx, cfg)


def ssd_stages(x, B, C, dt_c, dA_cs, D, z, initial_states, seq_idx, cfg):
    """Stages 2–5 from stage 1's Δ and dA_cs (b, h, c, q): what follows once Δ is known (the
    chunk size is their last dim). ``cfg``: a ``config.Stages``. Returns as `ssd_forward`."""
    S = chunk_state(x, B, dt_c, dA_cs, seq_idx, cfg)  # (b, c, h, p, n) f32
    # The entering states are stored in x's dtype (as mamba_ssm does, C.dtype): half the bytes.
    Hin, final = state_passing(S, dA_cs, initial_states, seq_idx, x.shape[1], out_dtype=x.dtype,
                               cfg=cfg)
    CB = bmm_chunk(C, B, dt_c.shape[-1], cfg)  # (b, c, g, q, q) f32
    out = chunk_scan(x, C, CB, dt_c, dA_cs, Hin, D, z, seq_idx, cfg)  # (b, l, h, p)
    return out, final
