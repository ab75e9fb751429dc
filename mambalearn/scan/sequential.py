"""The selective scan as a plain loop over time: the oracle that every faster scan is compared with.

    Δ_t  = softplus(delta_t + delta_bias)            (each step picks its own step size)
    Ā_t  = exp(Δ_t A)                                 (zero-order hold, diagonal A)
    B̄_t x_t = Δ_t B_t x_t                             (Mamba's simplified B̄ = ΔB)
    h_t  = Ā_t h_{t−1} + B̄_t x_t,   h_{−1} = 0       (per channel i and state j: no cross terms)
    y_t  = C_t h_t + D x_t,          out = y · silu(z)

Arguments, layouts and semantics are those of ``mamba_ssm.ops.selective_scan_interface.
selective_scan_ref`` (real A only), plus two additions: ``mask`` for padded batches and
``initial_state``. The loop is deliberately the obvious one; chapter 04 makes it parallel.
"""

import torch
import torch.nn.functional as F

from mambalearn.scan.layout import is_matrix, time_first
from mambalearn.utils import check_same_device, check_tensor


def compute_dtype(*tensors):
    """float64 if any given tensor is float64, else float32 (the oracle never computes in bf16)."""
    wide = any(t is not None and t.dtype == torch.float64 for t in tensors)
    return torch.float64 if wide else torch.float32


def check_inputs(u, delta, A, B, C, D=None, z=None, delta_bias=None, mask=None,
                 initial_state=None, allow_empty=False):
    """Raise a clear TypeError/ValueError unless the arguments have selective_scan_ref's layouts.

    Returns ``(b, d, l, n)``. ``allow_empty``: l = 0 is valid (the kernels return an empty
    output); the loops of the course need at least one step.
    """
    check_tensor("u", u, ndim=3)
    b, d, l = u.shape
    if l == 0 and not allow_empty:
        raise ValueError("u has sequence length l = 0; the scan needs at least one step")
    check_tensor("delta", delta, shape=(b, d, l))
    if isinstance(A, torch.Tensor) and A.is_complex():
        raise TypeError("complex A is not supported: this course covers real A (Mamba-1/-2) only")
    check_tensor("A", A, shape=(d, None))
    n = A.shape[1]
    for name, X in (("B", B), ("C", C)):
        check_tensor(name, X, ndim=(2, 3, 4))
        if X.ndim == 2:
            check_tensor(name, X, shape=(d, n))  # fixed (time-invariant) projection
        elif X.ndim == 3:
            check_tensor(name, X, shape=(b, n, l))  # input-dependent, shared by all channels
        else:
            check_tensor(name, X, shape=(b, None, n, l))  # grouped: (b, g, n, l)
            if X.shape[1] == 0 or d % X.shape[1]:
                raise ValueError(f"{name} has g = {X.shape[1]} groups, which must divide d = {d}")
    if D is not None:
        check_tensor("D", D, shape=(d,))
    if delta_bias is not None:
        check_tensor("delta_bias", delta_bias, shape=(d,))
    if z is not None:
        check_tensor("z", z, shape=(b, d, l))
    if initial_state is not None:
        check_tensor("initial_state", initial_state, shape=(b, d, n))
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor (True = real step), got "
                            f"{getattr(mask, 'dtype', type(mask).__name__)}; use mask.bool()")
        if tuple(mask.shape) != (b, l):
            raise ValueError(f"mask must have shape (b, l) = {(b, l)}, got {tuple(mask.shape)}")
    check_same_device(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=delta_bias,
                      mask=mask, initial_state=initial_state)
    return b, d, l, n


def as_bdnl(X, d, dtype):
    """B or C as a tensor that broadcasts to (b, d, n, l), whichever of the three layouts it has.

    (d, n) fixed → (1, d, n, 1); (b, n, l) → (b, 1, n, l); (b, g, n, l) → (b, d, n, l), where
    channel i reads group i // (d // g) (mamba_ssm's ``repeat(B, "b g n l -> b (g h) n l")``).
    """
    X = X.to(dtype)
    if X.ndim == 2:
        return X[None, :, :, None]  # (1, d, n, 1)
    if X.ndim == 3:
        return X[:, None]  # (b, 1, n, l)
    return X.repeat_interleave(d // X.shape[1], dim=1)  # (b, d, n, l)


def effective_delta(delta, delta_bias, delta_softplus, dtype):
    """Δ = softplus(delta + delta_bias) (softplus only if asked), in ``dtype``.  (b, d, l)"""
    delta = delta.to(dtype)
    if delta_bias is not None:
        delta = delta + delta_bias.to(dtype)[:, None]
    return F.softplus(delta) if delta_softplus else delta


def finish(y, u, D, z, mask, dtype):
    """out = (y + D·u) · silu(z), zero at masked steps, cast to ``u``'s dtype.  (b, d, l)"""
    out = y if D is None else y + D.to(y.dtype)[:, None] * u.to(y.dtype)
    if z is not None:
        out = out * F.silu(z.to(y.dtype))
    if mask is not None:
        out = out.masked_fill(~mask[:, None, :], 0.0)
    return out.to(dtype)


def selective_scan_sequential(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                              delta_softplus=False, return_last_state=False, mask=None,
                              initial_state=None):
    """h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t,  y_t = C_t h_t + D x_t,  out = y·silu(z), by a loop.

    Shapes:
        u, delta, z:       (b, d, l)
        A:                 (d, n) real (complex A raises TypeError)
        B, C:              (b, n, l) input-dependent, (b, g, n, l) grouped (g divides d; channel i
                           uses group i // (d // g)), or (d, n) fixed
        D, delta_bias:     (d,)
        mask:              (b, l) bool, True = a real step. At a masked step (False) the state
                           is kept, h_t = h_{t−1} (neither decayed nor fed), and out[:, :, t] = 0.
                           This is exactly Δ_t = 0: exp(0·A) = 1 and 0·B_t x_t = 0.
        initial_state:     (b, d, n), h_{−1}; zeros if None
        returns out (b, d, l) in u's dtype, or (out, last_state (b, d, n)) if return_last_state;
        last_state = h_{l−1} stays in the compute dtype, as in mamba_ssm.

    Everything is computed in float32, or float64 if any of u, delta, A, B, C is float64.

    Matches ``mamba_ssm.ops.selective_scan_interface.selective_scan_ref`` (real A).
    """
    b, d, l, n = check_inputs(u, delta, A, B, C, D, z, delta_bias, mask, initial_state)
    dtype = compute_dtype(u, delta, A, B, C)
    delta = effective_delta(delta, delta_bias, delta_softplus, dtype)  # (b, d, l)
    x, A = u.to(dtype), A.to(dtype)
    B = as_bdnl(B, d, dtype).expand(b, d, n, l)  # a view: nothing is copied
    C = as_bdnl(C, d, dtype).expand(b, d, n, l)
    h = u.new_zeros((b, d, n), dtype=dtype) if initial_state is None else initial_state.to(dtype)
    ys = []
    for t in range(l):
        A_bar = torch.exp(delta[:, :, t, None] * A)  # (b, d, n)
        Bx = delta[:, :, t, None] * B[..., t] * x[:, :, t, None]  # B̄_t x_t: (b, d, n)
        h_new = A_bar * h + Bx  # (b, d, n)
        h = h_new if mask is None else torch.where(mask[:, t, None, None], h_new, h)
        ys.append((C[..., t] * h).sum(-1))  # C_t h_t: (b, d)
    y = torch.stack(ys, dim=-1)  # (b, d, l)
    out = finish(y, x, D, z, mask, u.dtype)
    return (out, h) if return_last_state else out


def linear_scan_sequential(a, b, dim=-1, reverse=False):
    """h_t = a_t h_{t−1} + b_t (h_{−1} = 0), one step at a time: the oracle of the parallel scans.

    Shapes: as ``hillis_steele_scan``: ``a`` broadcastable to ``b`` (diagonal) or ``(..., n, n)``
    matrices for ``b (..., n)``; ``dim`` is b's time axis. Returns every h_t, shaped like ``b``.
    ``reverse=True`` runs time backwards: h_t = a_t h_{t+1} + b_t, h_l = 0.
    """
    matrix = is_matrix(a, b)
    a, b, restore = time_first(a, b, dim, reverse)  # (l, ...)
    h = torch.zeros_like(b[0], dtype=torch.promote_types(a.dtype, b.dtype))
    hs = []
    for t in range(b.shape[0]):
        # a_t h + b_t: elementwise (diagonal a) or a matrix-vector product (full a)
        h = (a[t] @ h[..., None])[..., 0] + b[t] if matrix else a[t] * h + b[t]
        hs.append(h)
    return restore(torch.stack(hs))
