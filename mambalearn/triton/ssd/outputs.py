"""Chunk outputs in one kernel (chapter 11): stages 2 and 5 of chapter 10 fused, C Bᵀ never in memory.

Given the state H_c entering each chunk and a = dA_cs, the outputs of chunk c are

    y_t = exp(a_t) C_t H_cᵀ                                   (the state read out: off-diagonal)
        + Σ_{s ≤ t} (C_t · B_s) exp(a_t − a_s) Δ_s x_s        (inside the chunk: diagonal block)
        + D x_t,        out = y · silu(z)

Chapter 10 forms C Bᵀ for every chunk in a kernel of its own and writes it (float32, q × q per
chunk) for the chunk scan to read back. Here each program computes its BLOCK_M rows of it on the
fly, BLOCK_K columns at a time, exactly as attention kernels compute Q Kᵀ: the tile S = C_m B_kᵀ
comes out of the tensor cores in registers, is turned into P = S ∘ decay ∘ Δ there, and goes into
the next product P x_k as a register operand. The price is that C Bᵀ, which depends on the group
and not on the head, is recomputed by every head of a group: tensor-core work, which is cheap
here, instead of reading q² float32 values per head.

Blocks strictly left of the diagonal block need no causal mask (every s there is before every t,
and the decay exponent a_t − a_s ≤ 0 for A ≤ 0); only the blocks on the diagonal mask s > t.
The decay is one MUFU.EX2 per element (``common._exp2``, denormal results flushed). ``EXP2``:
its exponent from log2-scaled a, one multiply less per element (rounds a little differently from
chapter 10's exp(a_t − a_s)). ``EVEN`` (l a multiple of q, n and p filling their tiles): no masks. Programs take the longest row blocks first.
"""

import torch
import triton
import triton.language as tl

from mambalearn.triton.ssd.common import INTERP, LOG2E, _bch, _exp2, launch_options, p2

CONFIG = dict(BLOCK_M=64, BLOCK_K=64, BLOCK_P=64, num_warps=4, num_stages=2, EXP2=False, maxnreg=None)


@triton.jit
def _diag_tile(acc, C_m, a_m, seq_m, offs_m, k0, B_base, x_base, dtc_row, dacs_row, seq_base,
               pid_c, l, p, offs_n, offs_p, stride_Bl, stride_Bn, stride_xl, stride_xp,
               stride_seql, N: tl.constexpr, Q: tl.constexpr, BLOCK_K: tl.constexpr,
               CAUSAL: tl.constexpr, EXP2: tl.constexpr, HAS_SEQ: tl.constexpr,
               EVEN: tl.constexpr):
    """acc += ((C_m B_kᵀ) ∘ exp(a_t − a_s) Δ_s [s ≤ t]) x_k for the BLOCK_K steps from k0.
    ``EVEN``: no tile reaches past l, n or p, so no load needs a mask."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    t_k = pid_c * Q + offs_k
    ok_k = t_k < l
    B_ptrs = B_base + t_k[None, :] * stride_Bl + offs_n[:, None] * stride_Bn
    x_ptrs = x_base + t_k[:, None] * stride_xl + offs_p[None, :] * stride_xp
    if EVEN:
        BkT = tl.load(B_ptrs)  # (BLOCK_N, BLOCK_K)
        xk = tl.load(x_ptrs)  # (BLOCK_K, BLOCK_P)
    else:
        BkT = tl.load(B_ptrs, mask=ok_k[None, :] & (offs_n[:, None] < N), other=0.0)
        xk = tl.load(x_ptrs, mask=ok_k[:, None] & (offs_p[None, :] < p), other=0.0)
    s = tl.dot(C_m, BkT)  # (BLOCK_M, BLOCK_K) float32: C_t · B_s
    a_k = tl.load(dacs_row + offs_k)
    dt_k = tl.load(dtc_row + offs_k)
    if EXP2:  # a_m arrives scaled by log2 e: 2^(a_t log2 e − a_s log2 e), one multiply less
        pm = s * _exp2(a_m[:, None] - (a_k * LOG2E)[None, :]) * dt_k[None, :]
    else:  # chapter 10's exp(a_t − a_s) · Δ_s, the same roundings
        pm = s * _exp2((a_m[:, None] - a_k[None, :]) * LOG2E) * dt_k[None, :]
    if CAUSAL:  # the diagonal block: s ≤ t only (the where also drops any inf above it)
        keep = offs_m[:, None] >= offs_k[None, :]
        if HAS_SEQ:
            seq_k = tl.load(seq_base + t_k * stride_seql, mask=ok_k, other=-2)
            keep = keep & (seq_m[:, None] == seq_k[None, :])
        pm = tl.where(keep, pm, 0.0)
    elif HAS_SEQ:  # earlier steps of another packed sequence do not reach t
        seq_k = tl.load(seq_base + t_k * stride_seql, mask=ok_k, other=-2)
        pm = tl.where(seq_m[:, None] == seq_k[None, :], pm, 0.0)
    return acc + tl.dot(pm.to(xk.dtype), xk)


@triton.jit
def _output_rows(m0, pid_b, pid_c, pid_h, pid_p, H_base,
                 x_ptr, z_ptr, D_ptr, C_ptr, B_ptr, dtc_ptr, dacs_ptr, seq_ptr, out_ptr,
                 l, h, p, nchunks, heads_per_group,
                 stride_xb, stride_xl, stride_xh, stride_xp,
                 stride_zb, stride_zl, stride_zh, stride_zp,
                 stride_Cb, stride_Cl, stride_Cg, stride_Cn,
                 stride_Bb, stride_Bl, stride_Bg, stride_Bn,
                 stride_ob, stride_ol, stride_oh, stride_op,
                 stride_seqb, stride_seql, stride_Dh, stride_Dp,
                 N: tl.constexpr, Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, EXP2: tl.constexpr,
                 HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_SEQ: tl.constexpr,
                 EVEN: tl.constexpr, VOLATILE_H: tl.constexpr):
    """Outputs of rows m0 … m0 + BLOCK_M of chunk c for one head (and p-block): the module doc.
    ``H_base`` points at the (p, n) state entering the chunk; ``VOLATILE_H``: it was written by
    another program of this launch (read it past the L1 cache)."""
    pid_g = pid_h // heads_per_group
    offs_m = m0 + tl.arange(0, BLOCK_M)  # steps t of the chunk
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    t_m = pid_c * Q + offs_m
    ok_m = t_m < l
    cs = ((pid_b * h + pid_h) * nchunks + pid_c).to(tl.int64) * Q  # this chunk's row of Δ, a
    a_m = tl.load(dacs_ptr + cs + offs_m)  # (BLOCK_M,)
    C_base = C_ptr + pid_b.to(tl.int64) * stride_Cb + pid_g * stride_Cg
    C_ptrs = C_base + t_m[:, None] * stride_Cl + offs_n[None, :] * stride_Cn
    H_ptrs = H_base + offs_p[None, :] * N + offs_n[:, None]
    if EVEN:
        C_m = tl.load(C_ptrs)  # (BLOCK_M, BLOCK_N)
        HT = tl.load(H_ptrs, volatile=VOLATILE_H)  # (BLOCK_N, BLOCK_P): H_cᵀ
    else:
        C_m = tl.load(C_ptrs, mask=ok_m[:, None] & (offs_n[None, :] < N), other=0.0)
        HT = tl.load(H_ptrs, mask=(offs_p[None, :] < p) & (offs_n[:, None] < N), other=0.0,
                     volatile=VOLATILE_H)
    # off-diagonal: exp(a_t) · C_t H_cᵀ, the entering state read out by C
    scale_m = tl.exp(a_m)
    seq_base = seq_ptr + pid_b.to(tl.int64) * stride_seqb
    seq_m = offs_m  # a placeholder without seq_idx
    if HAS_SEQ:  # the entering state belongs to the sequence running before the chunk
        seq_m = tl.load(seq_base + t_m * stride_seql, mask=ok_m, other=-1)
        seq_prev = tl.load(seq_base + (pid_c * Q - 1) * stride_seql, mask=pid_c > 0, other=0)
        scale_m = tl.where(seq_m == seq_prev, scale_m, 0.0)
    acc = tl.dot(C_m, HT.to(C_m.dtype)) * scale_m[:, None]  # (BLOCK_M, BLOCK_P)
    if EXP2:
        a_m = a_m * LOG2E
    # diagonal block, BLOCK_K steps at a time: left of the diagonal unmasked, then on it
    x_base = x_ptr + pid_b.to(tl.int64) * stride_xb + pid_h * stride_xh
    B_base = B_ptr + pid_b.to(tl.int64) * stride_Bb + pid_g * stride_Bg
    for k0 in range(0, m0, BLOCK_K):
        acc = _diag_tile(acc, C_m, a_m, seq_m, offs_m, k0, B_base, x_base, dtc_ptr + cs,
                         dacs_ptr + cs, seq_base, pid_c, l, p, offs_n, offs_p, stride_Bl,
                         stride_Bn, stride_xl, stride_xp, stride_seql, N, Q, BLOCK_K,
                         False, EXP2, HAS_SEQ, EVEN)
    for k0 in range(m0, m0 + BLOCK_M, BLOCK_K):
        acc = _diag_tile(acc, C_m, a_m, seq_m, offs_m, k0, B_base, x_base, dtc_ptr + cs,
                         dacs_ptr + cs, seq_base, pid_c, l, p, offs_n, offs_p, stride_Bl,
                         stride_Bn, stride_xl, stride_xp, stride_seql, N, Q, BLOCK_K,
                         True, EXP2, HAS_SEQ, EVEN)
    ok_out = ok_m[:, None] & (offs_p[None, :] < p)
    if HAS_D:  # skip connection D x_t, D per head or per (head, p)
        Dv = tl.load(D_ptr + pid_h * stride_Dh + offs_p * stride_Dp, mask=offs_p < p, other=0.0)
        xm = tl.load(x_base + t_m[:, None] * stride_xl + offs_p[None, :] * stride_xp,
                     mask=ok_out, other=0.0)
        acc += Dv.to(tl.float32)[None, :] * xm.to(tl.float32)
    if HAS_Z:  # gate: y · silu(z)
        zm = tl.load(z_ptr + pid_b.to(tl.int64) * stride_zb + t_m[:, None] * stride_zl
                     + pid_h * stride_zh + offs_p[None, :] * stride_zp,
                     mask=ok_out, other=0.0).to(tl.float32)
        acc *= zm * tl.sigmoid(zm)
    o = (out_ptr + pid_b.to(tl.int64) * stride_ob + t_m[:, None] * stride_ol + pid_h * stride_oh
         + offs_p[None, :] * stride_op)
    tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=ok_out)


@triton.jit
def _chunk_outputs_kernel(
    x_ptr, z_ptr, D_ptr, C_ptr, B_ptr,  # inputs (mamba_ssm's layouts)
    dtc_ptr, dacs_ptr,                  # Δ, dA_cs (b, h, c, q) float32
    H_ptr,                              # (b, c, h, p, n): the state entering each chunk
    seq_ptr, out_ptr,                   # seq_idx (b, l); out (b, l, h, p)
    l, h, p, nchunks, heads_per_group,
    stride_xb, stride_xl, stride_xh, stride_xp,
    stride_zb, stride_zl, stride_zh, stride_zp,
    stride_Cb, stride_Cl, stride_Cg, stride_Cn,
    stride_Bb, stride_Bl, stride_Bg, stride_Bn,
    stride_ob, stride_ol, stride_oh, stride_op,
    stride_seqb, stride_seql, stride_Dh, stride_Dp,
    N: tl.constexpr, Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, EXP2: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_SEQ: tl.constexpr, EVEN: tl.constexpr,
):
    # program → (b, c, h, p-block, row block), the row block fastest and the longest first
    pid = tl.program_id(0)
    n_mb: tl.constexpr = Q // BLOCK_M
    n_pb = tl.cdiv(p, BLOCK_P)
    pid_m = n_mb - 1 - pid % n_mb
    pid_p = (pid // n_mb) % n_pb
    pid_b, pid_c, pid_h = _bch(pid // (n_mb * n_pb), h, nchunks)
    H_base = H_ptr + ((pid_b * nchunks + pid_c) * h + pid_h).to(tl.int64) * p * N
    _output_rows(pid_m * BLOCK_M, pid_b, pid_c, pid_h, pid_p, H_base,
                 x_ptr, z_ptr, D_ptr, C_ptr, B_ptr, dtc_ptr, dacs_ptr, seq_ptr, out_ptr,
                 l, h, p, nchunks, heads_per_group,
                 stride_xb, stride_xl, stride_xh, stride_xp,
                 stride_zb, stride_zl, stride_zh, stride_zp,
                 stride_Cb, stride_Cl, stride_Cg, stride_Cn,
                 stride_Bb, stride_Bl, stride_Bg, stride_Bn,
                 stride_ob, stride_ol, stride_oh, stride_op,
                 stride_seqb, stride_seql, stride_Dh, stride_Dp,
                 N, Q, BLOCK_M, BLOCK_K, BLOCK_P, BLOCK_N, EXP2, HAS_D, HAS_Z, HAS_SEQ, EVEN,
                 False)


def output_tiles(q, p, cfg):
    """(BLOCK_M, BLOCK_K, BLOCK_P) for chunk q and head dim p: ``cfg``'s, within the chunk."""
    bm, bk = min(cfg["BLOCK_M"], q), min(cfg["BLOCK_K"], q)
    return bm, min(bk, bm), min(cfg["BLOCK_P"], p2(p))


def is_even(l, q, n, p, block_p):
    """True when no tile reaches past l, n or p (loads need no masks)."""
    return l % q == 0 and n == p2(n, 1) and p % block_p == 0


def launch_strides(x, z, C, B, out, D, seq_idx):
    """The stride arguments of ``_output_rows`` in its order (zeros for absent tensors)."""
    return (*x.stride(), *(z.stride() if z is not None else (0, 0, 0, 0)), *C.stride(),
            *B.stride(), *out.stride(), *(seq_idx.stride() if seq_idx is not None else (0, 0)),
            *((0, 0) if D is None else ((D.stride(0), 0) if D.ndim == 1 else D.stride())))


def chunk_outputs(x, C, B, dt_c, dA_cs, H, D=None, z=None, seq_idx=None, config=None):
    """out = (exp(a) ∘ C Hᵀ + (C Bᵀ ∘ L) (Δ x) + D x) · silu(z) per chunk, C Bᵀ formed on chip.

    Shapes: x, z (b, l, h, p); C, B (b, l, g, n); Δ, dA_cs (b, h, c, q) float32 (as
    ``chunk_states`` returns them); H (b, c, h, p, n) the state entering each chunk; D (h,) or
    (h, p); seq_idx (b, l) → out (b, l, h, p) in x's dtype. ``config``: ``CONFIG``'s keys.
    """
    b, l, h, p = x.shape
    g, n = C.shape[2], C.shape[3]
    c, q = dA_cs.shape[2], dA_cs.shape[3]
    cfg = dict(CONFIG, **(config or {}))
    BM, BK, BP = output_tiles(q, p, cfg)
    out = torch.empty(b, l, h, p, device=x.device, dtype=x.dtype)
    grid = (b * c * h * triton.cdiv(p, BP) * (q // BM),)
    _chunk_outputs_kernel[grid](
        x, z if z is not None else x, D if D is not None else x, C, B, dt_c, dA_cs, H,
        seq_idx if seq_idx is not None else x, out, l, h, p, c, h // g,
        *launch_strides(x, z, C, B, out, D, seq_idx),
        N=n, Q=q, BLOCK_M=BM, BLOCK_K=BK, BLOCK_P=BP, BLOCK_N=p2(n), EXP2=bool(cfg["EXP2"]),
        HAS_D=D is not None, HAS_Z=z is not None, HAS_SEQ=seq_idx is not None,
        EVEN=is_even(l, q, n, p, BP), num_warps=cfg["num_warps"], num_stages=1 if INTERP else cfg["num_stages"],
        **launch_options(cfg))
    return out
