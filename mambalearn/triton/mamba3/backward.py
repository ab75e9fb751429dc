"""The Mamba-3 SISO backward: one program per (head, batch) walks its chunks in reverse.

Each chunk restarts from the pre-state S₀ and angles θ₀ the forward saved for it and recomputes
q, k (rotated), the decays and the weights on chip (chapter 07's recomputation). With
dS the gradient of the state *leaving* the chunk (from the later chunks, or the final state's),
P = q kᵀ ∘ L ∘ w the in-chunk matrix and u_s = e^{c_end − c_s} w_s:

    dq  = (dy vᵀ ∘ L ∘ w) k + e^{c} dy S₀ + γ (dy·v) k           (rotated frame, then R(θ)ᵀ)
    dk  = (dy vᵀ ∘ L ∘ w)ᵀ q + u (v dS)                          (+ the final k state's gradient)
    dv  = Pᵀ dy + u (k dSᵀ) + (D + γ q·k) dy
    dw_s = Σ_t (q kᵀ ∘ L ∘ dy vᵀ)_ts + e^{c_end − c_s} v_s·(dS k_s)
    dc  → dADT (a reverse cumsum inside the chunk),  dθ → dAngles, dΔ (a reverse cumsum over l)
    dS ← e^{c_end} dS + (e^{c} dy)ᵀ q                              (the state entering the chunk)

The per-step scalars' gradients (dγ, dw, the angle part of dΔ) are written per step; the cheap
(b, h, l) arithmetic that turns them into dDT and dTrap (w_s mixes steps s and s + 1) runs in
PyTorch in :func:`launch_backward`.
"""

import torch
import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.triton.mamba3.common import (
    PI,
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
def _mamba3_bwd_kernel(
    Q_ptr, K_ptr, V_ptr, ADT_ptr, DT_ptr, Trap_ptr, Qb_ptr, Kb_ptr, Ang_ptr, D_ptr, Z_ptr,
    dOut_ptr, dS_final_ptr, dth_final_ptr, dk_final_ptr,  # gradients arriving from outside
    S_chunks_ptr, theta_chunks_ptr,  # saved by the forward: (b, h, c, p, n), (b, h, c, na)
    dQ_ptr, dK_ptr, dV_ptr, dZ_ptr,  # (b, l, h, n) per head ×2, (b, l, h, p) ×2
    dADT_ptr, dW_ptr, dG_ptr, dDTa_ptr, dAng_ptr,  # (b, h, l) ×4, (b, l, h, na)
    dQb_ptr, dKb_ptr, dD_ptr, dS0_ptr, dth0_ptr,  # (b, h, n) ×2, (b, h), (b, h, p, n), (b, h, na)
    l, h, g, p, n, na, n_chunks,
    Q: tl.constexpr, J: tl.constexpr, P: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_DS: tl.constexpr, HAS_DTH: tl.constexpr, HAS_DK: tl.constexpr,
    DOT: tl.constexpr,
):
    hi = tl.program_id(0)
    bi = tl.program_id(1).to(tl.int64)
    gi = hi // (h // g)
    half = n // 2
    offs_j, offs_p = tl.arange(0, J), tl.arange(0, P)
    mask_j, mask_p = offs_j < half, offs_p < p
    mask_pj = mask_p[:, None] & mask_j[None, :]
    row = bi * h + hi
    qk_ptr = (bi * l * g + gi) * n
    v_ptr = (bi * l * h + hi) * p
    qh_ptr = (bi * l * h + hi) * n  # element (bi, 0, hi, 0) of the per-head dQ, dK
    ang_ptr = Ang_ptr + (bi * l * h + hi) * na
    dt_ptr, adt_ptr, trap_ptr = DT_ptr + row * l, ADT_ptr + row * l, Trap_ptr + row * l
    s_offs = offs_p[:, None] * n + 2 * offs_j[None, :]
    D = 0.0
    if HAS_D:
        D = tl.load(D_ptr + hi).to(tl.float32)
    rows = tl.arange(0, Q)

    # gradients of what leaves the last chunk: the final states
    dSe = tl.zeros([P, J], dtype=tl.float32)
    dSo = tl.zeros([P, J], dtype=tl.float32)
    if HAS_DS:
        dSe = tl.load(dS_final_ptr + row * p * n + s_offs, mask=mask_pj, other=0.0)
        dSo = tl.load(dS_final_ptr + row * p * n + s_offs + 1, mask=mask_pj, other=0.0)
    dth_carry = tl.zeros([J], dtype=tl.float32)
    if HAS_DTH:
        dth_carry = tl.load(dth_final_ptr + row * na + offs_j, mask=offs_j < na, other=0.0)
    dkf_e = tl.zeros([J], dtype=tl.float32)
    dkf_o = tl.zeros([J], dtype=tl.float32)
    if HAS_DK:
        dkf_e = tl.load(dk_final_ptr + row * n + 2 * offs_j, mask=mask_j, other=0.0)
        dkf_o = tl.load(dk_final_ptr + row * n + 2 * offs_j + 1, mask=mask_j, other=0.0)
    dQb_e = tl.zeros([J], dtype=tl.float32)
    dQb_o = tl.zeros([J], dtype=tl.float32)
    dKb_e = tl.zeros([J], dtype=tl.float32)
    dKb_o = tl.zeros([J], dtype=tl.float32)
    dD = 0.0

    ci = n_chunks - 1
    while ci >= 0:
        offs_t = ci * Q + rows
        mask_t = offs_t < l
        mask_tp = mask_t[:, None] & mask_p[None, :]
        tp_offs = offs_t[:, None] * h * p + offs_p[None, :]  # (Q, P) in V, Z, Out, dV
        # 1. recompute the chunk exactly as the forward did
        dt, adt, lam, gamma, w = chunk_scalars(dt_ptr, adt_ptr, trap_ptr, offs_t, l)
        theta0 = tl.load(theta_chunks_ptr + (row * n_chunks + ci) * na + offs_j,
                         mask=offs_j < na, other=0.0)
        theta, tanh_a, turn = chunk_angles(ang_ptr, h * na, offs_t, offs_j, l, na, dt, theta0)
        cos, sin = tl.cos(theta), tl.sin(theta)
        qe0, qo0 = load_pairs(Q_ptr + qk_ptr, Qb_ptr + hi * n, g * n, offs_t, offs_j, l, half)
        ke0, ko0 = load_pairs(K_ptr + qk_ptr, Kb_ptr + hi * n, g * n, offs_t, offs_j, l, half)
        qk = tl.sum(qe0 * ke0 + qo0 * ko0, axis=1)  # (Q,): q·k is the same rotated or not
        qe, qo = rotate(qe0, qo0, cos, sin)
        ke, ko = rotate(ke0, ko0, cos, sin)
        v = tl.load(V_ptr + v_ptr + tp_offs, mask=mask_tp, other=0.0).to(tl.float32)
        cs = tl.cumsum(adt, axis=0)
        cs_end = tl.sum(adt, axis=0)
        ec = tl.exp(cs)
        base = (row * n_chunks + ci) * p * n
        Se = tl.load(S_chunks_ptr + base + s_offs, mask=mask_pj, other=0.0)
        So = tl.load(S_chunks_ptr + base + s_offs + 1, mask=mask_pj, other=0.0)
        ys = tl.dot(qe.to(DOT), tl.trans(Se).to(DOT)) + tl.dot(qo.to(DOT), tl.trans(So).to(DOT))
        ys = ys * ec[:, None]  # (Q, P): what the entering state contributes to y
        s = tl.dot(qe.to(DOT), tl.trans(ke).to(DOT)) + tl.dot(qo.to(DOT), tl.trans(ko).to(DOT))
        L = causal_decay(cs, Q)  # (Q, Q)
        Pm = s * L * w[None, :]  # the in-chunk matrix of y = Pm v + …

        # 2. through the gate: y (recomputed) · silu(z)
        dy = tl.load(dOut_ptr + v_ptr + tp_offs, mask=mask_tp, other=0.0).to(tl.float32)
        if HAS_Z:
            y = ys + tl.dot(Pm.to(DOT), v.to(DOT)) + (D + gamma * qk)[:, None] * v
            z = tl.load(Z_ptr + v_ptr + tp_offs, mask=mask_tp, other=0.0).to(tl.float32)
            sig = tl.sigmoid(z)
            tl.store(dZ_ptr + v_ptr + tp_offs, dy * y * sig * (1.0 + z * (1.0 - sig)),
                     mask=mask_tp)
            dy = dy * z * sig

        # 3. the in-chunk quadratic form
        dyv = tl.dot(dy.to(DOT), tl.trans(v).to(DOT))  # (Q, Q): dy_t·v_s
        dP = dyv * L * w[None, :]
        dqe = tl.dot(dP.to(DOT), ke.to(DOT))  # (Q, J)
        dqo = tl.dot(dP.to(DOT), ko.to(DOT))
        dke = tl.dot(tl.trans(dP).to(DOT), qe.to(DOT))
        dko = tl.dot(tl.trans(dP).to(DOT), qo.to(DOT))
        dv = tl.dot(tl.trans(Pm).to(DOT), dy.to(DOT))  # (Q, P)
        G = s * L * dyv  # (Q, Q): ∂loss/∂w_s summed over t, before w
        dw = tl.sum(G, axis=0)
        Gw = G * w[None, :]  # ∂loss/∂(c_t − c_s)
        dc = tl.sum(Gw, axis=1) - tl.sum(Gw, axis=0)
        # 4. the entering state, read out by q
        dqe += ec[:, None] * tl.dot(dy.to(DOT), Se.to(DOT))
        dqo += ec[:, None] * tl.dot(dy.to(DOT), So.to(DOT))
        dc += tl.sum(dy * ys, axis=1)
        # 5. the diagonal γ_t q_t·k_t and the skip D
        dqk = tl.sum(dy * v, axis=1)  # (Q,): dy_t·v_t
        dD += tl.sum(dqk, axis=0)
        dgamma = dqk * qk
        dv += (D + gamma * qk)[:, None] * dy
        # 6. the state leaving the chunk
        e = tl.exp(cs_end - cs)
        u = e * w
        kdS = tl.dot(ke.to(DOT), tl.trans(dSe).to(DOT)) + tl.dot(ko.to(DOT), tl.trans(dSo).to(DOT))
        dv += u[:, None] * kdS  # (Q, P)
        dke += u[:, None] * tl.dot(v.to(DOT), dSe.to(DOT))
        dko += u[:, None] * tl.dot(v.to(DOT), dSo.to(DOT))
        vdSk = tl.sum(v * kdS, axis=1)  # (Q,): v_s·(dS k_s)
        dw += e * vdSk
        dc -= u * vdSk
        dc_end = tl.sum(u * vdSk, axis=0) + tl.exp(cs_end) * tl.sum(tl.sum(dSe * Se + dSo * So,
                                                                            axis=1), axis=0)
        dc += tl.where(rows == Q - 1, dc_end, 0.0)  # c_end is c of the chunk's last row
        tl.store(dADT_ptr + row * l + offs_t, tl.cumsum(dc, axis=0, reverse=True), mask=mask_t)
        # the final k state is the last step's rotated k
        last = (offs_t == l - 1)[:, None]
        dke += tl.where(last, dkf_e[None, :], 0.0)
        dko += tl.where(last, dkf_o[None, :], 0.0)

        # 7. back through the rotations: dθ, then the unrotated (biased) q, k
        dth = (dqo * qe - dqe * qo) + (dko * ke - dke * ko)  # (Q, J)
        dth = tl.where(mask_t[:, None] & (offs_j[None, :] < na), dth, 0.0)
        dqe, dqo = rotate(dqe, dqo, cos, -sin)  # R(θ)ᵀ = R(−θ)
        dke, dko = rotate(dke, dko, cos, -sin)
        diag = (gamma * dqk)[:, None]
        dqe += diag * ke0
        dqo += diag * ko0
        dke += diag * qe0
        dko += diag * qo0
        _store_pairs(dQ_ptr + qh_ptr, h * n, offs_t, offs_j, l, half, dqe, dqo)
        _store_pairs(dK_ptr + qh_ptr, h * n, offs_t, offs_j, l, half, dke, dko)
        dQb_e += tl.sum(tl.where(mask_t[:, None], dqe, 0.0), axis=0)
        dQb_o += tl.sum(tl.where(mask_t[:, None], dqo, 0.0), axis=0)
        dKb_e += tl.sum(tl.where(mask_t[:, None], dke, 0.0), axis=0)
        dKb_o += tl.sum(tl.where(mask_t[:, None], dko, 0.0), axis=0)
        # 8. the angles: θ_t = θ₀ + Σ_{s≤t} Δ_s π tanh(a_s), so ∂θ flows back as a reverse cumsum
        dcum = tl.cumsum(dth, axis=0, reverse=True) + dth_carry[None, :]
        dth_carry += tl.sum(dth, axis=0)
        mask_ta = mask_t[:, None] & (offs_j[None, :] < na)
        tl.store(dAng_ptr + (bi * l * h + hi) * na + offs_t[:, None] * h * na + offs_j[None, :],
                 dcum * dt[:, None] * PI * (1.0 - tanh_a * tanh_a), mask=mask_ta)
        tl.store(dDTa_ptr + row * l + offs_t, tl.sum(dcum * PI * tanh_a, axis=1), mask=mask_t)
        tl.store(dW_ptr + row * l + offs_t, dw, mask=mask_t)
        tl.store(dG_ptr + row * l + offs_t, dgamma, mask=mask_t)
        tl.store(dV_ptr + v_ptr + tp_offs, dv, mask=mask_tp)
        # 9. the gradient of the state entering this chunk = leaving the previous one
        dye = dy * ec[:, None]
        dSe = dSe * tl.exp(cs_end) + tl.dot(tl.trans(dye).to(DOT), qe.to(DOT))
        dSo = dSo * tl.exp(cs_end) + tl.dot(tl.trans(dye).to(DOT), qo.to(DOT))
        ci -= 1

    tl.store(dS0_ptr + row * p * n + s_offs, dSe, mask=mask_pj)
    tl.store(dS0_ptr + row * p * n + s_offs + 1, dSo, mask=mask_pj)
    tl.store(dth0_ptr + row * na + offs_j, dth_carry, mask=offs_j < na)
    tl.store(dQb_ptr + row * n + 2 * offs_j, dQb_e, mask=mask_j)
    tl.store(dQb_ptr + row * n + 2 * offs_j + 1, dQb_o, mask=mask_j)
    tl.store(dKb_ptr + row * n + 2 * offs_j, dKb_e, mask=mask_j)
    tl.store(dKb_ptr + row * n + 2 * offs_j + 1, dKb_o, mask=mask_j)
    tl.store(dD_ptr + row, dD)


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


def launch_backward(x, d_out, finals, S_chunks, theta_chunks, chunk_size):
    """Run the backward kernel; returns a dict of gradients by argument name (and "states")."""
    V = x["V"]
    b, l, h, p = V.shape
    g, n, na = x["Q"].shape[2], x["Q"].shape[3], x["Angles"].shape[3]
    J, P, Qc = blocks(n, p, chunk_size)
    c = triton.cdiv(l, Qc)
    dev, f32 = V.device, torch.float32
    new = lambda *s: torch.empty(*s, device=dev, dtype=f32)
    dQh, dKh, dV, dZ = new(b, l, h, n), new(b, l, h, n), new(b, l, h, p), new(b, l, h, p)
    dADT, dW, dG, dDTa = (new(b, h, l) for _ in range(4))
    dAng, dQb, dKb, dD = new(b, l, h, na), new(b, h, n), new(b, h, n), new(b, h)
    dS0, dth0 = new(b, h, p, n), new(b, h, na)
    cont = lambda t: None if t is None else t.float().contiguous()
    d_out = d_out if d_out is not None else torch.zeros_like(V)
    dSf, dthf, dkf = cont(finals["ssm"]), cont(finals["angle"]), cont(finals["k"])
    dot = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}.get(V.dtype, tl.float32)
    _mamba3_bwd_kernel[(h, b)](
        x["Q"], x["K"], V, x["ADT"], x["DT"], x["Trap"], x["Q_bias"], x["K_bias"], x["Angles"],
        x["D"], x["Z"], d_out.contiguous(), dSf, dthf, dkf, S_chunks, theta_chunks,
        dQh, dKh, dV, dZ, dADT, dW, dG, dDTa, dAng, dQb, dKb, dD, dS0, dth0,
        l, h, g, p, n, na, c,
        Q=Qc, J=J, P=P, HAS_D=x["D"] is not None, HAS_Z=x["Z"] is not None,
        HAS_DS=dSf is not None, HAS_DTH=dthf is not None, HAS_DK=dkf is not None,
        DOT=dot, num_warps=4 if P * J <= 2048 else 8,
    )
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
        "Trap": as_(dTrap, x["Trap"]), "Q_bias": as_(dQb.sum(0), x["Q_bias"]),
        "K_bias": as_(dKb.sum(0), x["K_bias"]), "Angles": as_(dAng, x["Angles"]),
        "D": as_(dD.sum(0), x["D"]), "Z": as_(dZ, x["Z"]),
        "states": None if states is None else d_states,
    }

