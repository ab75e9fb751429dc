"""The Mamba-3 SISO backward in two kernels: a short reverse scan, then every chunk in parallel.

The forward saved the pre-state S₀ entering each chunk and its angles θ₀; everything inside a
chunk is recomputed on chip (chapter 07's recomputation). What couples the chunks backwards is
the gradient of the state alone, dS ← e^{c_end} dS + (e^{c} dy)ᵀ q (chapter 10's state passing,
reversed), so

1. ``_bwd_state_kernel`` — a program per (head, batch) walks the chunks in reverse carrying only
   dS (p × n); it stores the dS that *leaves* every chunk, and the one entering the first
   (the gradient of Input_States' ssm). It needs q and dy per chunk, nothing else.
2. ``_bwd_chunk_kernel`` — a program per (chunk, head, batch), all independent, launched twice
   (``PART`` 0: dz, dv, dADT, dw, dγ, dD; 1: dq, dk, dθ, the bias sums) so that each launch holds
   half the accumulators; both recompute the chunk. With
   P = q kᵀ ∘ L ∘ w the in-chunk matrix and u_s = e^{c_end − c_s} w_s,

    dq  = (dy vᵀ ∘ L ∘ w) k + e^{c} dy S₀ + γ (dy·v) k           (rotated frame, then R(θ)ᵀ)
    dk  = (dy vᵀ ∘ L ∘ w)ᵀ q + u (v dS)                          (+ the final k state's gradient)
    dv  = Pᵀ dy + u (k dSᵀ) + (D + γ q·k) dy
    dw_s = Σ_t (q kᵀ ∘ L ∘ dy vᵀ)_ts + e^{c_end − c_s} v_s·(dS k_s)
    dc  → dADT (a reverse cumsum inside the chunk),  dθ per step

Splitting keeps the tiles alive in one program few (the single-pass version spilled 5.7 KB of
registers per thread on sm_90 at chunk 64; now 1.7 KB and 0.6 KB for the two parts, 0.6 KB and
0.15 KB at chunk 32) and gives b·h·c programs instead of b·h. The cheap per-step arithmetic that
couples neighbouring steps or all steps — dDT and dTrap (w_s mixes steps s and s + 1), the
reverse cumsum of dθ over l into dAngles — runs in PyTorch in :func:`launch_backward`.
"""

import torch
import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.triton.mamba3.common import (
    SIZES,
    blocks,
    causal_decay,
    chunk_angles,
    chunk_scalars,
    load_pairs,
    rotate,
)


@triton.jit
def _store_pairs(ptr, stride_t, offs_t, offs_j, l, half, xe, xo):
    mask = (offs_t[:, None] < l) & (offs_j[None, :] < half)
    base = ptr + offs_t[:, None] * stride_t + 2 * offs_j[None, :]
    tl.store(base, xe, mask=mask)
    tl.store(base + 1, xo, mask=mask)


@triton.jit
def _gated_dy(dOut_ptr, Z_ptr, offs, mask, HAS_Z: tl.constexpr):
    """dy = dout · silu(z): the gradient reaching y, before the gate."""
    dy = tl.load(dOut_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(Z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = dy * z * tl.sigmoid(z)
    return dy


@triton.jit
def _rotated_q(Q_ptr, Qb_ptr, ang_ptr, dt_ptr, adt_ptr, trap_ptr, theta0, offs_t, offs_j,
               l, h, g, n, na, qk_off, hi):
    """Recompute a chunk's rotated q (two (Q, J) tiles) and its scalars, as the forward did."""
    dt, adt, lam, gamma, w = chunk_scalars(dt_ptr, adt_ptr, trap_ptr, offs_t, l)
    theta, tanh_a, turn = chunk_angles(ang_ptr, h * na, offs_t, offs_j, l, na, dt, theta0)
    qe, qo = load_pairs(Q_ptr + qk_off, Qb_ptr + hi * n, g * n, offs_t, offs_j, l, n // 2)
    qe, qo = rotate(qe, qo, tl.cos(theta), tl.sin(theta))
    return qe, qo, adt


@triton.jit(do_not_specialize=SIZES)
def _bwd_state_kernel(
    Q_ptr, Qb_ptr, Ang_ptr, ADT_ptr, DT_ptr, Trap_ptr, Z_ptr, dOut_ptr, theta_chunks_ptr,
    dS_final_ptr,  # (b, h, p, n) or None: the gradient of the final ssm state
    dS_chunks_ptr,  # out: (b, h, c, p, n), the gradient of the state leaving each chunk
    dS0_ptr,  # out: (b, h, p, n), the gradient of the state entering chunk 0
    l, h, g, p, n, na, n_chunks,
    Q: tl.constexpr, J: tl.constexpr, P: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_DS: tl.constexpr, DOT: tl.constexpr,
):
    hi = tl.program_id(0)
    bi = tl.program_id(1).to(tl.int64)
    gi = hi // (h // g)
    offs_j, offs_p = tl.arange(0, J), tl.arange(0, P)
    mask_pj = (offs_p[:, None] < p) & (offs_j[None, :] < n // 2)
    row = bi * h + hi
    s_offs = offs_p[:, None] * n + 2 * offs_j[None, :]  # (P, J): the even columns
    dSe = tl.zeros([P, J], dtype=tl.float32)
    dSo = tl.zeros([P, J], dtype=tl.float32)
    if HAS_DS:
        dSe = tl.load(dS_final_ptr + row * p * n + s_offs, mask=mask_pj, other=0.0)
        dSo = tl.load(dS_final_ptr + row * p * n + s_offs + 1, mask=mask_pj, other=0.0)
    ci = n_chunks - 1
    while ci >= 0:
        base = (row * n_chunks + ci) * p * n
        tl.store(dS_chunks_ptr + base + s_offs, dSe, mask=mask_pj)
        tl.store(dS_chunks_ptr + base + s_offs + 1, dSo, mask=mask_pj)
        offs_t = ci * Q + tl.arange(0, Q)
        theta0 = tl.load(theta_chunks_ptr + (row * n_chunks + ci) * na + offs_j,
                         mask=offs_j < na, other=0.0)
        qe, qo, adt = _rotated_q(Q_ptr, Qb_ptr, Ang_ptr + (bi * l * h + hi) * na,
                                 DT_ptr + row * l, ADT_ptr + row * l, Trap_ptr + row * l, theta0,
                                 offs_t, offs_j, l, h, g, n, na, (bi * l * g + gi) * n, hi)
        tp = (bi * l * h + hi) * p + offs_t[:, None] * h * p + offs_p[None, :]
        mask_tp = (offs_t[:, None] < l) & (offs_p[None, :] < p)
        dy = _gated_dy(dOut_ptr, Z_ptr, tp, mask_tp, HAS_Z)  # (Q, P)
        dye = tl.trans(dy * tl.exp(tl.cumsum(adt, axis=0))[:, None]).to(DOT)  # (P, Q)
        decay = tl.exp(tl.sum(adt, axis=0))
        dSe = dSe * decay + tl.dot(dye, qe.to(DOT))  # (P, J)
        dSo = dSo * decay + tl.dot(dye, qo.to(DOT))
        ci -= 1
    tl.store(dS0_ptr + row * p * n + s_offs, dSe, mask=mask_pj)
    tl.store(dS0_ptr + row * p * n + s_offs + 1, dSo, mask=mask_pj)


@triton.jit(do_not_specialize=SIZES)
def _bwd_chunk_kernel(
    Q_ptr, K_ptr, V_ptr, ADT_ptr, DT_ptr, Trap_ptr, Qb_ptr, Kb_ptr, Ang_ptr, D_ptr, Z_ptr,
    dOut_ptr, dk_final_ptr,  # dout (b, l, h, p); the final k state's gradient (b, h, n) or None
    S_chunks_ptr, theta_chunks_ptr, dS_chunks_ptr,  # S₀, θ₀ (forward) and dS (kernel 1)
    dQ_ptr, dK_ptr, dV_ptr, dZ_ptr,  # (b, l, h, n) per head ×2, (b, l, h, p) ×2
    dADT_ptr, dW_ptr, dG_ptr, dth_ptr,  # (b, h, l) ×3; dθ per step (b, l, h, na)
    dQb_ptr, dKb_ptr, dD_ptr,  # per-chunk partial sums (b, h, c, n) ×2, (b, h, c)
    l, h, g, p, n, na, n_chunks,
    Q: tl.constexpr, J: tl.constexpr, P: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DK: tl.constexpr, DOT: tl.constexpr,
    PART: tl.constexpr,  # 0: dz, dv, dADT, dw, dγ, dD; 1: dq, dk, dθ, the bias sums
):
    ci = tl.program_id(0)
    hi = tl.program_id(1)
    bi = tl.program_id(2).to(tl.int64)
    gi = hi // (h // g)
    half = n // 2
    offs_j, offs_p, rows = tl.arange(0, J), tl.arange(0, P), tl.arange(0, Q)
    mask_j, mask_p = offs_j < half, offs_p < p
    mask_pj = mask_p[:, None] & mask_j[None, :]
    row = bi * h + hi
    chunk = row * n_chunks + ci
    offs_t = ci * Q + rows
    mask_t = offs_t < l
    mask_tp = mask_t[:, None] & mask_p[None, :]
    tp = (bi * l * h + hi) * p + offs_t[:, None] * h * p + offs_p[None, :]  # (Q, P) offsets
    qk_off = (bi * l * g + gi) * n
    s_offs = chunk * p * n + offs_p[:, None] * n + 2 * offs_j[None, :]
    D = 0.0
    if HAS_D:
        D = tl.load(D_ptr + hi).to(tl.float32)

    # 1. recompute the chunk: scalars, angles, rotated q and k, the decay matrix. Then one of two
    # halves of the gradients (PART): each launch keeps half the accumulators in registers.
    dt, adt, lam, gamma, w = chunk_scalars(DT_ptr + row * l, ADT_ptr + row * l,
                                           Trap_ptr + row * l, offs_t, l)
    theta0 = tl.load(theta_chunks_ptr + chunk * na + offs_j, mask=offs_j < na, other=0.0)
    theta, tanh_a, turn = chunk_angles(Ang_ptr + (bi * l * h + hi) * na, h * na, offs_t, offs_j,
                                       l, na, dt, theta0)
    qe, qo = load_pairs(Q_ptr + qk_off, Qb_ptr + hi * n, g * n, offs_t, offs_j, l, half)
    qe, qo = rotate(qe, qo, tl.cos(theta), tl.sin(theta))
    ke, ko = load_pairs(K_ptr + qk_off, Kb_ptr + hi * n, g * n, offs_t, offs_j, l, half)
    ke, ko = rotate(ke, ko, tl.cos(theta), tl.sin(theta))
    qk = tl.sum(qe * ke + qo * ko, axis=1)  # (Q,)
    qe, qo, ke, ko = qe.to(DOT), qo.to(DOT), ke.to(DOT), ko.to(DOT)
    v = tl.load(V_ptr + tp, mask=mask_tp, other=0.0)  # (Q, P)
    cs = tl.cumsum(adt, axis=0)
    cs_end = tl.sum(adt, axis=0)
    ec = tl.exp(cs)
    e = tl.exp(cs_end - cs)
    u = e * w  # (Q,): the weight of step s in the state leaving the chunk
    L = causal_decay(cs, Q) * w[None, :]  # (Q, Q): e^{c_t − c_s} w_s below the diagonal
    dy = tl.load(dOut_ptr + tp, mask=mask_tp, other=0.0).to(tl.float32)
    z = tl.zeros([Q, P], dtype=tl.float32)
    if HAS_Z:
        z = tl.load(Z_ptr + tp, mask=mask_tp, other=0.0).to(tl.float32)
    dqk = tl.sum(dy * z * tl.sigmoid(z) * v.to(tl.float32), axis=1) if HAS_Z else \
        tl.sum(dy * v.to(tl.float32), axis=1)  # (Q,): dy_t·v_t after the gate
    if PART == 0:
        _values_part(dy, z, v, qe, qo, ke, ko, qk, L, w, e, u, ec, cs, cs_end, gamma, D, rows, dqk,
                     S_chunks_ptr, dS_chunks_ptr, s_offs, mask_pj, tp, mask_tp, mask_t,
                     dZ_ptr, dV_ptr, dADT_ptr + row * l + offs_t, dW_ptr + row * l + offs_t,
                     dG_ptr + row * l + offs_t, dD_ptr + chunk, Q, HAS_Z, DOT)
    else:
        if HAS_Z:
            dy = dy * z * tl.sigmoid(z)
        _keys_part(dy, v, qe, qo, ke, ko, L, u, ec, gamma * dqk, theta, S_chunks_ptr,
                   dS_chunks_ptr, s_offs, mask_pj, offs_t, offs_j, l, half, na, row, n, h, chunk,
                   (bi * l * h + hi) * n, (bi * l * h + hi) * na, dk_final_ptr, dQ_ptr, dK_ptr,
                   dth_ptr, dQb_ptr, dKb_ptr, HAS_DK, DOT)


@triton.jit
def _values_part(dy, z, v, qe, qo, ke, ko, qk, L, w, e, u, ec, cs, cs_end, gamma, D, rows, dqk,
                 S_chunks_ptr, dS_chunks_ptr, s_offs, mask_pj, tp, mask_tp, mask_t,
                 dZ_ptr, dV_ptr, dADT_ptr, dW_ptr, dG_ptr, dD_ptr, Q: tl.constexpr,
                 HAS_Z: tl.constexpr, DOT: tl.constexpr):
    """Part 0 of a chunk's backward: dz, dv, and the gradients of the weights and decays."""
    # both states first: Σ dS ∘ S₀ (c_end scales S₀) in float32, then only as matmul operands
    Se = tl.load(S_chunks_ptr + s_offs, mask=mask_pj, other=0.0)
    So = tl.load(S_chunks_ptr + s_offs + 1, mask=mask_pj, other=0.0)
    dSe = tl.load(dS_chunks_ptr + s_offs, mask=mask_pj, other=0.0)
    dSo = tl.load(dS_chunks_ptr + s_offs + 1, mask=mask_pj, other=0.0)
    dc_end = tl.exp(cs_end) * tl.sum(tl.sum(dSe * Se + dSo * So, axis=1), axis=0)
    Se, So, dSe, dSo = Se.to(DOT), So.to(DOT), dSe.to(DOT), dSo.to(DOT)
    s = tl.dot(qe, tl.trans(ke)) + tl.dot(qo, tl.trans(ko))  # (Q, Q)
    ys = (tl.dot(qe, tl.trans(Se)) + tl.dot(qo, tl.trans(So))) * ec[:, None]  # (Q, P)
    if HAS_Z:  # through the gate: y (recomputed) · silu(z)
        y = ys + tl.dot((s * L).to(DOT), v) + (D + gamma * qk)[:, None] * v.to(tl.float32)
        sig = tl.sigmoid(z)
        tl.store(dZ_ptr + tp, dy * y * sig * (1.0 + z * (1.0 - sig)), mask=mask_tp)
        dy = dy * z * sig
    dyd = dy.to(DOT)
    # the in-chunk form: dw_s = Σ_t (q kᵀ ∘ e^{c_t − c_s} ∘ dy vᵀ)_ts, and ∂/∂(c_t − c_s)
    G = s * tl.dot(dyd, tl.trans(v)) * causal_decay(cs, Q)
    dw = tl.sum(G, axis=0)
    Gw = G * w[None, :]
    dc = tl.sum(Gw, axis=1) - tl.sum(Gw, axis=0) + tl.sum(dy * ys, axis=1)
    dv = tl.dot(tl.trans(s * L).to(DOT), dyd) + (D + gamma * qk)[:, None] * dy  # (Q, P)
    # the state leaving the chunk: v_s·(dS k_s) feeds dv, dw and the decays
    kdS = tl.dot(ke, tl.trans(dSe)) + tl.dot(ko, tl.trans(dSo))  # (Q, P)
    dv += u[:, None] * kdS
    tl.store(dV_ptr + tp, dv, mask=mask_tp)
    vdSk = tl.sum(v.to(tl.float32) * kdS, axis=1)  # (Q,)
    dw += e * vdSk
    dc -= u * vdSk
    dc_end += tl.sum(u * vdSk, axis=0)
    dc += tl.where(rows == Q - 1, dc_end, 0.0)  # c_end is c of the chunk's last row
    tl.store(dADT_ptr, tl.cumsum(dc, axis=0, reverse=True), mask=mask_t)
    tl.store(dW_ptr, dw, mask=mask_t)
    tl.store(dG_ptr, dqk * qk, mask=mask_t)
    tl.store(dD_ptr, tl.sum(tl.where(mask_t, dqk, 0.0), axis=0))


@triton.jit
def _keys_part(dy, v, qe, qo, ke, ko, L, u, ec, diag, theta, S_chunks_ptr, dS_chunks_ptr,
               s_offs, mask_pj, offs_t, offs_j, l, half, na, row, n, h, chunk, qh, ah,
               dk_final_ptr, dQ_ptr, dK_ptr, dth_ptr, dQb_ptr, dKb_ptr,
               HAS_DK: tl.constexpr, DOT: tl.constexpr):
    """Part 1 of a chunk's backward: dq, dk (rotated frame), dθ, then R(θ)ᵀ and the bias sums.

    The diagonal uses the unrotated q·k, so it joins after dθ, in the rotated frame
    (R(θ)ᵀ k_rot = k)."""
    dyd = dy.to(DOT)
    dP = (tl.dot(dyd, tl.trans(v)) * L).to(DOT)  # (Q, Q): dy_t·v_s e^{c_t − c_s} w_s
    Se = tl.load(S_chunks_ptr + s_offs, mask=mask_pj, other=0.0).to(DOT)
    So = tl.load(S_chunks_ptr + s_offs + 1, mask=mask_pj, other=0.0).to(DOT)
    dqe = tl.dot(dP, ke) + ec[:, None] * tl.dot(dyd, Se)  # (Q, J)
    dqo = tl.dot(dP, ko) + ec[:, None] * tl.dot(dyd, So)
    dth = dqo * qe.to(tl.float32) - dqe * qo.to(tl.float32)  # (Q, J)
    dqe, dqo = rotate(dqe + diag[:, None] * ke.to(tl.float32),
                      dqo + diag[:, None] * ko.to(tl.float32), tl.cos(theta), -tl.sin(theta))
    _store_pairs(dQ_ptr + qh, h * n, offs_t, offs_j, l, half, dqe, dqo)
    mask_j, keep = offs_j < half, (offs_t < l)[:, None]
    tl.store(dQb_ptr + chunk * n + 2 * offs_j, tl.sum(tl.where(keep, dqe, 0.0), 0), mask=mask_j)
    tl.store(dQb_ptr + chunk * n + 2 * offs_j + 1, tl.sum(tl.where(keep, dqo, 0.0), 0),
             mask=mask_j)
    dSe = tl.load(dS_chunks_ptr + s_offs, mask=mask_pj, other=0.0).to(DOT)
    dSo = tl.load(dS_chunks_ptr + s_offs + 1, mask=mask_pj, other=0.0).to(DOT)
    dP = tl.trans(dP)
    dke = tl.dot(dP, qe) + u[:, None] * tl.dot(v, dSe)
    dko = tl.dot(dP, qo) + u[:, None] * tl.dot(v, dSo)
    if HAS_DK:  # the final k state is the last step's rotated k
        last = (offs_t == l - 1)[:, None]
        dke += tl.where(last, tl.load(dk_final_ptr + row * n + 2 * offs_j, mask=mask_j,
                                      other=0.0)[None, :], 0.0)
        dko += tl.where(last, tl.load(dk_final_ptr + row * n + 2 * offs_j + 1, mask=mask_j,
                                      other=0.0)[None, :], 0.0)
    dth += dko * ke.to(tl.float32) - dke * ko.to(tl.float32)
    tl.store(dth_ptr + ah + offs_t[:, None] * h * na + offs_j[None, :], dth,
             mask=keep & (offs_j[None, :] < na))
    dke, dko = rotate(dke + diag[:, None] * qe.to(tl.float32),
                      dko + diag[:, None] * qo.to(tl.float32), tl.cos(theta), -tl.sin(theta))
    _store_pairs(dK_ptr + qh, h * n, offs_t, offs_j, l, half, dke, dko)
    tl.store(dKb_ptr + chunk * n + 2 * offs_j, tl.sum(tl.where(keep, dke, 0.0), 0), mask=mask_j)
    tl.store(dKb_ptr + chunk * n + 2 * offs_j + 1, tl.sum(tl.where(keep, dko, 0.0), 0),
             mask=mask_j)


def _trapezoid_grads(DT, Trap, dG, dW, dDTa, d_owe):
    """dDT and dTrap from the per-step gradients of γ_t = λ_tΔ_t and w_t = γ_t + (1−λ_{t+1})Δ_{t+1}.

    ``d_owe`` (b, h) is the gradient of the (1 − λ₀)Δ₀ the first step pays for Input_States' last
    input (zeros without them): it plays w_{−1}'s part. Shapes: all (b, h, l) but d_owe.
    """
    lam = torch.sigmoid(Trap.float())
    d_prev = torch.cat([d_owe[..., None], dW[..., :-1]], dim=-1)  # ∂/∂((1 − λ_t)Δ_t)
    d_gamma = dG + dW  # γ_t enters w_t and the diagonal
    dDT = d_gamma * lam + d_prev * (1 - lam) + dDTa
    d_lam = (d_gamma - d_prev) * DT.float()
    return dDT, d_lam * lam * (1 - lam)


def _angle_grads(Angles, DT, dth, d_final):
    """θ_t = θ_in + Σ_{s≤t} Δ_s π tanh(a_s): ∂θ flows back as a reverse cumsum over l.

    Shapes: Angles, dth (b, l, h, na); DT (b, h, l); d_final (b, h, na) or None →
    (dAngles (b, l, h, na), the angles' part of dDT (b, h, l), d θ_in (b, h, na)).
    """
    dcum = dth.flip(1).cumsum(1).flip(1)  # (b, l, h, na): Σ_{u≥t} dθ_u
    if d_final is not None:
        dcum = dcum + d_final.float()[:, None]
    tanh_a = torch.tanh(Angles.float())
    dAng = dcum * DT.float().transpose(1, 2)[..., None] * torch.pi * (1 - tanh_a**2)
    dDT = (dcum * torch.pi * tanh_a).sum(-1).transpose(1, 2)  # (b, h, l)
    return dAng, dDT, dcum[:, 0]


def launch_backward(x, d_out, finals, S_chunks, theta_chunks, chunk_size):
    """Run both backward kernels; returns a dict of gradients by argument name (and "states")."""
    V = x["V"]
    b, l, h, p = V.shape
    g, n, na = x["Q"].shape[2], x["Q"].shape[3], x["Angles"].shape[3]
    J, P, Qc = blocks(n, p, chunk_size)
    c = triton.cdiv(l, Qc)
    dev, f32 = V.device, torch.float32
    new = lambda *s: torch.empty(*s, device=dev, dtype=f32)
    cont = lambda t: None if t is None else t.float().contiguous()
    d_out = (d_out if d_out is not None else torch.zeros_like(V)).contiguous()
    dSf, dkf = cont(finals["ssm"]), cont(finals["k"])
    dot = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}.get(V.dtype, tl.float32)
    warps = 4 if P * J <= 2048 else 8
    # 1. the reverse scan of the state's gradient
    dS_chunks, dS0 = new(b, h, c, p, n), new(b, h, p, n)
    _bwd_state_kernel[(h, b)](
        x["Q"], x["Q_bias"], x["Angles"], x["ADT"], x["DT"], x["Trap"], x["Z"], d_out,
        theta_chunks, dSf, dS_chunks, dS0,
        l, h, g, p, n, na, c,
        Q=Qc, J=J, P=P, HAS_Z=x["Z"] is not None, HAS_DS=dSf is not None, DOT=dot,
        num_warps=warps,
    )
    # 2. every chunk at once
    dQh, dKh, dV, dZ = new(b, l, h, n), new(b, l, h, n), new(b, l, h, p), new(b, l, h, p)
    dADT, dW, dG = new(b, h, l), new(b, h, l), new(b, h, l)
    dth, dQb, dKb, dD = new(b, l, h, na), new(b, h, c, n), new(b, h, c, n), new(b, h, c)
    for part in (0, 1):  # the same recomputation, two halves of the gradients
        _bwd_chunk_kernel[(c, h, b)](
            x["Q"], x["K"], V, x["ADT"], x["DT"], x["Trap"], x["Q_bias"], x["K_bias"],
            x["Angles"], x["D"], x["Z"], d_out, dkf, S_chunks, theta_chunks, dS_chunks,
            dQh, dKh, dV, dZ, dADT, dW, dG, dth, dQb, dKb, dD,
            l, h, g, p, n, na, c,
            Q=Qc, J=J, P=P, HAS_D=x["D"] is not None, HAS_Z=x["Z"] is not None,
            HAS_DK=dkf is not None, DOT=dot, PART=part, num_warps=warps,
        )
    # 3. what couples steps: the angles' reverse cumsum, the trapezoid's two-step weights
    dAng, dDTa, dth0 = _angle_grads(x["Angles"], x["DT"], dth, finals["angle"])
    states = x["states"]
    d_owe = torch.zeros(b, h, device=dev, dtype=f32)
    if states is not None:  # H₀ = S_in + (1 − λ₀)Δ₀ v_in k_inᵀ
        lam0 = torch.sigmoid(x["Trap"][..., 0].float())
        owe = ((1 - lam0) * x["DT"][..., 0].float())[..., None]  # (b, h, 1)
        d_owe = torch.einsum("bhpn,bhp,bhn->bh", dS0, states[3], states[2])
        d_states = (dth0, dS0, owe * torch.einsum("bhpn,bhp->bhn", dS0, states[3]),
                    owe * torch.einsum("bhpn,bhn->bhp", dS0, states[2]))
    dDT, dTrap = _trapezoid_grads(x["DT"], x["Trap"], dG, dW, dDTa, d_owe)
    if finals["v"] is not None:  # the final v state is V[:, -1]
        dV[:, -1] += finals["v"].float()
    as_ = lambda t, like: None if like is None else t.to(like.dtype)
    return {
        "Q": as_(dQh.unflatten(2, (g, h // g)).sum(3), x["Q"]),
        "K": as_(dKh.unflatten(2, (g, h // g)).sum(3), x["K"]),
        "V": as_(dV, V), "ADT": as_(dADT, x["ADT"]), "DT": as_(dDT, x["DT"]),
        "Trap": as_(dTrap, x["Trap"]), "Q_bias": as_(dQb.sum((0, 2)), x["Q_bias"]),
        "K_bias": as_(dKb.sum((0, 2)), x["K_bias"]), "Angles": as_(dAng, x["Angles"]),
        "D": as_(dD.sum((0, 2)), x["D"]), "Z": as_(dZ, x["Z"]),
        "states": None if states is None else d_states,
    }
