"""Step 7 of the SSD backward (chapter 10): dx, with x · G for dΔ, dD, and v for step 8. The
derivation is the docstring of ``mambalearn.mamba2.backward``.
"""

import torch
import triton
import triton.language as tl

from mambalearn.mamba2.backward_config import blocks, launch_args
from mambalearn.mamba2.common import bch_of, load_row, load_tile, load_tile_t, p2


# ---------------------------------------------------------------------------------------------
# 7. dx: G_s = Σ_{t≥s} P_ts dy_t + exp(a_last − a_s) dS_c B_s,  dx_s = Δ_s G_s + D dy_s
@triton.jit
def _dx_kernel(
    x_ptr, dy_ptr, B_ptr,           # x, dy (b, l, h, p); B (b, l, g, n)
    CB_ptr, dS_ptr,                 # CB (b, c, g, q, q) f32; dS (b, c, h, p, n) f32
    dt_ptr, dA_cs_ptr, D_ptr, seq_ptr,
    dx_ptr,                         # out: (b, l, h, p) in x's dtype
    ddt_ptr,                        # out: (b, h, c, q) f32: x_s · G_s
    dD_ptr,                         # out: (b, c, h, s-blocks, p) f32: Σ_s dy_s x_s
    v_ptr,                          # out: (b, h, c, q) f32: v_s = w_s x_s · (dS_c B_s) (step 8)
    l, h, p, g, nchunks, heads_per_group, stride_Dh, stride_Dp,
    N: tl.constexpr, Q: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_D: tl.constexpr, HAS_SEQ: tl.constexpr, HAS_V: tl.constexpr,
):
    pid_bch, pid_s = tl.program_id(0), tl.program_id(1)  # (b, c, h) on the unlimited axis
    pid_b, pid_c, pid_h = bch_of(pid_bch, h, nchunks)
    pid_g = pid_h // heads_per_group
    offs_s = pid_s * BLOCK_Q + tl.arange(0, BLOCK_Q)  # the steps s this program differentiates
    offs_p = tl.arange(0, BLOCK_P)  # the whole head dim: x_s · G_s needs all of it
    t_s = pid_c * Q + offs_s
    ok_s = (offs_s < Q) & (t_s < l)
    cs = ((pid_b.to(tl.int64) * h + pid_h) * nchunks + pid_c) * Q
    a_s, dt_s = load_row(dA_cs_ptr + cs, offs_s, Q), load_row(dt_ptr + cs, offs_s, Q)
    a_last = tl.load(dA_cs_ptr + cs + Q - 1)
    bt0 = pid_b.to(tl.int64) * l + pid_c * Q  # the chunk's first step (64-bit: past 2³¹)
    xdy_base = bt0 * h * p + pid_h * p  # step k of the chunk, this head: + k·h·p
    BC_base = bt0 * g * N + pid_g * N
    if HAS_SEQ:
        seq_s = tl.load(seq_ptr + pid_b * l + t_s, mask=ok_s, other=-2)
    # 1. chunk state (S_c = Σ_s w_s x_s B_sᵀ): exp(a_last − a_s) B_s dS_cᵀ, first, so that v_s
    # is taken from it before the diagonal block is added (fewer live registers)
    dS_base = dS_ptr + pid_bch.to(tl.int64) * p * N
    G = tl.zeros((BLOCK_Q, BLOCK_P), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        B_s = load_tile(B_ptr + BC_base, offs_s, ok_s, g * N, offs_n, N)  # (S, N)
        dST = load_tile_t(dS_base, offs_p, offs_p < p, N, offs_n, N)  # (N, P) f32
        G += tl.dot(B_s, dST.to(B_s.dtype))
    decay_out = tl.exp(tl.minimum(a_last - a_s, 0.0))
    if HAS_SEQ:
        seq_last = tl.load(seq_ptr + pid_b * l + tl.minimum((pid_c + 1) * Q, l) - 1)
        decay_out = tl.where(seq_s == seq_last, decay_out, 0.0)
    G *= decay_out[:, None]
    if HAS_V:  # the chunk state's share of ∂a, from these very float32 numbers: −v_s at a_s,
        # +Σ_s v_s at a_last (step 8)
        x_v = load_tile(x_ptr + xdy_base, offs_s, ok_s, h * p, offs_p, p).to(tl.float32)  # (S, P)
        tl.store(v_ptr + cs + offs_s, dt_s * tl.sum(x_v * G, axis=1), mask=offs_s < Q)
    # 2. diagonal block: Σ_{t ≥ s} P_ts dy_t with P_ts = CB_ts exp(a_t − a_s), read as Pᵀ (S, T)
    CB_base = CB_ptr + ((pid_b.to(tl.int64) * nchunks + pid_c) * g + pid_g) * Q * Q
    k0 = pid_s * BLOCK_Q
    while k0 < Q:
        offs_t = k0 + tl.arange(0, BLOCK_Q)
        t_t = pid_c * Q + offs_t
        ok_t = (offs_t < Q) & (t_t < l)
        cbT = load_tile_t(CB_base, offs_t, offs_t < Q, Q, offs_s, Q)  # (S, T)
        keep = offs_t[None, :] >= offs_s[:, None]
        if HAS_SEQ:
            seq_t = tl.load(seq_ptr + pid_b * l + t_t, mask=ok_t, other=-1)
            keep = keep & (seq_t[None, :] == seq_s[:, None])
        a_t = load_row(dA_cs_ptr + cs, offs_t, Q)
        expo = tl.where(keep, tl.minimum(a_t[None, :] - a_s[:, None], 0.0), -float("inf"))
        PT = cbT * tl.exp(expo)  # (S, T): Pᵀ, 0 where not kept
        dy_t = load_tile(dy_ptr + xdy_base, offs_t, ok_t, h * p, offs_p, p)  # (T, P)
        G += tl.dot(PT.to(dy_t.dtype), dy_t)  # (S, P)
        k0 += BLOCK_Q
    # 3. dx, x · G (for Δ, step 8) and dD;  G_s = ∂loss/∂(Δ_s x_s)
    x_s = load_tile(x_ptr + xdy_base, offs_s, ok_s, h * p, offs_p, p).to(tl.float32)  # (S, P)
    dx = G * dt_s[:, None]
    if HAS_D:  # out = y + D x
        dy_s = load_tile(dy_ptr + xdy_base, offs_s, ok_s, h * p, offs_p, p).to(tl.float32)
        Dv = tl.load(D_ptr + pid_h * stride_Dh + offs_p * stride_Dp, mask=offs_p < p, other=0.0)
        dx += Dv.to(tl.float32)[None, :] * dy_s
        dD_row = (pid_bch * tl.cdiv(Q, BLOCK_Q) + pid_s).to(tl.int64) * p
        tl.store(dD_ptr + dD_row + offs_p, tl.sum(dy_s * x_s, axis=0), mask=offs_p < p)
    dx_ptrs = dx_ptr + xdy_base + offs_s[:, None] * h * p + offs_p[None, :]
    tl.store(dx_ptrs, dx.to(dx_ptr.dtype.element_ty), mask=ok_s[:, None] & (offs_p[None, :] < p))
    tl.store(ddt_ptr + cs + offs_s, tl.sum(x_s * G, axis=1), mask=offs_s < Q)


def dx_backward(x, dy, B, CB, dS, dt_c, dA_cs, D=None, seq_idx=None, v=None, *, cfg):
    """Step 7. (dx (b, l, h, p) in x's dtype, x·G (b, h, c, q) float32, dD (D's shape) or None).
    If ``v`` (b, h, c, q) float32 is given, fills it with v_s = w_s x_s · (dS_c B_s) (step 8)."""
    x, dy, B = x.contiguous(), dy.contiguous(), B.contiguous()
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    c, q = dA_cs.shape[2], dA_cs.shape[3]
    BQ = blocks(q, cfg)
    BN, opts = launch_args(cfg.dx, n)
    nblk = triton.cdiv(q, BQ)
    dx = torch.empty_like(x)
    ddt_x = torch.empty(b, h, c, q, device=x.device, dtype=torch.float32)
    dD = None if D is None else torch.empty(b, c, h, nblk, p, device=x.device, dtype=torch.float32)
    Dst = (0, 0) if D is None else ((D.stride(0), 0) if D.ndim == 1 else tuple(D.stride()))
    _dx_kernel[(b * c * h, nblk)](
        x, dy, B, CB, dS, dt_c, dA_cs, D if D is not None else dt_c,
        seq_idx if seq_idx is not None else dt_c, dx, ddt_x, dD if D is not None else dt_c,
        v if v is not None else dt_c, l, h, p, g, c, h // g, *Dst,
        N=n, Q=q, BLOCK_Q=BQ, BLOCK_P=p2(p), BLOCK_N=BN,
        HAS_D=D is not None, HAS_SEQ=seq_idx is not None, HAS_V=v is not None, **opts)
    if D is not None:
        dD = dD.sum((0, 1, 3))  # (h, p)
        dD = dD.sum(-1) if D.ndim == 1 else dD
    return dx, ddt_x, dD
