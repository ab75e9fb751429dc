"""Backward, part 2 of 2: the gradients of the queries, the angles per step and the decays.

Programs as ``backward_kv`` (a head block per program, dQ summed over it). With H^L_c the state
entering the chunk in its frame (the forward kept it) and M_ts = e^{c_t − c_s} (s < t):

    dq_t = Σ_{s<t} (dy_t·v_s) M_ts w_s k_s + e^{c_t} H^Lᵀ dy_t      then R(φ_t)ᵀ, + γ_t (dy_t·v_t) k̃_t
    dθ_t = (dq_t × q_t) + (dk_t × k_t)  per pair, the keys' part from ``backward_kv``
    dc_t += q_t·(e^{c_t} H^Lᵀ dy_t)       (the entering state's decay to step t)
    dADT_t = Σ_{r ≥ t in chunk} dc_r

dθ is stored as its reverse cumsum inside the chunk, and each chunk's total apart: the sum over
the later chunks, which θ_t = θ_in + Σ_{s≤t} Δ_s ω_s needs as well, is a short cumsum over c.
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
def _bwd_q_kernel(
    Q_ptr, K_ptr, V_ptr, ADT_ptr, DT_ptr, Trap_ptr, Qb_ptr, Kb_ptr, Ang_ptr,
    dY_ptr,  # (b, l, h, p): the gradient of y (after the gate's backward)
    H_ptr,  # (b, h, c, p, n): H^L_c, the state entering each chunk in its frame
    dC_ptr,  # (b, h, l) float32: the keys' part of dc (``backward_kv``)
    dthk_ptr,  # (b, l, h, na) float32: the keys' part of dθ
    dQ_ptr,  # out (b, l, h / HPP, n) float32: dQ summed over each head block
    dQb_ptr,  # out (b, c, h, n) float32: per-chunk sums of dQ per head (dQ_bias)
    dADT_ptr,  # out (b, h, l) float32
    dth_ptr,  # out (b, l, h, na) float32: Σ_{s ≥ t in chunk} dθ_s
    dth_tot_ptr,  # out (b, h, c, na) float32: Σ_{s in chunk} dθ_s
    l, h, g, p, n, na, n_chunks,
    Q: tl.constexpr, N: tl.constexpr, P: tl.constexpr,  # tiles: chunk, state columns, channels
    HPP: tl.constexpr,  # heads per program
    DOT: tl.constexpr,
):
    hb, ci = tl.program_id(0), tl.program_id(1)
    bi = tl.program_id(2).to(tl.int64)
    offs_t = ci * Q + tl.arange(0, Q)
    offs_n, offs_p, offs_j = tl.arange(0, N), tl.arange(0, P), tl.arange(0, N // 2)
    mask_t = offs_t < l
    mask_tp = mask_t[:, None] & (offs_p[None, :] < p)
    mask_tn = mask_t[:, None] & (offs_n[None, :] < n)
    mask_tj = mask_t[:, None] & (offs_j[None, :] < na)
    qk_ptr = (bi * l * g + (hb * HPP) // (h // g)) * n  # the block's Q/K head (GQA)
    acc = tl.zeros([Q, N], dtype=tl.float32)  # Σ over the block's heads of dQ
    for i in range(HPP):
        hi = hb * HPP + i
        row = bi * h + hi
        chunk = row * n_chunks + ci
        tp = (bi * l * h + hi) * p + offs_t[:, None] * h * p + offs_p[None, :]  # (Q, P)
        tj = (bi * l * h + hi) * na + offs_t[:, None] * h * na + offs_j[None, :]  # (Q, N/2)
        # 1. recompute the chunk: scalars, decays, local angles, q and k
        dt, adt, lam, gamma, w = chunk_scalars(DT_ptr + row * l, ADT_ptr + row * l,
                                               Trap_ptr + row * l, offs_t, l)
        cs = tl.cumsum(adt, axis=0)
        phi, _ = local_angles(Ang_ptr + (bi * l * h + hi) * na, h * na, offs_t, offs_j, l, na,
                              dt)
        cos, sin = cos_sin(phi)
        q = load_turned(Q_ptr + qk_ptr, Qb_ptr + hi * n, g * n, offs_t, offs_n, l, n, cos, sin,
                        Q, N)
        k = load_turned(K_ptr + qk_ptr, Kb_ptr + hi * n, g * n, offs_t, offs_n, l, n, cos, sin,
                        Q, N)
        v = tl.load(V_ptr + tp, mask=mask_tp, other=0.0)
        dy = tl.load(dY_ptr + tp, mask=mask_tp, other=0.0)
        dqk = tl.sum(dy.to(tl.float32) * v.to(tl.float32), axis=1)  # (Q,): dy_t·v_t
        H = tl.load(H_ptr + chunk * p * n + offs_p[:, None] * n + offs_n[None, :],
                    mask=(offs_p[:, None] < p) & (offs_n[None, :] < n), other=0.0).to(DOT)
        v, dy = v.to(DOT), dy.to(DOT)

        # 2. dq: the entering state's part first (it also gives the decays' gradient), then the
        # chunk's own inputs
        dq = tl.dot(dy, H) * tl.exp(cs)[:, None]  # (Q, N): e^{c_t} H^Lᵀ dy_t
        dc = tl.sum(q * dq, axis=1) + tl.load(dC_ptr + row * l + offs_t, mask=mask_t, other=0.0)
        tl.store(dADT_ptr + row * l + offs_t, tl.cumsum(dc, axis=0, reverse=True), mask=mask_t)
        dP = tl.dot(dy, tl.trans(v)) * causal_decay(cs, Q) * w[None, :]  # (Q, Q)
        dq = tl.dot(dP.to(DOT), k.to(DOT), acc=dq)

        # 3. dθ per step (both parts), as a reverse cumsum inside the chunk and the chunk's total
        dth = pair_cross(dq, q, Q, N) + tl.load(dthk_ptr + tj, mask=mask_tj, other=0.0)
        tl.store(dth_ptr + tj, tl.cumsum(dth, axis=0, reverse=True), mask=mask_tj)
        tl.store(dth_tot_ptr + chunk * na + offs_j, tl.sum(dth, axis=0), mask=offs_j < na)

        # 4. the diagonal, in the frame of Q
        dq = turn(dq + (gamma * dqk)[:, None] * k, cos, -sin, Q, N)
        acc += dq
        tl.store(dQb_ptr + ((bi * n_chunks + ci) * h + hi) * n + offs_n,
                 tl.sum(tl.where(mask_tn, dq, 0.0), axis=0), mask=offs_n < n)
    part = (bi * l * (h // HPP) + hb) * n  # element (bi, 0, hb, 0) of dQ
    tl.store(dQ_ptr + part + offs_t[:, None] * (h // HPP) * n + offs_n[None, :], acc, mask=mask_tn)
