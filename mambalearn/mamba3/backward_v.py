"""Backward: the gradients of the values and of the per-step weights, a program per chunk.

Each (head, chunk, batch) recomputes its chunk from the inputs (q, k turned by the local angles,
``common``). With M_ts = e^{c_t − c_s} (s < t), u_s = e^{c_end − c_s} w_s and D_c the gradient of
the state leaving the chunk in its frame (``state_passing``):

    dv_s = w_s Σ_{t>s} (q_t·k_s) M_ts dy_t + u_s D_c k_s + (D + γ_s q_s·k_s) dy_s
    dw_s = Σ_t E_ts + e^{c_end − c_s} v_s·(D_c k_s),     E_ts = (q_t·k_s) M_ts (dy_t·v_s)
    dγ_s = (q_s·k_s)(dy_s·v_s),    dD = Σ_s dy_s·v_s
    dc_t = Σ_s w_s E_ts − Σ_t' w_t E_t't − u_t v_t·(D_c k_t)
           (+ at the chunk's last step: Σ_s u_s v_s·(D_c k_s) + a_c ⟨D_c, H^L_c⟩)

dc is the gradient of c_t = Σ_{s≤t} ADT_s; ``backward_qk`` adds the outputs' part of it, and the
steps kernel (``backward``) turns the sum into dADT. The (Q, Q) tiles are kept as [s, t].
"""

import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.mamba3.common import (
    SIZES,
    causal_decay,
    exp2,
    load_angles,
    load_qk,
    load_steps,
)


@triton.jit
def _column_block(C_ptr, B_ptr, Cb_ptr, Bb_ptr, phi_ptr, Dst_ptr, qk, st, kD, nb, offs_t, offs_p,
                  loc_t, l_left, l, g: tl.constexpr, p: tl.constexpr, n: tl.constexpr,
                  na: tl.constexpr, Q: tl.constexpr, BN: tl.constexpr, DOT: tl.constexpr):
    """Column block ``nb``: q, k turned by the local angles; q·k, k qᵀ and k D_cᵀ added."""
    offs_n = nb * BN + tl.arange(0, BN)
    cos, sin = load_angles(phi_ptr, offs_t, nb, l, na, Q, BN)
    q, k = load_qk(C_ptr, B_ptr, Cb_ptr, Bb_ptr, g * n, loc_t, offs_n, l_left, n, cos, sin, Q,
                   BN)  # (Q, BN) each
    qk += tl.sum(q * k, axis=1)
    k = k.to(DOT)
    Dc = tl.load(Dst_ptr + offs_p[:, None] * n + offs_n[None, :],
                 mask=(offs_p[:, None] < p) & (offs_n[None, :] < n), other=0.0)  # (P, BN)
    st = tl.dot(k, tl.trans(q.to(DOT)), acc=st)  # (Q, Q): k_s·q_t
    kD = tl.dot(k, tl.trans(Dc.to(DOT)), acc=kD)  # (Q, P): D_c k_s
    return qk, st, kD


@triton.jit(do_not_specialize=SIZES)
def bwd_v_kernel(
    C_ptr, B_ptr, X_ptr, Cb_ptr, Bb_ptr, D_ptr,
    c2_ptr, W_ptr, G_ptr, Phi_ptr,  # per step (``chunk_state``): c log₂e, w, γ, and φ
    dY_ptr,  # (b, l, h, p): the gradient of y (after the gate's backward)
    Dst_ptr,  # (b, h, c, p, n): D_c, the gradient of the state leaving each chunk, its frame
    HD_ptr,  # (b, h, c, tiles): ⟨D_c, H^L_c⟩ in parts (``state_passing``)
    dX_ptr,  # out (b, l, h, p)
    dW_ptr, dG_ptr, dc_ptr,  # out (b, h, l) float32: dw, dγ, this part of dc
    dD_ptr,  # out (b, h, c) float32: per-chunk dD
    l, n_chunks,  # the run-time sizes; then the model's, compiled in
    h: tl.constexpr, g: tl.constexpr, p: tl.constexpr, n: tl.constexpr, na: tl.constexpr,
    Q: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr,  # chunk; column block, blocks
    P: tl.constexpr,  # channels (≥ p)
    TILES: tl.constexpr,  # the parts of HD
    HAS_D: tl.constexpr, DOT: tl.constexpr,
    UNROLL: tl.constexpr = True,  # the column blocks unrolled, or a loop
):
    # (head, chunk) on grid axis 0, head fastest (axis 1 stops at 65 535 chunks)
    pid_h, pid_c = tl.program_id(0) % h, tl.program_id(0) // h
    pid_b = tl.program_id(1).to(tl.int64)
    row = pid_b * h + pid_h
    chunk = row * n_chunks + pid_c
    offs_t, offs_p = pid_c * Q + tl.arange(0, Q), tl.arange(0, P)
    loc_t, l_left = tl.arange(0, Q), l - pid_c * Q  # steps from the chunk's first; steps left in l
    mask_t = offs_t < l
    mask_tp = mask_t[:, None] & (offs_p[None, :] < p)
    # 64-bit bases at the chunk's first step, 32-bit offsets inside it: past 2³¹ elements
    bt = pid_b * l + pid_c * Q  # the chunk's first (batch, step) row
    tp0 = (bt * h + pid_h) * p  # element (pid_b, pid_c·Q, pid_h, 0) of X, dY, dX
    tp = loc_t[:, None] * h * p + offs_p[None, :]  # (Q, P) offsets from there
    bc_off = (bt * g + pid_h // (h // g)) * n  # (pid_b, pid_c·Q, gi, 0) of C and B (GQA)
    Dst_ptr += chunk * p * n
    last = tl.minimum(pid_c * Q + Q, l) - 1  # c_end is c at the chunk's last step

    # 1. per column block: q, k turned by the local angles; q·k, k qᵀ and k D_cᵀ summed
    c2, w, gamma = load_steps(c2_ptr + row * l, W_ptr + row * l, G_ptr + row * l, offs_t, l)
    c2_end = tl.load(c2_ptr + row * l + last)
    e = exp2(c2_end - c2)  # (Q,): e^{c_end − c_s}
    u = e * w
    qk = tl.zeros([Q], dtype=tl.float32)
    st = tl.zeros([Q, Q], dtype=tl.float32)
    kD = tl.zeros([Q, P], dtype=tl.float32)
    if UNROLL:  # the blocks unrolled (the compiler may overlap their loads: more registers)
        for nb in tl.static_range(NB):
            qk, st, kD = _column_block(C_ptr + bc_off, B_ptr + bc_off, Cb_ptr + pid_h * n,
                                       Bb_ptr + pid_h * n, Phi_ptr + row * l * na, Dst_ptr, qk,
                                       st, kD, nb, offs_t, offs_p, loc_t, l_left, l, g, p, n, na,
                                       Q, BN, DOT)
    else:  # a loop: one block's tiles live at a time
        for nb in tl.range(0, NB, num_stages=1):
            qk, st, kD = _column_block(C_ptr + bc_off, B_ptr + bc_off, Cb_ptr + pid_h * n,
                                       Bb_ptr + pid_h * n, Phi_ptr + row * l * na, Dst_ptr, qk,
                                       st, kD, nb, offs_t, offs_p, loc_t, l_left, l, g, p, n, na,
                                       Q, BN, DOT)

    # 2. the weights' gradients, from E = (k qᵀ) ∘ (v dyᵀ) ∘ Mᵀ
    v = tl.load(X_ptr + tp0 + tp, mask=mask_tp, other=0.0)
    dy = tl.load(dY_ptr + tp0 + tp, mask=mask_tp, other=0.0)
    dqk = tl.sum(dy.to(tl.float32) * v.to(tl.float32), axis=1)  # (Q,): dy_s·v_s
    Mt = tl.trans(causal_decay(c2, Q))  # (Q, Q): rows s, columns t > s
    st = st * Mt
    E = st * tl.dot(v.to(DOT), tl.trans(dy.to(DOT)))  # (Q, Q)
    dw = tl.sum(E, axis=1)
    E = E * w[:, None]
    dc = tl.sum(E, axis=0) - tl.sum(E, axis=1)  # c_t enters as t (+) and as s (−)
    vDk = tl.sum(v.to(tl.float32) * kD, axis=1)  # (Q,): v_s·(D_c k_s)
    dw += e * vDk
    dc -= u * vDk
    HD = tl.sum(tl.load(HD_ptr + chunk * TILES + tl.arange(0, TILES)), axis=0)
    dc_end = tl.sum(u * vDk, axis=0) + exp2(c2_end) * HD
    dc += tl.where(offs_t == last, dc_end, 0.0)

    # 3. the values
    D = 0.0
    if HAS_D:
        D = tl.load(D_ptr + pid_h).to(tl.float32)
    dv = tl.dot(st.to(DOT), dy.to(DOT)) * w[:, None] + u[:, None] * kD \
        + (D + gamma * qk)[:, None] * dy.to(tl.float32)  # (Q, P)
    tl.store(dX_ptr + tp0 + tp, dv.to(dX_ptr.dtype.element_ty), mask=mask_tp)
    tl.store(dW_ptr + row * l + offs_t, dw, mask=mask_t)
    tl.store(dG_ptr + row * l + offs_t, qk * dqk, mask=mask_t)
    tl.store(dc_ptr + row * l + offs_t, dc, mask=mask_t)
    tl.store(dD_ptr + chunk, tl.sum(tl.where(mask_t, dqk, 0.0), axis=0))
