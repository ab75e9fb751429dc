"""The whole selective scan with a parallel scan inside: discretize → scan → C contraction, PyTorch.

    1. discretize   Ā_t = exp(Δ_t A),  B̄_t x_t = Δ_t B_t x_t            (l, b, d, n) each
    2. scan         h_t = Ā_t h_{t−1} + B̄_t x_t  by any scan of chapter 04, over l
    3. contract     y_t = C_t h_t + D x_t,  out = y · silu(z)

Same arguments and results as the oracle ``selective_scan_sequential`` (and ``mamba_ssm``'s
``selective_scan_ref``). Time goes first, (l, b, d, n), so that the scan's even/odd halves are
contiguous blocks of b·d·n numbers. Everything (b, d, l, n)-sized is materialized in HBM: this is
the "naive" memory traffic that chapter 05 measures and the fused kernels of 08–09 avoid.

Counted in passes over one (l, b, d, n) tensor (a read or a write of all of it; 2.15 GB in fp32 at
b8 d2048 n16 l2048), the forward makes 16: discretize 4 (ΔA written, exp read and written in
place, B̄x written), Blelloch 11, contraction 1. The backward makes 25: contraction 2 (∂h written,
h read for ∂C), Blelloch 16, discretization 7.

The discretization has its own backward (:class:`Discretize`): through autograd, every product
that broadcasts a small tensor to (l, b, d, n) is differentiated as "multiply, then sum", which
writes and rereads an (l, b, d, n) tensor for each of Δ, A, B and x. Written as contractions, each
gradient is read once. With S = ∂ℒ/∂Ā ⊙ Ā = ∂ℒ/∂(ΔA) and G = ∂ℒ/∂(B̄x):

    ∂ℒ/∂Δ_t = Σ_n S_t A + x_t Σ_n G_t B_t        ∂ℒ/∂A = Σ_{t,b} Δ_t S_t
    ∂ℒ/∂x_t = Δ_t Σ_n G_t B_t                      ∂ℒ/∂B_t = Σ_d G_t Δ_t x_t
"""

import torch
from torch.autograd.function import once_differentiable

from mambalearn.scan.blelloch import blelloch_scan
from mambalearn.scan.sequential import check_inputs, compute_dtype, effective_delta, finish


def selective_scan_parallel(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                            delta_softplus=False, return_last_state=False, mask=None,
                            initial_state=None, scan=blelloch_scan):
    """``selective_scan_sequential`` computed as discretize → ``scan`` → contract, in fp32.

    Shapes: as ``selective_scan_sequential`` (u, delta, z (b, d, l); A (d, n); B, C (b, n, l),
    (b, g, n, l) or (d, n); D, delta_bias (d,); mask (b, l); initial_state (b, d, n)).
    ``scan(a, b, dim)`` is any inclusive scan of h_t = a_t h_{t−1} + b_t (default Blelloch).
    A mask is applied as Δ_t = 0 at masked steps: exp(0·A) = 1 and 0·B x = 0 keep the state.
    """
    check_inputs(u, delta, A, B, C, D, z, delta_bias, mask, initial_state)
    dtype = compute_dtype(u, delta, A, B, C)
    x = u.to(dtype)  # no copy when u is already in dtype
    delta = effective_delta(delta, delta_bias, delta_softplus, dtype)  # (b, d, l)
    if mask is not None:
        delta = delta.masked_fill(~mask[:, None, :], 0.0)
    # 1. discretize, time first (the (l, b, d) inputs made contiguous: small copies)
    delta_l, x_l = (t.permute(2, 0, 1).contiguous() for t in (delta, x))  # (l, b, d)
    h0 = None if initial_state is None else initial_state.to(dtype)  # (b, d, n)
    A_bar, Bx = Discretize.apply(delta_l, x_l, A.to(dtype), _groups(B, dtype), h0)  # (l, b, d, n)
    # 2. scan over time
    h = scan(A_bar, Bx, dim=0)  # (l, b, d, n)
    # 3. contract with C_t over n, one small matrix product per (t, batch)
    y = _contract_n(h, _groups(C, dtype)).permute(1, 2, 0)  # (b, d, l)
    out = finish(y, x, D, z, mask, u.dtype)
    # the last state is copied out: as a view it would keep all of h alive
    return (out, h[-1].clone()) if return_last_state else out


class Discretize(torch.autograd.Function):
    """Ā = exp(ΔA) and B̄x = Δ B x, time first, with a backward that reads each gradient once.

    ``Discretize.apply(delta, x, A, B, h0)``. Shapes: delta, x (l, b, d); A (d, n); B (l|1, b|1,
    g, n) as ``_groups`` lays it out; h0 (b, d, n) or None; returns A_bar, Bx (l, b, d, n).
    An initial state is folded into the first step, B̄_0 x_0 + Ā_0 h_{−1}, so that any scan from
    h_{−1} = 0 gives h_0 = Ā_0 h_{−1} + B̄_0 x_0. Saved: the small inputs, Δx and A_bar (which the
    scan saves too: the same storage).
    """

    @staticmethod
    def forward(ctx, delta, x, A, B, h0=None):
        A_bar = (delta[..., None] * A).exp_()  # (l, b, d, n): one write, then exp in place
        dx = delta * x  # Δ_t x_t: (l, b, d)
        Bx = (_per_group(dx, B)[..., None] * B[..., None, :]).flatten(2, 3)  # (l, b, d, n)
        if h0 is not None:
            Bx[0].addcmul_(A_bar[0], h0)  # (b, d, n)
        ctx.save_for_backward(delta, x, dx, A, B, A_bar, h0)
        return A_bar, Bx

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_A_bar, grad_Bx):
        delta, x, dx, A, B, A_bar, h0 = ctx.saved_tensors
        S = grad_A_bar * A_bar  # ∂ℒ/∂(ΔA): (l, b, d, n)
        grad_h0 = None
        if h0 is not None:  # B̄_0 x_0 + Ā_0 h_{−1}: G_0 reaches Ā_0 (times h_{−1}) and h_{−1}
            S[0] += grad_Bx[0] * h0 * A_bar[0]
            grad_h0 = grad_Bx[0] * A_bar[0]  # (b, d, n)
        grad_dx = _contract_n(grad_Bx, B)  # Σ_n G B = ∂ℒ/∂(Δx): (l, b, d)
        grad_delta = _contract_n(S, A[None, None]) + grad_dx * x  # (l, b, d)
        grad_A = _sum_lb(delta, S)  # (d, n)
        grad_B = _contract_d(grad_Bx, dx, B)  # B's (l|1, b|1, g, n)
        return grad_delta, grad_dx * delta, grad_A, grad_B, grad_h0


def _groups(X, dtype):
    """B or C broadcastable to (l, b, G, n): G = d for fixed (d, n), 1 for (b, n, l), g grouped."""
    X = X.to(dtype)
    if X.ndim == 2:
        return X[None, None]  # (1, 1, d, n)
    if X.ndim == 3:
        return X.permute(2, 0, 1)[:, :, None]  # (l, b, 1, n)
    return X.permute(3, 0, 1, 2)  # (l, b, g, n)


def _per_group(t, G):
    """Split the d channels of ``t`` (l, b, d, ...) into (g, d/g), as ``G`` (l|1, b|1, g, n)."""
    return t.unflatten(2, (G.shape[2], -1))  # (l, b, g, d/g, ...)


def _is_fixed(G, X):
    """True if G is a fixed (1, 1, d, n) projection broadcast over the (t, batch) of X."""
    return G.shape[:2] != X.shape[:2]


def _contract_n(X, G):
    """Σ_n X[t, b, i, n] G[t, b, group(i), n]: C_t h_t, or Σ_n ∂ℒ/∂(B̄x) B_t.  (l, b, d)

    One small matrix product per (t, batch, group), or per channel for a fixed G: reads X once.
    """
    if _is_fixed(G, X):
        return torch.einsum("lbgen,gn->lbge", _per_group(X, G), G[0, 0]).flatten(2)
    return torch.einsum("lbgen,lbgn->lbge", _per_group(X, G), G).flatten(2)


def _contract_d(X, v, G):
    """Σ_{i in group} X[t, b, i, n] v[t, b, i], summed to G's shape (l|1, b|1, g, n): ∂ℒ/∂B."""
    if _is_fixed(G, X):  # one (1, n) row per channel, shared by every (t, batch): sum those too
        return _sum_lb(v, X)[None, None]  # (1, 1, d, n)
    return torch.einsum("lbgen,lbge->lbgn", _per_group(X, G), _per_group(v, G))


def _sum_lb(v, X):
    """Σ_{t,b} v[t, b, i] X[t, b, i, n] as (d, 1, l·b) @ (d, l·b, n): reads X once, where the
    einsum ``"lbd,lbdn->dn"`` copies X first (its layout choice).  (d, n)"""
    return (v.flatten(0, 1).T[:, None, :] @ X.flatten(0, 1).transpose(0, 1))[:, 0]
