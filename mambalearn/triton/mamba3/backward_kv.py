"""Backward, part 1 of 2: the gradients of the keys, the values and the per-step weights.

A program per (head block, chunk, batch) walks the heads of its block (they share one Q/K head,
GQA) and sums their dK; each head's chunk is recomputed from the inputs (q, k turned by the local
angles, ``common``). With M_ts = e^{c_t − c_s} (s < t), u_s = e^{c_end − c_s} w_s and D_c the
gradient of the state leaving the chunk in its frame (``state_passing``):

    dk_s = w_s Σ_{t>s} (dy_t·v_s) M_ts q_t + u_s D_cᵀ v_s         then R(φ_s)ᵀ, + γ_s (dy_s·v_s) k̃ → q̃
    dv_s = w_s Σ_{t>s} (q_t·k_s) M_ts dy_t + u_s D_c k_s + (D + γ_s q_s·k_s) dy_s
    dw_s = Σ_t E_ts + e^{c_end − c_s} v_s·(D_c k_s),     E_ts = (q_t·k_s) M_ts (dy_t·v_s)
    dγ_s = (q_s·k_s)(dy_s·v_s),   dD = Σ_s dy_s·v_s,   dθ_s += (dk_s × k_s) per pair
    dc_t = Σ_s w_s E_ts − Σ_t' w_t E_t't − u_t v_t·(D_c k_t)  (+ at the chunk's end: Σ u v·(D k)
           + a_c ⟨D_c, H^L_c⟩)

dc is the gradient of c_t = Σ_{s≤t} ADT_s at each step; ``backward_q`` adds the outputs' part and
turns it into dADT (a reverse cumsum inside the chunk). The diagonal term γ q̃·k̃ does not depend
on θ, so it joins dk after the cross product, in the unrotated frame.
"""

import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.triton.mamba3.common import (
    SIZES,
    causal_decay,
    chunk_scalars,
    cos_sin,
    load_turned,
    local_angles,
    pair_cross,
    turn,
)


@triton.jit(do_not_specialize=SIZES)
def _bwd_kv_kernel(
    Q_ptr, K_ptr, V_ptr, ADT_ptr, DT_ptr, Trap_ptr, Qb_ptr, Kb_ptr, Ang_ptr, D_ptr,
    dY_ptr,  # (b, l, h, p): the gradient of y (after the gate's backward)
    Dst_ptr,  # (b, h, c, p, n): D_c, the gradient of the state leaving each chunk, its frame
    HD_ptr,  # (b, h, c): ⟨D_c, H^L_c⟩
    dK_ptr,  # out (b, l, h / HPP, n) float32: dK summed over each head block
    dKb_ptr,  # out (b, c, h, n) float32: per-chunk sums of dK per head (dK_bias)
    dV_ptr,  # out (b, l, h, p)
    dW_ptr, dG_ptr, dC_ptr,  # out (b, h, l) float32: dw, dγ, this part of dc
    dth_ptr,  # out (b, l, h, na) float32: the keys' part of dθ
    dD_ptr,  # out (b, h, c) float32: per-chunk dD
    l, h, g, p, n, na, n_chunks,
    Q: tl.constexpr, N: tl.constexpr, P: tl.constexpr,  # tiles: chunk, state columns, channels
    HPP: tl.constexpr,  # heads per program
    HAS_D: tl.constexpr, DOT: tl.constexpr,
):
    hb, ci = tl.program_id(0), tl.program_id(1)
    bi = tl.program_id(2).to(tl.int64)
    offs_t = ci * Q + tl.arange(0, Q)
    offs_n, offs_p, offs_j = tl.arange(0, N), tl.arange(0, P), tl.arange(0, N // 2)
    mask_t = offs_t < l
    mask_tp = mask_t[:, None] & (offs_p[None, :] < p)
    mask_tn = mask_t[:, None] & (offs_n[None, :] < n)
    mask_pn = (offs_p[:, None] < p) & (offs_n[None, :] < n)
    qk_ptr = (bi * l * g + (hb * HPP) // (h // g)) * n  # the block's Q/K head (GQA)
    last = tl.minimum(ci * Q + Q, l) - 1  # c_end is c at the chunk's last step
    acc = tl.zeros([Q, N], dtype=tl.float32)  # Σ over the block's heads of dK
    for i in range(HPP):
        hi = hb * HPP + i
        row = bi * h + hi
        chunk = row * n_chunks + ci
        tp = (bi * l * h + hi) * p + offs_t[:, None] * h * p + offs_p[None, :]  # (Q, P)
        # 1. recompute the chunk: scalars, decays, local angles, q and k
        dt, adt, lam, gamma, w = chunk_scalars(DT_ptr + row * l, ADT_ptr + row * l,
                                               Trap_ptr + row * l, offs_t, l)
        cs = tl.cumsum(adt, axis=0)
        e = tl.exp(tl.sum(adt, axis=0) - cs)  # (Q,): e^{c_end − c_s}
        u = e * w
        phi, _ = local_angles(Ang_ptr + (bi * l * h + hi) * na, h * na, offs_t, offs_j, l, na,
                              dt)
        cos, sin = cos_sin(phi)
        q = load_turned(Q_ptr + qk_ptr, Qb_ptr + hi * n, g * n, offs_t, offs_n, l, n, cos, sin,
                        Q, N)
        k = load_turned(K_ptr + qk_ptr, Kb_ptr + hi * n, g * n, offs_t, offs_n, l, n, cos, sin,
                        Q, N)
        qk = tl.sum(q * k, axis=1)  # (Q,)
        v = tl.load(V_ptr + tp, mask=mask_tp, other=0.0)
        dy = tl.load(dY_ptr + tp, mask=mask_tp, other=0.0)
        dqk = tl.sum(dy.to(tl.float32) * v.to(tl.float32), axis=1)  # (Q,): dy_s·v_s
        Dc = tl.load(Dst_ptr + chunk * p * n + offs_p[:, None] * n + offs_n[None, :],
                     mask=mask_pn, other=0.0).to(DOT)  # (P, N)
        Mt = tl.trans(causal_decay(cs, Q))  # (Q, Q): rows s, columns t > s
        v, dy = v.to(DOT), dy.to(DOT)

        # 2. keys: dk = w ∘ ((dy vᵀ ∘ M)ᵀ q) + u ∘ (v D_c); dθ; then the diagonal, turned back
        dPt = tl.dot(v, tl.trans(dy)) * Mt  # (Q, Q): (v_s·dy_t) M_ts
        dk = tl.dot(dPt.to(DOT), q.to(DOT)) * w[:, None] + u[:, None] * tl.dot(v, Dc)  # (Q, N)
        tl.store(dth_ptr + (bi * l * h + hi) * na + offs_t[:, None] * h * na + offs_j[None, :],
                 pair_cross(dk, k, Q, N), mask=mask_t[:, None] & (offs_j[None, :] < na))
        dk = turn(dk + (gamma * dqk)[:, None] * q, cos, -sin, Q, N)  # R(φ)ᵀ: the frame of K
        acc += dk
        tl.store(dKb_ptr + ((bi * n_chunks + ci) * h + hi) * n + offs_n,
                 tl.sum(tl.where(mask_tn, dk, 0.0), axis=0), mask=offs_n < n)

        # 3. values and weights
        st = tl.dot(k.to(DOT), tl.trans(q.to(DOT)))  # (Q, Q): k_s·q_t
        E = st * dPt  # (Q, Q): E_ts stored at [s, t]
        dw = tl.sum(E, axis=1)  # (Q,)
        Ew = E * w[:, None]
        dc = tl.sum(Ew, axis=0) - tl.sum(Ew, axis=1)  # c_t enters as t (+) and as s (−)
        kD = tl.dot(k.to(DOT), tl.trans(Dc))  # (Q, P): D_c k_s
        D = 0.0
        if HAS_D:
            D = tl.load(D_ptr + hi).to(tl.float32)
        dv = tl.dot((st * Mt).to(DOT), dy) * w[:, None] + u[:, None] * kD \
            + (D + gamma * qk)[:, None] * dy.to(tl.float32)  # (Q, P)
        tl.store(dV_ptr + tp, dv.to(dV_ptr.dtype.element_ty), mask=mask_tp)
        vDk = tl.sum(v.to(tl.float32) * kD, axis=1)  # (Q,): v_s·(D_c k_s)
        dw += e * vDk
        dc -= u * vDk
        dc_end = tl.sum(u * vDk, axis=0) + tl.exp(tl.sum(adt, axis=0)) * tl.load(HD_ptr + chunk)
        dc += tl.where(offs_t == last, dc_end, 0.0)
        tl.store(dW_ptr + row * l + offs_t, dw, mask=mask_t)
        tl.store(dG_ptr + row * l + offs_t, qk * dqk, mask=mask_t)
        tl.store(dC_ptr + row * l + offs_t, dc, mask=mask_t)
        tl.store(dD_ptr + chunk, tl.sum(tl.where(mask_t, dqk, 0.0), axis=0))
    part = (bi * l * (h // HPP) + hb) * n  # element (bi, 0, hb, 0) of dK
    tl.store(dK_ptr + part + offs_t[:, None] * (h // HPP) * n + offs_n[None, :], acc, mask=mask_tn)
