"""Steps 1 and 8 of the SSD backward (chapter 10), the two ends of the chain: the gate
(dy and dz from dout) and the chunk cumsum backward (∂loss/∂a → dΔ, dA → ddt, d dt_bias). The
derivation is the docstring of ``mambalearn.mamba2.backward``.
"""

import torch
import triton
import triton.language as tl

from mambalearn.mamba2.common import LOG_DECAY_FLOOR, tile
from mambalearn.triton.common import softplus


# ---------------------------------------------------------------------------------------------
# 1. gate: dy = dout · silu(z), dz = dout · u · silu'(z)
@triton.jit
def _gate_bwd_kernel(dout_ptr, z_ptr, u_ptr, dy_ptr, dz_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    g = tl.load(dout_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=ok, other=0.0).to(tl.float32)  # y + D x, before the gate
    sig = tl.sigmoid(z)
    tl.store(dy_ptr + offs, (g * z * sig).to(dy_ptr.dtype.element_ty), mask=ok)
    dz = g * u * sig * (1.0 + z * (1.0 - sig))  # silu'(z) = σ(z) + z σ(z)(1 − σ(z))
    tl.store(dz_ptr + offs, dz.to(dz_ptr.dtype.element_ty), mask=ok)


def gate_backward(dout, z, u, cfg):
    """Step 1. (dy, dz), both (b, l, h, p): dy in u's dtype, dz in z's."""
    dout, z = dout.contiguous(), z.contiguous()
    dy, dz = torch.empty_like(u), torch.empty_like(z)
    BLOCK = cfg.gate_block
    _gate_bwd_kernel[(triton.cdiv(u.numel(), BLOCK),)](dout, z, u, dy, dz, u.numel(), BLOCK=BLOCK)
    return dy, dz


# ---------------------------------------------------------------------------------------------
# 8. chunk cumsum backward: ∂loss/∂a → reverse cumsum → dΔ, dA → softplus, clamp → ddt
@triton.jit
def _chunk_cumsum_bwd_kernel(
    ddA_ptr,        # (b, h, c, q) f32: ∂loss/∂a_t through Y_diag and Y_off
    ddt_x_ptr,      # (b, h, c, q) f32: x_t · G_t = ∂loss/∂Δ_t at fixed a
    dlast_ptr,      # (b, h, c) f32: ⟨α_c H_c, 𝒢_{c+1}⟩
    v_ptr,          # (b, h, c, q) f32: v_t = w_t x_t · (dS_c B_t), through S_c
    dt_c_ptr, dt_ptr, A_ptr, bias_ptr,   # Δ (b, h, c, q) f32; dt (b, l, h); A, dt_bias (h,)
    ddt_ptr,        # out: (b, l, h) f32, ∂loss/∂dt
    dA_ptr,         # out: (b, c, h) f32, this chunk's share of ∂loss/∂A
    l, h, nchunks, dt_min, dt_max,
    stride_dtb, stride_dtl, stride_dth,
    Q: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_V: tl.constexpr,
):
    # chunks on grid axis 0 (up to 2³¹ − 1 programs; axes 1 and 2 stop at 65 535); 64-bit b
    pid_c, pid_b, pid_h = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_t = tl.arange(0, Q)  # the whole chunk: the reverse cumsum runs along it
    t = pid_c * Q + offs_t
    ok_h = offs_h < h
    rows = ((pid_b * h + offs_h[:, None]) * nchunks + pid_c) * Q + offs_t[None, :]  # (H, Q)
    delta = tl.load(dt_c_ptr + rows, mask=ok_h[:, None], other=0.0)
    g_delta = tl.load(ddt_x_ptr + rows, mask=ok_h[:, None], other=0.0)
    da = tl.load(ddA_ptr + rows, mask=ok_h[:, None], other=0.0)  # ∂loss/∂a_t …
    dlast = tl.load(dlast_ptr + (pid_b * h + offs_h) * nchunks + pid_c, mask=ok_h, other=0.0)
    if HAS_V:  # … through S_c: −v_t at a_t and +Σ v at a_last (a sum with no rounded partner)
        v = tl.load(v_ptr + rows, mask=ok_h[:, None], other=0.0)
        da -= v
        dlast += tl.sum(v, axis=1)
    da += tl.where(offs_t[None, :] == Q - 1, dlast[:, None], 0.0)  # a_last = a_{q−1}: Δ = 0 past l
    R = tl.cumsum(da, axis=1, reverse=True)  # R_k = Σ_{t ≥ k} ∂loss/∂a_t = ∂loss/∂(Δ_k A)
    A = tl.load(A_ptr + offs_h, mask=ok_h, other=0.0).to(tl.float32)
    dA_out = dA_ptr + (pid_b * nchunks + pid_c) * h + offs_h
    # a step whose Δ A the forward floored (``common.log_decay``: A = −∞) does not move with Δ or
    # A; the where keeps −∞ · R (a NaN when R = 0) out of both sums
    free = delta * A[:, None] >= LOG_DECAY_FLOOR
    tl.store(dA_out, tl.sum(tl.where(free, delta * R, 0.0), axis=1), mask=ok_h)
    d_delta = g_delta + tl.where(free, A[:, None] * R, 0.0)  # ∂loss/∂Δ
    # back through Δ = clamp(softplus(dt + dt_bias)), recomputing the pre-activation
    ok = ok_h[:, None] & (t[None, :] < l)
    v = tl.load(dt_ptr + pid_b * stride_dtb + (pid_c * Q).to(tl.int64) * stride_dtl
                + offs_t[None, :] * stride_dtl + offs_h[:, None] * stride_dth, mask=ok,
                other=0.0).to(tl.float32)
    if HAS_BIAS:
        v += tl.load(bias_ptr + offs_h, mask=ok_h, other=0.0).to(tl.float32)[:, None]
    if SOFTPLUS:  # softplus' = σ below mamba_ssm's threshold of 20, the identity above
        sp = softplus(v)
        d_delta = tl.where(v <= 20.0, d_delta * tl.sigmoid(v), d_delta)
    else:
        sp = v
    if HAS_LIMIT:  # clamp passes the gradient only inside [dt_min, dt_max], as torch.clamp
        d_delta = tl.where((sp >= dt_min) & (sp <= dt_max), d_delta, 0.0)
    tl.store(ddt_ptr + (pid_b * l + t[None, :]) * h + offs_h[:, None], d_delta, mask=ok)


def chunk_cumsum_backward(ddA, ddt_x, dlast, dt_c, dt, A, dt_bias=None, dt_softplus=False,
                          dt_limit=(0.0, float("inf")), v=None, *, cfg):
    """Step 8. (ddt (b, l, h) float32, dA (h,) float32, ddt_bias (h,) float32 or None).

    ∂loss/∂a_t = ddA_t − v_t + [t = last](dlast + Σ_s v_s); ddt_x is ∂loss/∂Δ at fixed a."""
    b, l, h = dt.shape
    c, q = dt_c.shape[2], dt_c.shape[3]
    ddt = torch.empty(b, l, h, device=dt.device, dtype=torch.float32)
    dA = torch.empty(b, c, h, device=dt.device, dtype=torch.float32)
    BLOCK_H = tile(cfg.cumsum_heads, h, 1)
    _chunk_cumsum_bwd_kernel[(c, b, triton.cdiv(h, BLOCK_H))](
        ddA, ddt_x, dlast, v if v is not None else ddA, dt_c, dt, A,
        dt_bias if dt_bias is not None else A, ddt, dA,
        l, h, c, float(dt_limit[0]), float(dt_limit[1]), *dt.stride(),
        Q=q, BLOCK_H=BLOCK_H, HAS_BIAS=dt_bias is not None, SOFTPLUS=dt_softplus,
        HAS_LIMIT=tuple(dt_limit) != (0.0, float("inf")), HAS_V=v is not None,
        num_warps=cfg.cumsum_warps)
    return ddt, dA.sum((0, 1)), ddt.sum((0, 1)) if dt_bias is not None else None
