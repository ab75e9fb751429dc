"""Ranks as chunks: each rank's shard is summarised by one ⊗ element, and the summaries are scanned.

Split the l steps of h_t = Ā_t h_{t−1} + B̄_t x_t into R contiguous shards, one per rank. Scanned
from a zero state, shard r gives its local states h̃ and its *summary* — the ⊗ of all its steps
(chapter 03), exactly a chunk summary of chapter 06 with the chunk as large as the shard:

    s_r = (P_r, h_r) = (Ā_last ⋯ Ā_first,  h̃_last)          P_r = exp(A Σ_{t∈r} Δ_t)  (diagonal A)

The state entering rank r is the exclusive ⊗-scan of the summaries over the ranks,

    H_0 = h_{−1},    H_{r+1} = P_r H_r + h_r     i.e.  (·, H_r) = (·, h_{−1}) ⊗ s_0 ⊗ ⋯ ⊗ s_{r−1},

and the *fix-up* gives every state of shard r its carry, h_t = (Π_{s≤t} Ā_s) H_r + h̃_t. A kernel
that takes an initial state does the fix-up by scanning the shard again from H_r; a kernel that
does not can add the carry afterwards, by linearity (:func:`fix_up`).

Backward (chapter 07's reverse scan with the gate shifted by one, over ranks instead of steps):
with g_r = ∂ℒ/∂H_r the direct gradient of each entering state, the total gradient is

    Ĝ_R = ∂ℒ/∂H_R,   Ĝ_r = g_r + P_r Ĝ_{r+1};    ∂ℒ/∂h_r = Ĝ_{r+1},  ∂ℒ/∂P_r = Ĝ_{r+1} H_r,
    ∂ℒ/∂h_{−1} = Ĝ_0

— again a ⊗-scan, of the elements (P_r, g_r) taken from the last rank to the first.

    rank_scan           H_r for every r (the all-gather algorithm's local step; the exercise)
    rank_scan_backward  ∂ℒ/∂P_r, ∂ℒ/∂h_r, ∂ℒ/∂h_{−1} by the reverse scan
    fix_up              a shard's output and last state continued from H by linearity (exercise)
    shard_decay         P_r of a Mamba-1 shard; ``ssd_decay`` of an SSD shard
"""

import torch

from mambalearn import ops
from mambalearn.scan.blelloch import blelloch_scan


def rank_scan(P, h, initial_state=None):
    """H_0 = h_{−1}, H_{r+1} = P_r H_r + h_r: the state entering each rank, by ⊗ over summaries.

    Shapes:
        P:              (R, ...) decays broadcastable to h's (R, ..., n) (diagonal), or
                        (R, ..., n, n) full matrices
        h:              (R, ..., n)  each rank's last state scanned from zero
        initial_state:  (..., n), h_{−1}; zeros if None
        returns (H (R, ..., n), H_R (..., n)): the state entering each rank, and after the last.

    The prefixes s_0 ⊗ ⋯ ⊗ s_{r−1} are an exclusive scan of the summaries, so chapter 04's
    Blelloch scan forms them in 2·⌈log₂R⌉ vectorised rounds instead of R dependent steps (a rank
    of a 1024-GPU job would otherwise run 1024 small steps one after another). h_{−1} enters
    through the first element: (P_0, h_0) applied to h_{−1} is P_0 h_{−1} + h_0.
    """
    if P.shape[0] != h.shape[0] or h.shape[0] == 0:
        raise ValueError(f"P and h must hold the same number R ≥ 1 of rank summaries on dim 0, "
                         f"got {P.shape[0]} and {h.shape[0]}")
    h0 = torch.zeros_like(h[0]) if initial_state is None else initial_state.to(h.dtype)
    first = ops.apply((P[0], h[0]), h0)[None]  # (1, ..., n): H_1
    inclusive = blelloch_scan(P, torch.cat([first, h[1:]]), dim=0)  # (R, ..., n): H_1 … H_R
    return torch.cat([h0[None], inclusive[:-1]]), inclusive[-1]  # (R, ..., n), (..., n)


def sum_to(x, shape):
    """Sum the broadcast dimensions of ``x`` away so that it has ``shape`` (a gradient's shape)."""
    lead = x.ndim - len(shape)
    x = x.sum(tuple(range(lead))) if lead else x
    dims = tuple(i for i, s in enumerate(shape) if s == 1 and x.shape[i] != 1)
    return x.sum(dims, keepdim=True) if dims else x


def rank_scan_backward(P, H, grad_H, grad_final=None):
    """Ĝ_r = g_r + P_r Ĝ_{r+1} from Ĝ_R = ∂ℒ/∂H_R: the gradients of :func:`rank_scan` (diagonal P).

    Shapes:
        P:           (R, ...) broadcastable to H (diagonal decays)
        H:           (R, ..., n)  the entering states rank_scan returned
        grad_H:      (R, ..., n)  g_r, the direct gradient of each H_r
        grad_final:  (..., n)     ∂ℒ/∂H_R (zeros if None)
        returns (grad_P (P's shape), grad_h (R, ..., n), grad_initial (..., n)).
    """
    G_R = torch.zeros_like(H[0]) if grad_final is None else grad_final.to(H.dtype)
    last = ops.apply((P[-1], grad_H[-1]), G_R)[None]  # (1, ..., n): Ĝ_{R−1} = P Ĝ_R + g
    # Ĝ_r = g_r + P_r Ĝ_{r+1} for every r: the same scan run from the last rank to the first
    G = blelloch_scan(P, torch.cat([grad_H[:-1], last]), dim=0, reverse=True)  # (R, ..., n)
    grad_h = torch.cat([G[1:], G_R[None]])  # ∂ℒ/∂h_r = Ĝ_{r+1}: h_r enters H_{r+1} with weight 1
    # P_r multiplies H_r inside H_{r+1}: ∂ℒ/∂P_r = Ĝ_{r+1} H_r, summed to P's broadcast shape
    if P.ndim == H.ndim:
        grad_P = sum_to(grad_h * H, P.shape)
    else:
        grad_P = torch.stack([sum_to(g * x, P.shape[1:]) for g, x in zip(grad_h, H, strict=True)])
    return grad_P, grad_h, G[0]


def shard_decay(delta, A, delta_bias=None, delta_softplus=False):
    """P = exp(A Σ_t Δ_t), the product of a Mamba-1 shard's decays exp(Δ_t A).  (b, d, n)

    Δ = softplus(delta + delta_bias) if asked, as the scan computes it (chapter 02).
    Shapes: delta (b, d, l); A (d, n); delta_bias (d,).
    """
    from mambalearn.scan.sequential import effective_delta

    dt = effective_delta(delta, delta_bias, delta_softplus, torch.float32
                         if delta.dtype != torch.float64 else torch.float64)  # (b, d, l)
    return torch.exp(dt.sum(-1)[..., None] * A.to(dt.dtype))  # (b, d, n)


def ssd_decay(dt, A, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf"))):
    """P = exp(A_h Σ_t Δ_t), one decay per (batch, head) for a Mamba-2 shard.  (b, h, 1, 1)

    Δ as ``mamba_chunk_scan_combined`` computes it (``mambalearn.mamba2.reference.effective_dt``).
    Shapes: dt (b, l, h); A, dt_bias (h,).
    """
    from mambalearn.mamba2.reference import effective_dt

    delta = effective_dt(dt, dt_bias, dt_softplus, tuple(dt_limit))  # (b, l, h)
    return torch.exp(delta.sum(1) * A.to(delta.dtype))[..., None, None]  # (b, h, 1, 1)


def fix_up(y, last, delta, A, C, H):
    """y_t += C_t (exp(A Σ_{s≤t} Δ_s) ⊙ H),  last += exp(A ΣΔ) ⊙ H: a shard continued from H.

    The recurrence is linear in the state, so the scan of a shard started from H equals the scan
    started from zero plus H decayed to every step and read out by C_t. Mamba-1 layout.

    Shapes:
        y:      (b, d, l)   C_t h̃_t (+ D x_t), scanned from zero, before the z gate
        last:   (b, d, n)   h̃ at the shard's last step
        delta:  (b, d, l)   the effective Δ (after bias and softplus)
        A:      (d, n);  C (b, n, l) shared or (b, g, n, l) grouped;  H (b, d, n)
        returns (y (b, d, l), last (b, d, n)) in float32 (float64 if H is).

    Materialises a (b, d, l, n) tensor: the price of a kernel without an initial-state input.
    """
    from mambalearn.inference import initial_state_contribution

    y_extra, h_extra = initial_state_contribution(delta, A, C, H)  # (b, d, l), (b, d, n)
    return y.to(y_extra.dtype) + y_extra, last.to(h_extra.dtype) + h_extra
