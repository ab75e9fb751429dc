"""Mamba-3 decode steps as Triton kernels: SISO (rotations fused in) and MIMO of rank r.

Both give each program a (BLOCK_P, n) tile of one (batch, head) state, read it once, update it
in registers and write it once: a step is bound by the bytes of the state (chapter 12), and
MIMO's r outer products and r read-outs are arithmetic on a tile already in registers. The
oracles are ``mambalearn.mamba3.step_reference``; the signatures those of mamba_ssm's
``mamba3_siso_step`` and ``mamba3_step_fn``.
"""

import torch
import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.mamba3 import args
from mambalearn.mamba3.common import PI, cos_sin, exp, mod_two_pi, tanh
from mambalearn.mamba3.step_reference import check_mimo_step, check_siso_step
from mambalearn.utils import check_writable, refuse_grad


@triton.jit
def _siso_step_kernel(
    C_ptr, B_ptr, X_ptr, ADT_ptr, DT_ptr, Trap_ptr, Cb_ptr, Bb_ptr, Ang_ptr, D_ptr, Z_ptr,
    ang_ptr, S_ptr, kst_ptr, vst_ptr,  # the cache: angle (b, h, na), ssm (b, h, p, n), k, v
    Out_ptr, ang_out_ptr, S_out_ptr, k_out_ptr,  # out (b, h, p) and the new cache entries
    h, g, p, n, na, tiles_p,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
):
    pid = tl.program_id(0)
    pp, hi, bi = pid % tiles_p, (pid // tiles_p) % h, pid // (tiles_p * h)
    row = bi.to(tl.int64) * h + hi
    offs_n = tl.arange(0, BLOCK_N)  # state columns, in their own (interleaved) order
    offs_p = pp * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_n, mask_p = offs_n < n, offs_p < p
    # 1. the token's q and k, turned by θ = θ_prev + Δ π tanh(a), kept in the state's column
    # order: column c pairs with c ^ 1, so R(θ)x = x cos θ + (∓ x_{c^1}) sin θ, one gather each
    partner = offs_n ^ 1
    sign = tl.where(offs_n % 2 == 0, -1.0, 1.0)  # (x₀, x₁) ↦ (x₀ c − x₁ s, x₁ c + x₀ s)
    j = offs_n // 2  # the pair, and its angle
    rot = mask_n & (j < na)
    dt = tl.load(DT_ptr + row).to(tl.float32)
    a = tl.load(Ang_ptr + row * na + j, mask=rot, other=0.0).to(tl.float32)
    theta = tl.load(ang_ptr + row * na + j, mask=rot, other=0.0).to(tl.float32)
    theta += PI * tanh(a) * dt
    theta = mod_two_pi(theta)
    cos, sin = cos_sin(theta)
    sin = sign * sin
    bc_base = (bi * g + hi // (h // g)) * n
    q = tl.load(C_ptr + bc_base + offs_n, mask=mask_n, other=0.0).to(tl.float32) \
        + tl.load(Cb_ptr + hi * n + offs_n, mask=mask_n, other=0.0)
    qp = tl.load(C_ptr + bc_base + partner, mask=mask_n, other=0.0).to(tl.float32) \
        + tl.load(Cb_ptr + hi * n + partner, mask=mask_n, other=0.0)
    k = tl.load(B_ptr + bc_base + offs_n, mask=mask_n, other=0.0).to(tl.float32) \
        + tl.load(Bb_ptr + hi * n + offs_n, mask=mask_n, other=0.0)
    kp = tl.load(B_ptr + bc_base + partner, mask=mask_n, other=0.0).to(tl.float32) \
        + tl.load(Bb_ptr + hi * n + partner, mask=mask_n, other=0.0)
    q, k = q * cos + qp * sin, k * cos + kp * sin  # (BLOCK_N,) each
    if pp == 0:  # one tile per head writes the per-head cache entries
        tl.store(ang_out_ptr + row * na + j, theta, mask=rot & (offs_n % 2 == 0))
        tl.store(k_out_ptr + row * n + offs_n, k, mask=mask_n)
    # 2. the trapezoid: α, β = (1 − λ)Δα on the previous token, γ = λΔ on this one
    lam = tl.sigmoid(tl.load(Trap_ptr + row).to(tl.float32))
    alpha = exp(tl.load(ADT_ptr + row).to(tl.float32))
    beta, gamma = (1.0 - lam) * dt * alpha, lam * dt
    k_prev = tl.load(kst_ptr + row * n + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    vp = tl.load(vst_ptr + row * p + offs_p, mask=mask_p, other=0.0).to(tl.float32)
    v = tl.load(X_ptr + row * p + offs_p, mask=mask_p, other=0.0).to(tl.float32)
    # 3. the state tile: one contiguous read, updated in registers, one write
    mask_s = mask_p[:, None] & mask_n[None, :]
    s_offs = row * p * n + offs_p[:, None] * n + offs_n[None, :]  # (BLOCK_P, BLOCK_N)
    S = tl.load(S_ptr + s_offs, mask=mask_s, other=0.0, eviction_policy="evict_first")
    S = alpha * S + (beta * vp)[:, None] * k_prev[None, :] + (gamma * v)[:, None] * k[None, :]
    tl.store(S_out_ptr + s_offs, S, mask=mask_s)
    y = tl.sum(S * q[None, :], axis=1)  # (BLOCK_P,)
    if HAS_D:
        y += tl.load(D_ptr + hi).to(tl.float32) * v
    if HAS_Z:
        z = tl.load(Z_ptr + row * p + offs_p, mask=mask_p, other=0.0).to(tl.float32)
        y = y * z * tl.sigmoid(z)
    tl.store(Out_ptr + row * p + offs_p, y, mask=mask_p)


def _tile_p(p, n):
    """Rows per tile: about 1024 state values (4 KB fp32) per program, as chapter 12's step."""
    return max(1, min(triton.next_power_of_2(p), 1024 // triton.next_power_of_2(n)))


def mamba3_siso_step(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None,
                     Input_States=None):
    """One Mamba-3 SISO token: (out (b, h, p), [angle, ssm, k, v]) — new cache tensors.

    Shapes as ``mambalearn.mamba3.step_reference.mamba3_siso_step_ref`` (the oracle), whose argument
    rules it shares (``check_siso_step``); any strides. Not differentiable: while autograd
    records, inputs that require grad are refused. Matches
    ``mamba_ssm.ops.triton.mamba3.mamba3_siso_step.mamba3_siso_step``.
    """
    b, h, p, g, n, na = check_siso_step(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z,
                                        Input_States)
    named = args.with_states(dict(Q=Q, K=K, V=V, ADT=ADT, DT=DT, Trap=Trap, Q_bias=Q_bias,
                                  K_bias=K_bias, Angles=Angles, D=D, Z=Z), Input_States)
    refuse_grad("mamba3_siso_step", "the step is for inference: call it under torch.no_grad() "
                "(mamba3_siso_combined has gradients)", **named)
    args.check_tensors("mamba3_siso_step", named)
    c = lambda X: None if X is None else X.contiguous()  # the kernel indexes row-major tensors
    st = [c(t) for t in Input_States]
    out = torch.empty((b, h, p), device=V.device, dtype=V.dtype)  # row-major, whatever V's
    ang_out = torch.empty(b, h, na, device=V.device, dtype=torch.float32)
    S_out = torch.empty(b, h, p, n, device=V.device, dtype=torch.float32)
    k_out = torch.empty(b, h, n, device=V.device, dtype=torch.float32)
    if b * h == 0:  # no head to step
        return out, [ang_out, S_out, k_out, c(V)]
    bp = _tile_p(p, n)
    tiles_p = max(1, triton.cdiv(p, bp))  # p = 0: one tile per head still turns θ and k
    _siso_step_kernel[(tiles_p * h * b,)](
        c(Q), c(K), c(V), c(ADT), c(DT), c(Trap), c(Q_bias), c(K_bias), c(Angles), c(D), c(Z),
        *st, out, ang_out, S_out, k_out,
        h, g, p, n, na, tiles_p,
        BLOCK_P=bp, BLOCK_N=triton.next_power_of_2(n), HAS_D=D is not None,
        HAS_Z=Z is not None, num_warps=2,
    )
    return out, [ang_out, S_out, k_out, c(V)]


@triton.jit
def _mimo_step_kernel(
    S_ptr, Bs_ptr, Xs_ptr, A_ptr, B_ptr, C_ptr, D_ptr, x_ptr, dt_ptr, trap_ptr,
    xproj_ptr, outproj_ptr, z_ptr, zproj_ptr, Out_ptr,
    h, p, n, tiles_p,
    R: tl.constexpr,  # the MIMO rank r
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_OUTPROJ: tl.constexpr, HAS_Z: tl.constexpr,
):
    pid = tl.program_id(0)
    pp, hi, bi = pid % tiles_p, (pid // tiles_p) % h, pid // (tiles_p * h)
    row = bi.to(tl.int64) * h + hi
    offs_p = pp * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p, mask_n = offs_p < p, offs_n < n
    mask_s = mask_p[:, None] & mask_n[None, :]
    s_offs = row * p * n + offs_p[:, None] * n + offs_n[None, :]
    S = tl.load(S_ptr + s_offs, mask=mask_s, other=0.0, eviction_policy="evict_first")
    dt = tl.load(dt_ptr + row).to(tl.float32)
    lam = tl.load(trap_ptr + row).to(tl.float32)
    alpha = exp(tl.load(A_ptr + row).to(tl.float32) * dt)
    beta, gamma = (1.0 - lam) * dt * alpha, lam * dt
    x = tl.load(x_ptr + row * p + offs_p, mask=mask_p, other=0.0).to(tl.float32)
    xs = tl.load(Xs_ptr + row * p + offs_p, mask=mask_p, other=0.0).to(tl.float32)
    # 1. the state: decay once, then r outer products for this token and r for the previous one
    S = S * alpha
    for r in tl.static_range(R):
        bc_offs = ((bi * R + r) * h + hi) * n + offs_n  # (b, r, h, n)
        Br = tl.load(B_ptr + bc_offs, mask=mask_n, other=0.0).to(tl.float32)
        Bsr = tl.load(Bs_ptr + bc_offs, mask=mask_n, other=0.0).to(tl.float32)
        xp = tl.load(xproj_ptr + (r * h + hi) * p + offs_p, mask=mask_p, other=0.0).to(tl.float32)
        S += (gamma * x * xp)[:, None] * Br[None, :] + (beta * xs * xp)[:, None] * Bsr[None, :]
    tl.store(S_ptr + s_offs, S, mask=mask_s, eviction_policy="evict_first")
    # 2. r read-outs of the new state, gated and mixed back into one output per channel
    D = tl.load(D_ptr + hi).to(tl.float32)
    acc = tl.zeros([BLOCK_P], dtype=tl.float32)
    for r in tl.static_range(R):
        bc_offs = ((bi * R + r) * h + hi) * n + offs_n
        Cr = tl.load(C_ptr + bc_offs, mask=mask_n, other=0.0).to(tl.float32)
        xp = tl.load(xproj_ptr + (r * h + hi) * p + offs_p, mask=mask_p, other=0.0).to(tl.float32)
        y = tl.sum(S * Cr[None, :], axis=1) + D * x * xp  # (BLOCK_P,)
        if HAS_Z:
            zr = tl.load(z_ptr + row * p + offs_p, mask=mask_p, other=0.0).to(tl.float32)
            zr *= tl.load(zproj_ptr + (r * h + hi) * p + offs_p, mask=mask_p, other=0.0)
            y = y * zr * tl.sigmoid(zr)
        if HAS_OUTPROJ:
            acc += y * tl.load(outproj_ptr + (r * h + hi) * p + offs_p, mask=mask_p, other=0.0)
        else:  # out (b, r, h, p)
            tl.store(Out_ptr + ((bi * R + r) * h + hi) * p + offs_p, y, mask=mask_p)
    if HAS_OUTPROJ:
        tl.store(Out_ptr + row * p + offs_p, acc, mask=mask_p)


def mamba3_mimo_step(state, Bstate, Xstate, A, B, C, D, x, dt, trap, xproj, outproj=None,
                     z=None, zproj=None):
    """One MIMO token of rank r, ``state`` (float32) updated in place; returns out.

    Shapes and formula as ``mambalearn.mamba3.step_reference.mamba3_mimo_step_ref`` (the oracle),
    whose argument rules it shares (``check_mimo_step``); argument names of mamba_ssm's
    ``mamba3_step_fn``. Any strides (a strided state is updated through a contiguous copy; an
    expanded one is refused). Not differentiable: while autograd records, inputs that require
    grad are refused.
    """
    b, r, h, p, n = check_mimo_step(state, Bstate, Xstate, A, B, C, D, x, dt, trap, xproj,
                                    outproj, z, zproj)
    named = dict(state=state, Bstate=Bstate, Xstate=Xstate, A=A, B=B, C=C, D=D, x=x, dt=dt,
                 trap=trap, xproj=xproj, outproj=outproj, z=z, zproj=zproj)
    refuse_grad("mamba3_mimo_step", "it is an inference step that updates the state in place: "
                "call it under torch.no_grad()", **named)
    args.check_tensors("mamba3_mimo_step", named)
    if state.dtype != torch.float32:
        raise TypeError(f"state must be float32 (it is updated in place in float32), got "
                        f"{state.dtype}")
    check_writable("state", state)
    c = lambda X: None if X is None else X.contiguous()
    shape = (b, h, p) if outproj is not None else (b, r, h, p)
    out = torch.empty(shape, device=x.device, dtype=x.dtype)
    if b * h * p == 0:  # no state element to update
        return out
    work = c(state)  # the kernel updates a row-major state; a strided one is copied back below
    bp = _tile_p(p, n)
    tiles_p = triton.cdiv(p, bp)
    _mimo_step_kernel[(tiles_p * h * b,)](
        work, c(Bstate), c(Xstate), c(A), c(B), c(C), c(D), c(x), c(dt), c(trap),
        c(xproj), c(outproj), c(z), c(zproj), out,
        h, p, n, tiles_p,
        R=r, BLOCK_P=bp, BLOCK_N=triton.next_power_of_2(n),
        HAS_OUTPROJ=outproj is not None, HAS_Z=z is not None, num_warps=2,
    )
    if work is not state:
        state.copy_(work)
    return out
