"""The Mamba-3 SISO forward in three launches, chapter 10's chunked algorithm with local frames.

    1. chunk states   S^L_c = Σ_t e^{c_end − c_t} w_t v_t (R(φ_t) k̃_t)ᵀ   every chunk at once
    2. state passing  H^L_{c+1} = (a_c H^L_c + S^L_c) R(Φ_c)               a short walk per row
    3. outputs        y = e^{c} (q H^Lᵀ) + (q kᵀ ∘ M ∘ w) v + (D + γ q·k) v,  out = y · silu(z)

(``chunk_state``, ``state_passing`` and ``_output_kernel`` here;
``mambalearn.mamba3.reference_chunked`` is the same algorithm in PyTorch.) In step 3, q = R(φ)(Q +
Q_bias) and k = R(φ)(K + K_bias) turned by the *local* angles, M_ts = e^{c_t − c_s} for s < t, w the
trapezoid weight and γ = λΔ its diagonal; q·k is the same rotated or not. Steps 1 and 3 run a
program per (head, chunk, batch), 8192 at the benchmark shape: every chunk is independent once step
2 has given it its state. With ``Config.forward_launches`` = 2, steps 1 and 2 are one walk over the
chunks (``state_passing.walk_states``): S^L_c never leaves the registers.

Matmuls take their operands in the inputs' dtype (bf16 → bf16 tensor cores, float32 → tf32 on a
GPU) and accumulate in float32; the states between the launches are stored in the inputs' dtype,
the final state in float32.
"""

import torch
import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.mamba3.chunk_state import chunk_states
from mambalearn.mamba3.common import (
    SIZES,
    blocks,
    causal_decay,
    dot_dtype,
    exp2,
    load_angles,
    load_qk,
    load_steps,
    warps,
)
from mambalearn.mamba3.reference import final_k
from mambalearn.mamba3.state_passing import pass_states, walk_states


@triton.jit
def _column_block(C_ptr, B_ptr, Cb_ptr, Bb_ptr, phi_ptr, H_ptr, qk, s, y, nb, offs_t, offs_p,
                  loc_t, l_left, l, g: tl.constexpr, p: tl.constexpr, n: tl.constexpr,
                  na: tl.constexpr, Q: tl.constexpr, BN: tl.constexpr, DOT: tl.constexpr):
    """Column block ``nb`` of the outputs: q, k turned by the local angles; q·k, q kᵀ and
    q H^Lᵀ added to ``qk``, ``s`` and ``y``."""
    offs_n = nb * BN + tl.arange(0, BN)
    cos, sin = load_angles(phi_ptr, offs_t, nb, l, na, Q, BN)
    q, k = load_qk(C_ptr, B_ptr, Cb_ptr, Bb_ptr, g * n, loc_t, offs_n, l_left, n, cos, sin, Q,
                   BN)  # (Q, BN) each
    qk += tl.sum(q * k, axis=1)  # q_t·k_t, in float32 (the same rotated or not)
    q, k = q.to(DOT), k.to(DOT)
    H = tl.load(H_ptr + offs_p[:, None] * n + offs_n[None, :],
                mask=(offs_p[:, None] < p) & (offs_n[None, :] < n), other=0.0)  # (P, BN)
    y = tl.dot(q, tl.trans(H), acc=y)  # (Q, P)
    s = tl.dot(q, tl.trans(k), acc=s)  # (Q, Q)
    return qk, s, y


@triton.jit(do_not_specialize=SIZES)
def _output_kernel(
    C_ptr, B_ptr, X_ptr, Cb_ptr, Bb_ptr, D_ptr, Z_ptr,
    c2_ptr, W_ptr, G_ptr, Phi_ptr,  # per step (``chunk_state``): c log₂e, w, γ, and φ
    H_ptr,  # (b, h, c, p, n): H^L_c, the state entering each chunk in its frame
    Out_ptr,  # out (b, l, h, p)
    Ypre_ptr,  # out (b, l, h, p) or None: y before the gate, kept for the backward
    l, n_chunks,  # run-time sizes, then the model's, compiled in (strides follow from them)
    h: tl.constexpr, g: tl.constexpr, p: tl.constexpr, n: tl.constexpr, na: tl.constexpr,
    Q: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr,  # chunk; column block, blocks
    P: tl.constexpr,  # channels (≥ p)
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    DOT: tl.constexpr,  # operand dtype of tl.dot (the inputs' dtype)
    UNROLL: tl.constexpr,  # the column blocks unrolled, or a loop
):
    # (head, chunk) on grid axis 0, head fastest (axis 1 stops at 65 535 chunks)
    pid_h, pid_c = tl.program_id(0) % h, tl.program_id(0) // h
    pid_b = tl.program_id(1).to(tl.int64)
    row = pid_b * h + pid_h
    offs_t, offs_p = pid_c * Q + tl.arange(0, Q), tl.arange(0, P)
    loc_t, l_left = tl.arange(0, Q), l - pid_c * Q  # steps from the chunk's first; steps left in l
    mask_tp = (offs_t[:, None] < l) & (offs_p[None, :] < p)
    # 64-bit bases at the chunk's first step, 32-bit offsets inside it: past 2³¹ elements
    bt = pid_b * l + pid_c * Q  # the chunk's first (batch, step) row
    tp0 = (bt * h + pid_h) * p  # element (pid_b, pid_c·Q, pid_h, 0) of X, Z and the outputs
    tp = loc_t[:, None] * h * p + offs_p[None, :]  # (Q, P) offsets from there
    bc_off = (bt * g + pid_h // (h // g)) * n  # (pid_b, pid_c·Q, gi, 0) of C and B (GQA)
    H_ptr += (row * n_chunks + pid_c) * p * n

    # 1. per column block: q, k turned by the local angles; q·k, q kᵀ and q H^Lᵀ summed
    c2, w, gamma = load_steps(c2_ptr + row * l, W_ptr + row * l, G_ptr + row * l, offs_t, l)
    qk = tl.zeros([Q], dtype=tl.float32)
    s = tl.zeros([Q, Q], dtype=tl.float32)
    y = tl.zeros([Q, P], dtype=tl.float32)
    if UNROLL:  # the blocks unrolled (the compiler may overlap their loads: more registers)
        for nb in tl.static_range(NB):
            qk, s, y = _column_block(C_ptr + bc_off, B_ptr + bc_off, Cb_ptr + pid_h * n,
                                     Bb_ptr + pid_h * n, Phi_ptr + row * l * na, H_ptr, qk, s,
                                     y, nb, offs_t, offs_p, loc_t, l_left, l, g, p, n, na, Q,
                                     BN, DOT)
    else:  # a loop: one block's tiles live at a time
        for nb in tl.range(0, NB, num_stages=1):
            qk, s, y = _column_block(C_ptr + bc_off, B_ptr + bc_off, Cb_ptr + pid_h * n,
                                     Bb_ptr + pid_h * n, Phi_ptr + row * l * na, H_ptr, qk, s,
                                     y, nb, offs_t, offs_p, loc_t, l_left, l, g, p, n, na, Q,
                                     BN, DOT)

    # 2. the entering state decayed to each step; the chunk's inputs, strictly causal with weight
    # w_s; the diagonal γ q·k and D
    y = y * exp2(c2)[:, None]
    # a where, not a product with the mask's zeros: a NaN in k_s (its column of s) or in w_s
    # must not reach the steps t ≤ s through 0 · NaN
    steps = tl.arange(0, Q)
    s = tl.where(steps[:, None] > steps[None, :], s * causal_decay(c2, Q) * w[None, :], 0.0)
    v = tl.load(X_ptr + tp0 + tp, mask=mask_tp, other=0.0)  # (Q, P)
    y = tl.dot(s.to(DOT), v.to(DOT), acc=y)
    diag = gamma * qk
    if HAS_D:
        diag += tl.load(D_ptr + pid_h).to(tl.float32)
    y += diag[:, None] * v.to(tl.float32)
    if Ypre_ptr is not None:
        tl.store(Ypre_ptr + tp0 + tp, y, mask=mask_tp)
    if HAS_Z:
        z = tl.load(Z_ptr + tp0 + tp, mask=mask_tp, other=0.0).to(tl.float32)
        y = y * z * tl.sigmoid(z)  # silu(z)
    tl.store(Out_ptr + tp0 + tp, y.to(Out_ptr.dtype.element_ty), mask=mask_tp)


def _initial_state(x):
    """H_in = S_in + (1 − λ₀)Δ₀ v_in k_inᵀ: a previous call's state plus the unpaid half of its
    last input (absolute frame), and θ_in; (None, None) without Input_States."""
    if x["states"] is None:
        return None, None
    theta, S, k, v = x["states"]
    owe = (1 - torch.sigmoid(x["Trap"][:, :, 0].float())) * x["DT"][:, :, 0].float()  # (b, h)
    return (S + owe[..., None, None] * v[..., None] * k[..., None, :]).contiguous(), theta


def launch_forward(x, chunk_size, save, return_final, cfg):
    """The three launches on the prepared inputs ``x`` (see ``api``); returns a dict with
    out, and the final states if ``return_final``, and what the backward needs if ``save``.
    ``chunk_size`` as the entry point checked it, ``cfg`` the `config.Config` it resolved."""
    V = x["V"]
    b, l, h, p = V.shape
    g, n, na = x["Q"].shape[2], x["Q"].shape[3], x["Angles"].shape[3]
    BN, NB, P, Qc = blocks(n, p, chunk_size, cfg.output_col_block or cfg.col_block)
    H_in, theta_in = _initial_state(x)
    if cfg.forward_launches == 2:  # 1. and 2. in one walk over the chunks
        H, final, theta_final, steps = walk_states(x, Qc, theta_in, H_in, cfg)
    else:
        S, steps = chunk_states(x, Qc, cfg)  # 1. (b, h, c, p, n), the per-step values
        H, final, theta_final = pass_states(S, steps["Turn"], steps["Cend"], theta_in, H_in,
                                            cfg)  # 2.
    out = torch.empty_like(V)
    y_pre = torch.empty_like(V) if save and x["Z"] is not None else None
    c = H.shape[2]
    _output_kernel[(h * c, b)](  # 3.
        x["Q"], x["K"], V, x["Q_bias"], x["K_bias"], x["D"], x["Z"],
        steps["C2"], steps["W"], steps["G"], steps["Phi"], H, out, y_pre,
        l, c, h, g, p, n, na,
        Q=Qc, BN=BN, NB=NB, P=P, HAS_D=x["D"] is not None, HAS_Z=x["Z"] is not None,
        DOT=dot_dtype(V), UNROLL=cfg.output_unroll == 1,
        num_warps=warps(cfg.output_warps, Qc),
        **({} if cfg.output_maxnreg is None else dict(maxnreg=cfg.output_maxnreg)),
    )
    r = dict(out=out, H=H, steps=steps, theta_final=theta_final, y_pre=y_pre)
    if return_final:  # the last step's k, turned by the final angle: the next call's k_prev
        r.update(angle=theta_final, ssm=final, k=final_k(x["K"], x["K_bias"], theta_final))
    return r
