"""What one chunk adds to the state, and sends back to it: a program per (head, chunk, batch).

Forward, the chunk's inputs decayed to its last step and weighted by the trapezoid weight w:

    S^L_c = Σ_{t∈c} e^{c_end − c_t} w_t v_t (R(φ_t) k̃_t)ᵀ          (p × n, the chunk's frame)

Backward, the gradient the chunk's outputs send to the state entering it:

    dS^L_c = Σ_{t∈c} e^{c_t} dy_t (R(φ_t) q̃_t)ᵀ,    dy = dout · silu(z)

with c_t = Σ_{s≤t in c} ADT_s, k̃ = K + K_bias, q̃ = Q + Q_bias and φ the local angles
(``common``). Both are one (p × q)·(q × n) product of the same form, so one kernel does both
(``GRAD``). All chunks are independent; ``state_passing`` chains them.

The forward's pass is also the one place where the per-step values are computed from the inputs:
c_t log₂e, the trapezoid weights w_t and γ_t, the local angles φ_t (mod 2π), each chunk's turn Φ_c
and log-decay c_end are stored (12 + 2·na bytes per step and head for bf16) and later kernels read
them instead of redoing sigmoids, scans and tanh. The backward's pass also applies the gate
(dz = dout · y · silu′(z), with y the output before the gate that the forward kept).
"""

import torch
import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.mamba3.common import (
    LOG2E,
    SIZES,
    blocks,
    chunk_scalars,
    cos_sin,
    dot_dtype,
    exp2,
    load_angles,
    load_steps,
    load_turned,
    local_angles,
    new_steps,
    warps,
)


@triton.jit(do_not_specialize=SIZES)
def _chunk_state_kernel(
    X_ptr,  # (b, l, h, p): x (forward) or dout (backward)
    Y_ptr, Yb_ptr,  # (b, l, g, n) and (h, n): B and its bias (forward) or C and its (backward)
    ADT_ptr, DT_ptr, Trap_ptr, Ang_ptr,  # forward: (b, h, l) ×3 and (b, l, h, na)
    c2_ptr, W_ptr, G_ptr,  # (b, h, l) float32: c_t log₂e, w_t, γ_t (out forward, in backward)
    Phi_ptr,  # (b, h, l, na): the local angles φ_t (out forward, in backward)
    Turn_ptr, cend_ptr,  # out, forward: the turn Φ_c (b, h, c, na) and c_end (b, h, c)
    Z_ptr, Ypre_ptr,  # backward with a gate: z and the output before the gate, (b, l, h, p)
    dZ_ptr, dY_ptr,  # out, backward with a gate: dz and dy = dout·silu(z), (b, l, h, p)
    S_ptr,  # out (b, h, c, p, n): S^L_c (forward) or dS^L_c (backward)
    l, n_chunks,  # run-time sizes, then the model's, compiled in (strides follow from them)
    h: tl.constexpr, g: tl.constexpr, p: tl.constexpr, n: tl.constexpr, na: tl.constexpr,
    Q: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr,  # chunk; column block, blocks
    P: tl.constexpr,  # channels (≥ p)
    GRAD: tl.constexpr,  # False: S^L (forward); True: dS^L (backward)
    HAS_Z: tl.constexpr,  # backward: dout goes through the gate first
    DOT: tl.constexpr,  # operand dtype of tl.dot
):
    # (head, chunk) on grid axis 0, head fastest (axis 1 stops at 65 535 chunks)
    pid_h, pid_c = tl.program_id(0) % h, tl.program_id(0) // h
    pid_b = tl.program_id(1).to(tl.int64)
    row = pid_b * h + pid_h  # the (batch, head) row of the (b, h, ·) tensors
    chunk = row * n_chunks + pid_c
    offs_t, offs_p = pid_c * Q + tl.arange(0, Q), tl.arange(0, P)
    loc_t, l_left = tl.arange(0, Q), l - pid_c * Q  # steps from the chunk's first; steps left in l
    mask_t = offs_t < l
    mask_tp = mask_t[:, None] & (offs_p[None, :] < p)
    # 64-bit bases at the chunk's first step, 32-bit offsets inside it: past 2³¹ elements
    bt = pid_b * l + pid_c * Q  # the chunk's first (batch, step) row
    tp0 = (bt * h + pid_h) * p  # element (pid_b, pid_c·Q, pid_h, 0) of X, Z, Ypre, dZ, dY
    tp = loc_t[:, None] * h * p + offs_p[None, :]  # (Q, P) offsets from there
    phi_ptr = Phi_ptr + row * l * na
    y_ptr = Y_ptr + (bt * g + pid_h // (h // g)) * n  # element (pid_b, pid_c·Q, gi, 0): GQA

    # 1. the per-step weights: computed and stored (forward) or loaded (backward)
    if GRAD:
        c2, w, gamma = load_steps(c2_ptr + row * l, W_ptr + row * l, G_ptr + row * l, offs_t, l)
        r = exp2(c2)  # e^{c_t}: how the entering state reaches step t
    else:
        dt, adt, lam, gamma, w = chunk_scalars(DT_ptr + row * l, ADT_ptr + row * l,
                                               Trap_ptr + row * l, offs_t, l)
        c2 = tl.cumsum(adt, axis=0) * LOG2E  # (Q,): c_t log₂e
        # c_end is c's last entry, not a separate sum: rounded alike, e^{c_end − c_t} is 1 at
        # the last step however large c grows (Δ = ADT = 0 past l, so entry Q − 1 is the end)
        c2_end = tl.sum(tl.where(tl.arange(0, Q) == Q - 1, c2, 0.0), axis=0)
        tl.store(c2_ptr + row * l + offs_t, c2, mask=mask_t)
        tl.store(W_ptr + row * l + offs_t, w, mask=mask_t)
        tl.store(G_ptr + row * l + offs_t, gamma, mask=mask_t)
        tl.store(cend_ptr + chunk, c2_end / LOG2E)
        r = exp2(c2_end - c2) * w  # e^{c_end − c_t} w_t: step t's input at the chunk's end

    # 2. x (and, backward, the gate), weighted by r
    x = tl.load(X_ptr + tp0 + tp, mask=mask_tp, other=0.0).to(tl.float32)  # (Q, P)
    if GRAD and HAS_Z:
        z = tl.load(Z_ptr + tp0 + tp, mask=mask_tp, other=0.0).to(tl.float32)
        sig = tl.sigmoid(z)
        ypre = tl.load(Ypre_ptr + tp0 + tp, mask=mask_tp, other=0.0).to(tl.float32)
        tl.store(dZ_ptr + tp0 + tp, x * ypre * sig * (1.0 + z * (1.0 - sig)), mask=mask_tp)
        x = x * z * sig  # dy = dout · silu(z)
        tl.store(dY_ptr + tp0 + tp, x, mask=mask_tp)
    xr = tl.trans(x * r[:, None]).to(DOT)  # (P, Q)

    # 3. per column block: the angles (forward: computed and stored), the rotated B or C, and a
    # (P, Q)·(Q, BN) product
    for nb in tl.static_range(NB):
        offs_n = nb * BN + tl.arange(0, BN)
        if GRAD:
            cos, sin = load_angles(phi_ptr, offs_t, nb, l, na, Q, BN)
        else:
            offs_j = nb * (BN // 2) + tl.arange(0, BN // 2)
            if nb * (BN // 2) < na:
                phi, turned = local_angles(Ang_ptr + (bt * h + pid_h) * na, h * na, loc_t,
                                           offs_j, l_left, na, dt)
                phi = phi.to(Phi_ptr.dtype.element_ty)  # the later kernels see the same φ
                tl.store(phi_ptr + offs_t[:, None] * na + offs_j[None, :], phi,
                         mask=mask_t[:, None] & (offs_j[None, :] < na))
                tl.store(Turn_ptr + chunk * na + offs_j, turned, mask=offs_j < na)
                cos, sin = cos_sin(phi.to(tl.float32))
            else:  # no pair of this block turns
                cos = tl.full([Q, BN // 2], 1.0, tl.float32)
                sin = tl.zeros([Q, BN // 2], dtype=tl.float32)
        y = load_turned(y_ptr, Yb_ptr + pid_h * n, g * n, loc_t, offs_n, l_left, n, cos, sin, Q,
                        BN)
        if DOT == tl.float32:  # the same product transposed: Triton 3.6 cannot give a tf32 wgmma
            # a B made by reshaping joined pairs (TritonGPUOptimizeDotOperands, P ≥ 64)
            S = tl.trans(tl.dot(tl.trans(y), tl.trans(xr)))  # (P, BN)
        else:
            S = tl.dot(xr, y.to(DOT))  # (P, BN)
        tl.store(S_ptr + chunk * p * n + offs_p[:, None] * n + offs_n[None, :],
                 S.to(S_ptr.dtype.element_ty),
                 mask=(offs_p[:, None] < p) & (offs_n[None, :] < n))


def _launch(x, steps, X, Y, Yb, S, Z, Ypre, dZ, dY, chunk_size, grad, cfg):
    V = x["V"]
    b, l, h, p = V.shape
    g, n, na = x["Q"].shape[2], x["Q"].shape[3], x["Angles"].shape[3]
    BN, NB, P, Qc = blocks(n, p, chunk_size, cfg.chunk_state_col_block)
    c = triton.cdiv(l, Qc)
    _chunk_state_kernel[(h * c, b)](
        X, Y, Yb, x["ADT"], x["DT"], x["Trap"], x["Angles"],
        steps["C2"], steps["W"], steps["G"], steps["Phi"], steps["Turn"], steps["Cend"],
        Z, Ypre, dZ, dY, S,
        l, c, h, g, p, n, na,
        Q=Qc, BN=BN, NB=NB, P=P, GRAD=grad, HAS_Z=Z is not None, DOT=dot_dtype(V),
        num_warps=warps(cfg.chunk_state_warps, Qc),
    )


def chunk_states(x, chunk_size, cfg):
    """Forward: (S^L (b, h, c, p, n) in V's dtype, steps): ``steps`` holds the per-step values
    every later kernel reads: C2 = c log₂e, W = w, G = γ (b, h, l), Phi = φ (b, h, l, na;
    float16 for bf16 inputs), and per chunk Turn = Φ_c (b, h, c, na) and Cend = c_end (b, h, c);
    float32 but Phi."""
    V = x["V"]
    b, l, h, p = V.shape
    n, na = x["Q"].shape[3], x["Angles"].shape[3]
    c = triton.cdiv(l, int(chunk_size))
    steps = new_steps(V, b, h, l, c, na)
    S = torch.empty(b, h, c, p, n, device=V.device, dtype=V.dtype)
    _launch(x, steps, V, x["K"], x["K_bias"], S, None, None, None, None, chunk_size, False, cfg)
    return S, steps


def state_grads(x, steps, d_out, y_pre, chunk_size, cfg):
    """Backward: (dS^L (b, h, c, p, n) in V's dtype, dy, dz): dy = dout·silu(z) and dz in
    dout's dtype (dy is dout itself and dz None without Z)."""
    V = x["V"]
    b, l, h, p = V.shape
    n = x["Q"].shape[3]
    c = triton.cdiv(l, int(chunk_size))
    dS = torch.empty(b, h, c, p, n, device=V.device, dtype=V.dtype)
    Z = x["Z"]
    dY = torch.empty_like(d_out) if Z is not None else d_out
    dZ = torch.empty_like(d_out) if Z is not None else None
    _launch(x, steps, d_out, x["Q"], x["Q_bias"], dS, Z, y_pre, dZ, dY, chunk_size, True, cfg)
    return dS, dY, dZ
