"""Mamba-3 SISO in chunks: chapter 10's SSD algorithm, with the trapezoid folded into one weight.

Unrolling the recurrence of ``reference`` (α_t = exp(ADT_t), c_t = Σ_{r≤t} ADT_r):

    y_t = Σ_{s<t} (q_t·k_s) e^{c_t − c_s} w_s v_s + γ_t (q_t·k_t) v_t
    w_s = γ_s + (1 − λ_{s+1}) Δ_{s+1}     (β_{s+1} = (1 − λ_{s+1}) Δ_{s+1} α_{s+1}; α is decay)

so Mamba-3 is Mamba-2's quadratic form y = (L ∘ q kᵀ) v with Δ_s replaced by the weight w_s and a
different diagonal, γ_t instead of w_t. Everything of chapter 10 carries over: diagonal blocks,
chunk states, state passing with ⊗ (the step is still affine, h ↦ α h + u), off-diagonal blocks.

What the trapezoid does to the chunk summary: w_s of a chunk's last step already holds the next
step's β. The state handed from chunk to chunk is therefore the *pre-state*

    h̃_t = h_t + (1 − λ_{t+1}) Δ_{t+1} v_t k_tᵀ

(h_t plus the half of x_t's trapezoid that the next step will add), and the next chunk's first
α turns it into exactly α_{t+1} h_t + β_{t+1} v_t k_tᵀ. At the sequence end w_{l−1} = γ_{l−1}
(no next step), so the final state is h_{l−1} itself. The chunk summary (Π α, Σ e^{c_L − c_s}
w_s v_s k_sᵀ) thus reaches one token into the next chunk: a halo of one step, carried by w.

Shapes and arguments as ``mamba3_siso_sequential`` plus ``chunk_size`` (q).
"""

import torch
import torch.nn.functional as F

from mambalearn import ops
from mambalearn.mamba2.reference import segsum
from mambalearn.mamba3.reference import angle_cumsum, finish, prepare, rotate_pairs
from mambalearn.utils import check_chunk_size


def trapezoid_weights(DT, Trap):
    """(w, γ): w_s = λ_s Δ_s + (1 − λ_{s+1}) Δ_{s+1} (0 after the last step), γ_s = λ_s Δ_s.

    Shapes: DT, Trap (b, h, l) → two (b, h, l). The ``Scale`` and ``Gamma`` of mamba_ssm's kernel.
    """
    lam = torch.sigmoid(Trap)
    gamma = lam * DT
    ahead = F.pad(((1 - lam) * DT)[..., 1:], (0, 1))  # (b, h, l): the next step's (1 − λ)Δ
    return gamma + ahead, gamma


def mamba3_siso_chunked(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None,
                        Input_States=None, chunk_size=64, return_final_states=False):
    """Mamba-3 SISO by chunks of q steps (module docstring): O(l·q) work, matmuls on q×q blocks.

        1. diagonal blocks   y_diag = (L ∘ q kᵀ) v,  L_ts = e^{c_t − c_s} w_s (s < t), γ_t (s = t)
        2. chunk states      S_c = Σ_{s∈c} e^{c_end − c_s} w_s v_s k_sᵀ          (b, c, h, p, n)
        3. state passing     H_c = (e^{ΣADT}, S) ⊗ … over chunks (``ops.combine``)
        4. off-diagonal      y_off_t = e^{c_t} H_c q_t

    l need not be a multiple of q (the tail is padded with ADT = 0, w = 0, v = 0). Differentiable
    with autograd. Matches ``mamba3_siso_combined`` (no cu_seqlens).
    """
    x = prepare(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, Input_States)
    q_, k_, v = x["q"], x["k"], x["v"]
    b, l, h, n = q_.shape
    p, qs = v.shape[-1], check_chunk_size(chunk_size)
    states = x["states"]
    theta = angle_cumsum(x["angles"], x["dt"], None if states is None else states[0])
    q, k = rotate_pairs(q_, theta), rotate_pairs(k_, theta)  # (b, l, h, n)
    w, gamma = trapezoid_weights(x["dt"], x["trap"])  # (b, h, l)
    H0 = q.new_zeros(b, h, p, n)
    if states is not None:  # the previous call's last input still owes its (1 − λ_0)Δ_0 half
        lam0 = torch.sigmoid(x["trap"][:, :, 0])
        owe = (1 - lam0) * x["dt"][:, :, 0]  # (b, h)
        H0 = states[1] + owe[..., None, None] * states[3][..., None] * states[2][..., None, :]

    c = -(-l // qs)
    pad = c * qs - l
    chunks = lambda X: F.pad(X, (0, 0) * (X.ndim - 2) + (0, pad)).unflatten(1, (c, qs))
    q, k, v_c = chunks(q), chunks(k), chunks(v)  # (b, c, q, h, ·)
    adt = F.pad(x["adt"], (0, pad)).unflatten(-1, (c, qs))  # (b, h, c, q)
    w, gamma = (F.pad(t, (0, pad)).unflatten(-1, (c, qs)) for t in (w, gamma))  # (b, h, c, q)
    cs = torch.cumsum(adt, dim=-1)  # (b, h, c, q): c_t from the chunk start

    # 1. diagonal blocks: w_s below the diagonal, γ_t on it
    eye = torch.eye(qs, dtype=torch.bool, device=q.device)
    L = torch.exp(segsum(adt)) * w[..., None, :]  # (b, h, c, q, q)
    L = torch.where(eye, torch.diag_embed(gamma), L)
    scores = torch.einsum("bcthn,bcshn->bhcts", q, k) * L  # (b, h, c, q, q)
    y_diag = torch.einsum("bhcts,bcshp->bcthp", scores, v_c)  # (b, c, q, h, p)
    # 2. chunk states: inputs decayed to the chunk's last step, weighted by w
    to_end = torch.exp(cs[..., -1:] - cs) * w  # (b, h, c, q)
    S = torch.einsum("bcshn,bcshp->bchpn", k, to_end.permute(0, 2, 3, 1)[..., None] * v_c)
    # 3. state passing: each chunk is one affine step h ↦ e^{Σ ADT} h + S_c (chapter 03's ⊗)
    H, H_in = H0, []
    for i in range(c):
        H_in.append(H)
        H = ops.apply((torch.exp(cs[:, :, i, -1])[..., None, None], S[:, i]), H)  # (b, h, p, n)
    H_in, final = torch.stack(H_in, dim=1), H  # (b, c, h, p, n): the pre-state entering chunks
    # 4. off-diagonal blocks: the entering state read out by q_t, decayed to step t
    q_in = q * torch.exp(cs).permute(0, 2, 3, 1)[..., None]  # (b, c, q, h, n)
    y_off = torch.einsum("bcthn,bchpn->bcthp", q_in, H_in)  # (b, c, q, h, p)
    y = (y_diag + y_off).flatten(1, 2)[:, :l]  # (b, l, h, p)
    out = finish(y, v, x["D"], x["Z"], V.dtype)
    if not return_final_states:
        return out
    k_last = k.flatten(1, 2)[:, l - 1]  # (b, h, n): rotated, before any weight
    return out, theta[:, -1], final, k_last, v[:, -1]
