"""What one chunk adds to the state, and what it sends back to it: a program per (head, chunk, batch).

Forward, the chunk's inputs decayed to its last step and weighted by the trapezoid weight w:

    S^L_c = Σ_{t∈c} e^{c_end − c_t} w_t v_t (R(φ_t) k̃_t)ᵀ          (p × n, the chunk's frame)

Backward, the gradient the chunk's outputs send to the state entering it:

    dS^L_c = Σ_{t∈c} e^{c_t} dy_t (R(φ_t) q̃_t)ᵀ,    dy = dout · silu(z)

with c_t = Σ_{s≤t in c} ADT_s, k̃ = K + K_bias, q̃ = Q + Q_bias and φ the local angles
(``common``). Both are one (p × q)·(q × n) product of the same form, so one kernel does both
(``GRAD``). All chunks are independent; ``state_passing`` chains them. The forward also writes
each chunk's turn Φ_c and log-decay c_end; the backward's pass also applies the gate
(dz = dout · y · silu′(z), with y the output before the gate that the forward kept).
"""

import torch
import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.triton.mamba3.common import (
    CONFIG,
    SIZES,
    blocks,
    chunk_scalars,
    cos_sin,
    dot_dtype,
    load_turned,
    local_angles,
)


@triton.jit(do_not_specialize=SIZES)
def _chunk_state_kernel(
    X_ptr,  # (b, l, h, p): V (forward) or dout (backward)
    Y_ptr, Yb_ptr,  # (b, l, g, n) and (h, n): K, K_bias (forward) or Q, Q_bias (backward)
    ADT_ptr, DT_ptr, Trap_ptr, Ang_ptr,  # (b, h, l) ×3 and (b, l, h, na)
    Z_ptr, Ypre_ptr,  # backward with a gate: z and the output before the gate, (b, l, h, p)
    dZ_ptr, dY_ptr,  # out, backward with a gate: dz and dy = dout·silu(z), (b, l, h, p)
    S_ptr,  # out (b, h, c, p, n): S^L_c (forward) or dS^L_c (backward)
    Phi_ptr, Cend_ptr,  # out, forward: the turn Φ_c (b, h, c, na) and c_end (b, h, c)
    l, h, g, p, n, na, n_chunks,  # sizes (contiguous tensors: strides follow from them)
    Q: tl.constexpr, N: tl.constexpr, P: tl.constexpr,  # tiles: chunk, state columns, channels
    GRAD: tl.constexpr,  # False: S^L (forward); True: dS^L (backward)
    HAS_Z: tl.constexpr,  # backward: dout goes through the gate first
    DOT: tl.constexpr,  # operand dtype of tl.dot
):
    hi, ci = tl.program_id(0), tl.program_id(1)
    bi = tl.program_id(2).to(tl.int64)
    row = bi * h + hi  # the (batch, head) row of the (b, h, ·) tensors
    chunk = row * n_chunks + ci
    offs_t = ci * Q + tl.arange(0, Q)
    offs_n, offs_p, offs_j = tl.arange(0, N), tl.arange(0, P), tl.arange(0, N // 2)
    mask_tp = (offs_t[:, None] < l) & (offs_p[None, :] < p)
    tp = (bi * l * h + hi) * p + offs_t[:, None] * h * p + offs_p[None, :]  # (Q, P) offsets

    # 1. the chunk's scalars and local angles, and the rotated K (forward) or Q (backward)
    dt, adt, lam, gamma, w = chunk_scalars(DT_ptr + row * l, ADT_ptr + row * l,
                                           Trap_ptr + row * l, offs_t, l)
    cs = tl.cumsum(adt, axis=0)  # (Q,): c_t
    cs_end = tl.sum(adt, axis=0)
    phi, turn_c = local_angles(Ang_ptr + (bi * l * h + hi) * na, h * na, offs_t, offs_j, l, na,
                               dt)
    cos, sin = cos_sin(phi)  # (Q, N/2)
    y = load_turned(Y_ptr + (bi * l * g + hi // (h // g)) * n, Yb_ptr + hi * n, g * n, offs_t,
                    offs_n, l, n, cos, sin, Q, N)  # (Q, N)
    x = tl.load(X_ptr + tp, mask=mask_tp, other=0.0).to(tl.float32)  # (Q, P)

    # 2. the per-step weight r_t (and, backward, the gate)
    if GRAD:
        if HAS_Z:
            z = tl.load(Z_ptr + tp, mask=mask_tp, other=0.0).to(tl.float32)
            sig = tl.sigmoid(z)
            ypre = tl.load(Ypre_ptr + tp, mask=mask_tp, other=0.0).to(tl.float32)
            tl.store(dZ_ptr + tp, x * ypre * sig * (1.0 + z * (1.0 - sig)), mask=mask_tp)
            x = x * z * sig  # dy = dout · silu(z)
            tl.store(dY_ptr + tp, x, mask=mask_tp)
        r = tl.exp(cs)  # e^{c_t}: how the entering state reaches step t
    else:
        r = tl.exp(cs_end - cs) * w  # e^{c_end − c_t} w_t: step t's input at the chunk's end
        tl.store(Phi_ptr + chunk * na + offs_j, turn_c, mask=offs_j < na)
        tl.store(Cend_ptr + chunk, cs_end)

    # 3. one (P, Q)·(Q, N) product
    xr = tl.trans(x * r[:, None]).to(DOT)  # (P, Q)
    S = tl.dot(xr, y.to(DOT))  # (P, N)
    s_offs = chunk * p * n + offs_p[:, None] * n + offs_n[None, :]
    tl.store(S_ptr + s_offs, S.to(S_ptr.dtype.element_ty),
             mask=(offs_p[:, None] < p) & (offs_n[None, :] < n))


def _launch(x, X, Y, Yb, S, Phi, Cend, Z, Ypre, dZ, dY, chunk_size, grad, cfg):
    V = x["V"]
    b, l, h, p = V.shape
    g, n, na = x["Q"].shape[2], x["Q"].shape[3], x["Angles"].shape[3]
    N, P, Qc = blocks(n, p, chunk_size)
    c = triton.cdiv(l, Qc)
    _chunk_state_kernel[(h, c, b)](
        X, Y, Yb, x["ADT"], x["DT"], x["Trap"], x["Angles"], Z, Ypre, dZ, dY, S, Phi, Cend,
        l, h, g, p, n, na, c,
        Q=Qc, N=N, P=P, GRAD=grad, HAS_Z=Z is not None, DOT=dot_dtype(V),
        num_warps=cfg["chunk_state_warps"],
    )


def chunk_states(x, chunk_size, cfg=CONFIG):
    """Forward: (S^L (b, h, c, p, n) in V's dtype, Φ (b, h, c, na), c_end (b, h, c)) float32."""
    V = x["V"]
    b, l, h, p = V.shape
    n, na = x["Q"].shape[3], x["Angles"].shape[3]
    c = triton.cdiv(l, int(chunk_size))
    S = torch.empty(b, h, c, p, n, device=V.device, dtype=V.dtype)
    Phi = torch.empty(b, h, c, na, device=V.device, dtype=torch.float32)
    Cend = torch.empty(b, h, c, device=V.device, dtype=torch.float32)
    _launch(x, V, x["K"], x["K_bias"], S, Phi, Cend, None, None, None, None, chunk_size, False,
            cfg)
    return S, Phi, Cend


def state_grads(x, d_out, y_pre, chunk_size, cfg=CONFIG):
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
    _launch(x, d_out, x["Q"], x["Q_bias"], dS, None, None, Z, y_pre, dZ, dY, chunk_size, True,
            cfg)
    return dS, dY, dZ
