"""The Mamba-3 SISO forward as one Triton kernel: a program per (head, batch) walks its chunks.

For each chunk of q steps (``mambalearn.mamba3.chunked`` is the same algorithm in PyTorch):

    θ      = θ_carry + cumsum(Δ π tanh(Angles))          rotary angles, carried across chunks
    q, k   = R(θ)(Q + Q_bias), R(θ)(K + K_bias)           even/odd column pairs, (q, J) tiles
    y      = e^{c} (q Sᵀ) + (q kᵀ ∘ L ∘ w) v + (D + γ q·k) v,   L_ts = e^{c_t − c_s} (s < t)
    S      ← e^{c_end} S + (e^{c_end − c} w v)ᵀ k           the pre-state handed to the next chunk

with c = cumsum(ADT) inside the chunk, w the trapezoid weight and γ = λΔ (its diagonal). The
angle cumsum (mamba_ssm's separate ``angle_dt`` kernel) and the rotations are fused into the same
pass, so Q, K and Angles are read once and no rotated copy is written. The state S (p × n, float32)
never leaves registers between chunks; when a backward will follow, the state entering each chunk
and its angles are stored (``S_chunks``, ``theta_chunks``) so the backward can restart any chunk.

Matmuls take their operands in the inputs' dtype (bf16 → bf16 tensor cores, float32 → tf32 on a
GPU), accumulate in float32.
"""

import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.triton.mamba3.common import (
    SIZES,
    causal_decay,
    chunk_angles,
    chunk_scalars,
    load_pairs,
    rotate,
)


@triton.jit(do_not_specialize=SIZES)
def _mamba3_fwd_kernel(
    Q_ptr, K_ptr, V_ptr, ADT_ptr, DT_ptr, Trap_ptr, Qb_ptr, Kb_ptr, Ang_ptr, D_ptr, Z_ptr,
    ang0_ptr, S0_ptr, k0_ptr, v0_ptr,  # Input_States (angle, ssm, k, v), if HAS_INIT
    Out_ptr, ang_out_ptr, S_out_ptr, k_out_ptr,  # out (b, l, h, p) and the final states
    S_chunks_ptr, theta_chunks_ptr,  # (b, h, c, p, n), (b, h, c, na): saved for the backward
    l, h, g, p, n, na, n_chunks,  # sizes (contiguous tensors: strides follow from them)
    Q: tl.constexpr,  # chunk length
    J: tl.constexpr,  # column pairs per tile (≥ n/2, power of two)
    P: tl.constexpr,  # channels per tile (≥ p, power of two)
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_INIT: tl.constexpr,
    STORE_CHUNKS: tl.constexpr,  # save chunk-start states for the backward
    RETURN_FINAL: tl.constexpr,
    DOT: tl.constexpr,  # operand dtype of tl.dot (the inputs' dtype)
):
    hi = tl.program_id(0)
    bi = tl.program_id(1).to(tl.int64)
    gi = hi // (h // g)  # the Q/K head this head reads (GQA)
    half = n // 2
    offs_j = tl.arange(0, J)  # column pairs
    offs_p = tl.arange(0, P)  # channels
    mask_j, mask_p = offs_j < half, offs_p < p
    mask_pj = mask_p[:, None] & mask_j[None, :]
    row = bi * h + hi  # (batch, head) row of the (b, h, ·) tensors
    qk_ptr = (bi * l * g + gi) * n  # element (bi, 0, gi, 0) of Q and K
    v_ptr = (bi * l * h + hi) * p  # element (bi, 0, hi, 0) of V, Z, Out
    ang_ptr = Ang_ptr + (bi * l * h + hi) * na
    dt_ptr, adt_ptr, trap_ptr = DT_ptr + row * l, ADT_ptr + row * l, Trap_ptr + row * l
    D = 0.0
    if HAS_D:
        D = tl.load(D_ptr + hi).to(tl.float32)
    # state columns: S_e[p, j] = S[p, 2j], S_o[p, j] = S[p, 2j + 1]
    s_offs = offs_p[:, None] * n + 2 * offs_j[None, :]  # (P, J)

    # 1. the state a previous call left: S, θ, and the last input's unpaid (1 − λ₀)Δ₀ half
    Se = tl.zeros([P, J], dtype=tl.float32)
    So = tl.zeros([P, J], dtype=tl.float32)
    theta0 = tl.zeros([J], dtype=tl.float32)
    if HAS_INIT:
        Se = tl.load(S0_ptr + row * p * n + s_offs, mask=mask_pj, other=0.0).to(tl.float32)
        So = tl.load(S0_ptr + row * p * n + s_offs + 1, mask=mask_pj, other=0.0).to(tl.float32)
        theta0 = tl.load(ang0_ptr + row * na + offs_j, mask=offs_j < na, other=0.0)
        k0e = tl.load(k0_ptr + row * n + 2 * offs_j, mask=mask_j, other=0.0).to(tl.float32)
        k0o = tl.load(k0_ptr + row * n + 2 * offs_j + 1, mask=mask_j, other=0.0).to(tl.float32)
        v0 = tl.load(v0_ptr + row * p + offs_p, mask=mask_p, other=0.0).to(tl.float32)
        owe = (1.0 - tl.sigmoid(tl.load(trap_ptr).to(tl.float32))) * tl.load(dt_ptr)
        Se += owe * v0[:, None] * k0e[None, :]
        So += owe * v0[:, None] * k0o[None, :]

    ci = 0
    while ci < n_chunks:  # a while loop: Triton 3.6's interpreter needs it for run-time bounds
        offs_t = ci * Q + tl.arange(0, Q)
        mask_t = offs_t < l
        mask_tp = mask_t[:, None] & mask_p[None, :]
        if STORE_CHUNKS:  # the pre-state entering chunk ci, and its angles
            base = (row * n_chunks + ci) * p * n
            tl.store(S_chunks_ptr + base + s_offs, Se, mask=mask_pj)
            tl.store(S_chunks_ptr + base + s_offs + 1, So, mask=mask_pj)
            tl.store(theta_chunks_ptr + (row * n_chunks + ci) * na + offs_j, theta0,
                     mask=offs_j < na)

        # 2. per-step scalars, angles, rotated q and k (in registers only). The order keeps few
        # (Q, J) tiles alive at once: each of q, k is rotated as soon as it is loaded, q·k (the
        # same rotated or not) is taken in float32, then both drop to the matmul dtype.
        dt, adt, lam, gamma, w = chunk_scalars(dt_ptr, adt_ptr, trap_ptr, offs_t, l)
        theta, tanh_a, turn = chunk_angles(ang_ptr, h * na, offs_t, offs_j, l, na, dt, theta0)
        cos, sin = tl.cos(theta), tl.sin(theta)
        qe, qo = load_pairs(Q_ptr + qk_ptr, Qb_ptr + hi * n, g * n, offs_t, offs_j, l, half)
        qe, qo = rotate(qe, qo, cos, sin)
        ke, ko = load_pairs(K_ptr + qk_ptr, Kb_ptr + hi * n, g * n, offs_t, offs_j, l, half)
        ke, ko = rotate(ke, ko, cos, sin)
        qk = tl.sum(qe * ke + qo * ko, axis=1) * gamma  # (Q,): the diagonal γ_t q_t·k_t
        qe, qo, ke, ko = qe.to(DOT), qo.to(DOT), ke.to(DOT), ko.to(DOT)
        v = tl.load(V_ptr + v_ptr + offs_t[:, None] * h * p + offs_p[None, :], mask=mask_tp,
                    other=0.0)  # (Q, P)
        cs = tl.cumsum(adt, axis=0)  # (Q,): log-decay from the chunk start
        cs_end = tl.sum(adt, axis=0)

        # 3. outputs: the entering state, the in-chunk quadratic form, the diagonal and D
        y = tl.dot(qe, tl.trans(Se).to(DOT)) + tl.dot(qo, tl.trans(So).to(DOT))
        y = y * tl.exp(cs)[:, None]  # (Q, P)
        s = tl.dot(qe, tl.trans(ke)) + tl.dot(qo, tl.trans(ko))
        s = s * causal_decay(cs, Q) * w[None, :]  # (Q, Q): strictly causal, weight w_s
        y += tl.dot(s.to(DOT), v.to(DOT))
        y += (D + qk)[:, None] * v.to(tl.float32)
        if HAS_Z:
            z = tl.load(Z_ptr + v_ptr + offs_t[:, None] * h * p + offs_p[None, :], mask=mask_tp,
                        other=0.0).to(tl.float32)
            y = y * z * tl.sigmoid(z)  # silu(z)
        tl.store(Out_ptr + v_ptr + offs_t[:, None] * h * p + offs_p[None, :],
                 y.to(Out_ptr.dtype.element_ty), mask=mask_tp)

        # 4. the state leaving the chunk: decay what came in, add this chunk's weighted inputs
        vw = v.to(tl.float32) * (tl.exp(cs_end - cs) * w)[:, None]  # (Q, P)
        vw = tl.trans(vw).to(DOT)  # (P, Q)
        Se = Se * tl.exp(cs_end) + tl.dot(vw, ke)  # (P, J)
        So = So * tl.exp(cs_end) + tl.dot(vw, ko)
        theta0 = theta0 + turn
        theta0 = theta0 - 6.283185307179586 * tl.floor(theta0 / 6.283185307179586)
        if RETURN_FINAL:  # the last step's rotated k: the next call pays its (1 − λ)Δ half
            last = offs_t == l - 1
            k_e = tl.sum(tl.where(last[:, None], ke.to(tl.float32), 0.0), axis=0)  # (J,)
            k_o = tl.sum(tl.where(last[:, None], ko.to(tl.float32), 0.0), axis=0)
            if (ci + 1) * Q >= l:
                tl.store(k_out_ptr + row * n + 2 * offs_j, k_e, mask=mask_j)
                tl.store(k_out_ptr + row * n + 2 * offs_j + 1, k_o, mask=mask_j)
        ci += 1

    if RETURN_FINAL:
        tl.store(S_out_ptr + row * p * n + s_offs, Se, mask=mask_pj)
        tl.store(S_out_ptr + row * p * n + s_offs + 1, So, mask=mask_pj)
        tl.store(ang_out_ptr + row * na + offs_j, theta0, mask=offs_j < na)


def launch_forward(x, chunk_size, store_chunks, return_final):
    """Run the forward kernel on the prepared inputs ``x`` (see ``interface``); returns a dict."""
    import torch

    from mambalearn.triton.mamba3.common import blocks

    V = x["V"]
    b, l, h, p = V.shape
    g, n, na = x["Q"].shape[2], x["Q"].shape[3], x["Angles"].shape[3]
    J, P, Qc = blocks(n, p, chunk_size)
    c = triton.cdiv(l, Qc)
    dev, f32 = V.device, torch.float32
    out = torch.empty_like(V)
    ang_out = torch.empty(b, h, na, device=dev, dtype=f32)
    S_out = torch.empty(b, h, p, n, device=dev, dtype=f32)
    k_out = torch.empty(b, h, n, device=dev, dtype=f32)
    S_chunks = torch.empty(b, h, c, p, n, device=dev, dtype=f32) if store_chunks else out
    theta_chunks = torch.empty(b, h, c, na, device=dev, dtype=f32) if store_chunks else out
    st = x["states"] or (None,) * 4
    dot = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}.get(V.dtype, tl.float32)
    _mamba3_fwd_kernel[(h, b)](
        x["Q"], x["K"], V, x["ADT"], x["DT"], x["Trap"], x["Q_bias"], x["K_bias"], x["Angles"],
        x["D"], x["Z"], st[0], st[1], st[2], st[3],
        out, ang_out, S_out, k_out, S_chunks, theta_chunks,
        l, h, g, p, n, na, c,
        Q=Qc, J=J, P=P, HAS_D=x["D"] is not None, HAS_Z=x["Z"] is not None,
        HAS_INIT=x["states"] is not None, STORE_CHUNKS=store_chunks, RETURN_FINAL=return_final,
        DOT=dot, num_warps=4 if P * J <= 2048 else 8,
    )
    return dict(out=out, angle=ang_out, ssm=S_out, k=k_out, S_chunks=S_chunks,
                theta_chunks=theta_chunks)
