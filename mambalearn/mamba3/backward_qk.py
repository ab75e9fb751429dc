"""Backward: the gradients of the queries and the keys, and of the angles per step.

With M_ts = e^{c_t − c_s} (s < t), u_s = e^{c_end − c_s} w_s, H^L_c the state entering the chunk
and D_c the gradient of the state leaving it (both in the chunk's frame),

    A_ts = (dy_t·v_s) M_ts w_s  (s < t),    dq = A k + e^{c} ∘ (dy H^L),    dk = Aᵀ q + u ∘ (v D_c)

one (Q, Q) matrix for both. Then, per turning pair, dθ_t = (dq_t × q_t) + (dk_t × k_t), R(φ)ᵀ
turns dq and dk back to the frames of Q and K, and the diagonal γ_t q̃_t·k̃_t (which does not
depend on θ) adds γ_t (dy_t·v_t) times the other of k̃, q̃. dc_t = q_t·(e^{c_t} H^Lᵀ dy_t) is the
entering state's part of the decays' gradient. dθ is stored per step, and each chunk's total
apart: the later chunks' share of the reverse cumsum Σ_{s≥t} dθ_s is a short cumsum over c
(``backward``).

A program owns one block of BN state columns of one chunk and a block of heads that read the
same Q/K head (GQA): it walks the heads and sums their dQ and dK, so no per-head copy of them is
ever written. The column blocks are independent (a pair never straddles two).
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
    pair_cross,
    turn,
)


@triton.jit(do_not_specialize=SIZES + ["HPP"])
def bwd_qk_kernel(
    C_ptr, B_ptr, X_ptr, Cb_ptr, Bb_ptr,
    c2_ptr, W_ptr, G_ptr, Phi_ptr,  # per step (``chunk_state``): c log₂e, w, γ, and φ
    dY_ptr,  # (b, l, h, p): the gradient of y (after the gate's backward)
    H_ptr, Dst_ptr,  # (b, h, c, p, n): H^L_c entering and D_c leaving each chunk, its frame
    dC_ptr, dB_ptr,  # out (b, l, h / HPP, n) float32: summed over each head block
    dCb_ptr, dBb_ptr,  # out (b, c, h, n) float32: per-chunk sums per head (the biases)
    dc_ptr,  # out (b, h, NB, l) float32: the entering state's part of dc, per column block
    dth_ptr,  # out (b, l, h, na) float32: dθ_t
    dth_tot_ptr,  # out (b, h, c, na) float32: Σ_{s in chunk} dθ_s
    l, n_chunks,  # the run-time sizes
    HPP,  # heads per program: run-time too, so that one head is the same loop as several
    h: tl.constexpr, g: tl.constexpr, p: tl.constexpr, n: tl.constexpr, na: tl.constexpr,
    Q: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr,  # chunk; column block, blocks
    P: tl.constexpr,  # channels (≥ p)
    DOT: tl.constexpr,
):
    pid_nh, pid_c = tl.program_id(0), tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    nb, hb = pid_nh % NB, pid_nh // NB  # the column block, the head block
    offs_t, offs_p = pid_c * Q + tl.arange(0, Q), tl.arange(0, P)
    offs_n, offs_j = nb * BN + tl.arange(0, BN), nb * (BN // 2) + tl.arange(0, BN // 2)
    mask_t = offs_t < l
    mask_tp = mask_t[:, None] & (offs_p[None, :] < p)
    mask_tn = mask_t[:, None] & (offs_n[None, :] < n)
    mask_tj = mask_t[:, None] & (offs_j[None, :] < na)
    mask_pn = (offs_p[:, None] < p) & (offs_n[None, :] < n)
    bc_off = (pid_b * l * g + (hb * HPP) // (h // g)) * n  # the block's C/B head (GQA)
    last = tl.minimum(pid_c * Q + Q, l) - 1  # c_end is c at the chunk's last step
    acc_q = tl.zeros([Q, BN], dtype=tl.float32)  # Σ over the block's heads
    acc_k = tl.zeros([Q, BN], dtype=tl.float32)
    for i in range(HPP):
        hi = hb * HPP + i
        row = pid_b * h + hi
        chunk = row * n_chunks + pid_c
        # 64-bit bases at the chunk's first step, 32-bit offsets inside it: past 2³¹ elements
        tp0, tj0 = ((pid_b * l + pid_c * Q) * h + hi) * p, ((pid_b * l + pid_c * Q) * h + hi) * na
        tp = (offs_t[:, None] - pid_c * Q) * h * p + offs_p[None, :]  # (Q, P) offsets from tp0
        # 1. the chunk's scalars; the states' parts of dq and dk: e^{c} ∘ (dy H^L), u ∘ (v D_c)
        c2, w, gamma = load_steps(c2_ptr + row * l, W_ptr + row * l, G_ptr + row * l, offs_t,
                                  l)
        c2_end = tl.load(c2_ptr + row * l + last)
        v = tl.load(X_ptr + tp0 + tp, mask=mask_tp, other=0.0)
        dy = tl.load(dY_ptr + tp0 + tp, mask=mask_tp, other=0.0)
        diag = gamma * tl.sum(dy.to(tl.float32) * v.to(tl.float32), axis=1)  # γ_t dy_t·v_t
        v, dy = v.to(DOT), dy.to(DOT)
        s_offs = chunk * p * n + offs_p[:, None] * n + offs_n[None, :]  # (P, BN)
        H = tl.load(H_ptr + s_offs, mask=mask_pn, other=0.0).to(DOT)
        dq = tl.dot(dy, H) * exp2(c2)[:, None]  # (Q, BN)
        Dc = tl.load(Dst_ptr + s_offs, mask=mask_pn, other=0.0).to(DOT)
        dk = tl.dot(v, Dc) * (exp2(c2_end - c2) * w)[:, None]
        # 2. A, rows t, columns s
        A = (tl.dot(dy, tl.trans(v)) * causal_decay(c2, Q) * w[None, :]).to(DOT)
        # 3. this block's columns of q and k, turned by the local angles
        cos, sin = load_angles(Phi_ptr + row * l * na, offs_t, nb, l, na, Q, BN)
        # (in the matmuls' dtype: the products below then differentiate exactly what the forward
        # computed, so that the parts of dθ that cancel, cancel: Σ_t dθ_t of q kᵀ is 0)
        q, k = load_qk(C_ptr + bc_off, B_ptr + bc_off, Cb_ptr + hi * n, Bb_ptr + hi * n, g * n,
                       offs_t, offs_n, l, n, cos, sin, Q, BN)  # (Q, BN) each
        q, k = q.to(DOT), k.to(DOT)
        # 4. the decays' gradient from the entering state; the chunk's inputs' parts A k, Aᵀ q
        tl.store(dc_ptr + (row * NB + nb) * l + offs_t, tl.sum(q.to(tl.float32) * dq, axis=1),
                 mask=mask_t)
        if DOT == tl.float32:  # the same products transposed: Triton 3.6 cannot build a tf32
            # wgmma with A from registers and a rotated (joined) B (TritonGPUOptimizeDotOperands)
            dq += tl.trans(tl.dot(tl.trans(k), tl.trans(A)))
            dk += tl.trans(tl.dot(tl.trans(q), A))
        else:
            dq = tl.dot(A, k, acc=dq)
            dk = tl.dot(tl.trans(A), q, acc=dk)
        # 5. dθ of the turning pairs, in-chunk reverse cumsum and total
        if nb * (BN // 2) < na:
            dth = pair_cross(dq, q.to(tl.float32), Q, BN) \
                + pair_cross(dk, k.to(tl.float32), Q, BN)  # (Q, BN/2)
            tj = (offs_t[:, None] - pid_c * Q) * h * na + offs_j[None, :]  # (Q, BN/2) from tj0
            tl.store(dth_ptr + tj0 + tj, dth, mask=mask_tj)
            tl.store(dth_tot_ptr + chunk * na + offs_j, tl.sum(dth, axis=0), mask=offs_j < na)
        # 6. the diagonal (after dθ: it does not depend on θ), back to the frames of C and B, and
        # the bias sums
        dq = turn(dq + diag[:, None] * k.to(tl.float32), cos, -sin, Q, BN)
        dk = turn(dk + diag[:, None] * q.to(tl.float32), cos, -sin, Q, BN)
        acc_q += dq
        acc_k += dk
        b_offs = ((pid_b * n_chunks + pid_c) * h + hi) * n + offs_n
        tl.store(dCb_ptr + b_offs, tl.sum(tl.where(mask_tn, dq, 0.0), axis=0), mask=offs_n < n)
        tl.store(dBb_ptr + b_offs, tl.sum(tl.where(mask_tn, dk, 0.0), axis=0), mask=offs_n < n)
    part0 = ((pid_b * l + pid_c * Q) * (h // HPP) + hb) * n  # element (pid_b, pid_c·Q, hb, 0)
    part = (offs_t[:, None] - pid_c * Q) * (h // HPP) * n + offs_n[None, :]
    tl.store(dC_ptr + part0 + part, acc_q, mask=mask_tn)
    tl.store(dB_ptr + part0 + part, acc_k, mask=mask_tn)
