"""The whole selective scan with a parallel scan inside: discretize → scan → C contraction, PyTorch.

    1. discretize   Ā_t = exp(Δ_t A),  B̄_t x_t = Δ_t B_t x_t            (l, b, d, n) each
    2. scan         h_t = Ā_t h_{t−1} + B̄_t x_t  by any scan of chapter 04, over l
    3. contract     y_t = C_t h_t + D x_t,  out = y · silu(z)

Same arguments and results as the oracle ``selective_scan_sequential`` (and ``mamba_ssm``'s
``selective_scan_ref``). Time goes first, (l, b, d, n), so that the scan's even/odd halves are
contiguous blocks of b·d·n numbers. Everything (b, d, l, n)-sized is materialized in HBM: this is
the "naive" memory traffic that chapter 05 measures and the fused kernels of 08–09 avoid.
"""

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
    b, d, l, n = check_inputs(u, delta, A, B, C, D, z, delta_bias, mask, initial_state)
    dtype = compute_dtype(u, delta, A, B, C)
    x = u.to(dtype)
    delta = effective_delta(delta, delta_bias, delta_softplus, dtype)  # (b, d, l)
    if mask is not None:
        delta = delta.masked_fill(~mask[:, None, :], 0.0)
    # 1. discretize, time first
    delta_l = delta.permute(2, 0, 1)  # (l, b, d)
    A_bar = (delta_l[..., None] * A.to(dtype)).exp_()  # (l, b, d, n)
    Bx = _per_group(delta_l * x.permute(2, 0, 1), B, d)[..., None]  # Δ_t x_t: (l, b, G, d/G, 1)
    Bx = (Bx * _groups(B, dtype)[..., None, :]).flatten(2, 3)  # B̄_t x_t: (l, b, d, n)
    if initial_state is not None:  # fold h_{−1} into the first step: h_0 = Ā_0 h_{−1} + B̄_0 x_0
        Bx[0] += A_bar[0] * initial_state.to(dtype)
    # 2. scan over time
    h = scan(A_bar, Bx, dim=0)  # (l, b, d, n)
    # 3. contract with C_t over n, one small matrix product per (t, batch)
    y = _per_group(h, C, d) @ _groups(C, dtype)[..., None]  # (l, b, G, d/G, 1)
    y = y.flatten(2, 4).permute(1, 2, 0)  # (b, d, l)
    out = finish(y, x, D, z, mask, u.dtype)
    return (out, h[-1]) if return_last_state else out


def _groups(X, dtype):
    """B or C broadcastable to (l, b, G, n): G = d for fixed (d, n), 1 for (b, n, l), g grouped."""
    X = X.to(dtype)
    if X.ndim == 2:
        return X[None, None]  # (1, 1, d, n)
    if X.ndim == 3:
        return X.permute(2, 0, 1)[:, :, None]  # (l, b, 1, n)
    return X.permute(3, 0, 1, 2)  # (l, b, g, n)


def _per_group(t, X, d):
    """Split the d channels of ``t`` (l, b, d, ...) into (G, d/G) matching ``_groups(X)``."""
    G = d if X.ndim == 2 else X.shape[1] if X.ndim == 4 else 1
    return t.unflatten(2, (G, d // G))  # (l, b, G, d/G, ...)
