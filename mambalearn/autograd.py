"""Chunked recomputation: a backward pass that stores one state per chunk, not one per step.

The recurrence h_t = a_t ⊙ h_{t−1} + b_t (t = 0 … l−1, h_{−1} = h₀) has, for a loss ℒ with
g_t = ∂ℒ/∂h_t given (the direct gradient), the total gradient of each state

    dh_t = g_t + a_{t+1} ⊙ dh_{t+1},   dh_{l−1} = g_{l−1}      (a reverse scan, gate shifted by one)
    ∂ℒ/∂b_t = dh_t,   ∂ℒ/∂a_t = dh_t ⊙ h_{t−1},   ∂ℒ/∂h₀ = a_0 ⊙ dh_0.

It needs every h_{t−1}: autograd keeps them all, b·d·l·n numbers. Instead, the forward keeps only
the state entering each chunk of q steps (c = ⌈l/q⌉ of them); the backward walks the chunks from
last to first, recomputes the q states of one chunk from its boundary state, runs the reverse scan
there and hands a_{kq} ⊙ dh_{kq} (the gradient of the boundary state) to the chunk before. With
l = 12, q = 4 the forward stores H₀, H₁, H₂ (= h_{−1}, h_3, h_7) and the backward of the middle
chunk reloads h_3 and recomputes h_4 … h_7. Saved memory: O(b·d·l) inputs + O(b·d·n·l/q).

Through the selective scan's discretization a_t = exp(Δ_t A), b_t = Δ_t B_t x_t, y_t = C_t h_t:

    ∂ℒ/∂C_t = Σ_d dy_t h_t          ∂ℒ/∂A = Σ_{b,t} (∂ℒ/∂a_t ⊙ a_t) Δ_t
    ∂ℒ/∂Δ_t = Σ_n (∂ℒ/∂a_t ⊙ a_t ⊙ A + ∂ℒ/∂b_t ⊙ B_t x_t)
    ∂ℒ/∂B_t = Σ_d ∂ℒ/∂b_t Δ_t x_t   ∂ℒ/∂x_t = Σ_n ∂ℒ/∂b_t ⊙ Δ_t B_t  (+ D dy_t from the skip)

    scan_backward             the three gradient formulas above, for one (chunk of a) scan
    ChunkedScanFn             autograd.Function for h = scan(a, b) with chunked recomputation
    selective_scan_recompute  the selective scan (selective_scan_sequential's signature) that
                              never holds a (b, d, l, n) tensor: O(b·d·l) + O(b·d·n·l/q) memory
    selective_scan_checkpointed  the baseline: torch.utils.checkpoint around each chunk
    saved_tensor_bytes        what autograd keeps for the backward, measured on any device
"""

import contextlib

import torch
import torch.nn.functional as F

from mambalearn.scan.chunked import check_scan_inputs, chunked_scan
from mambalearn.utils import check_chunk_size


def _scan_states(a, b, h0):
    """h_t = a_t h_{t−1} + b_t from h_{−1} = h0, into one preallocated buffer.  (..., q, n)"""
    h = torch.empty_like(b)
    for t in range(a.shape[-2]):
        h0 = a[..., t, :] * h0 + b[..., t, :]  # (..., n)
        h[..., t, :] = h0
    return h


def scan_backward(a, h, grad_h, initial_state=None):
    """dh_t = g_t + a_{t+1} dh_{t+1}; ∂b_t = dh_t; ∂a_t = dh_t h_{t−1}  (h_t = a_t h_{t−1} + b_t).

    Shapes:
        a:              (..., l, n)   the gates of the forward scan
        h:              (..., l, n)   the states it produced, h_0 … h_{l−1}
        grad_h:         (..., l, n)   g_t = ∂ℒ/∂h_t, the *direct* gradient of each state
        initial_state:  (..., n)      h_{−1} (zeros if None)
        returns (grad_a, grad_b), both (..., l, n). The gradient of ``initial_state`` is then
        a_0 ⊙ grad_b_0 = ``a[..., 0, :] * grad_b[..., 0, :]``.

    The reverse scan runs the forward scan's recurrence backwards in time with the gate moved one
    step: dh_t is fed by dh_{t+1} through a_{t+1}, the gate that multiplied h_t in the forward.
    """
    check_scan_inputs(a, h, initial_state)
    if grad_h.shape != a.shape:
        raise ValueError(f"grad_h must have a's shape {tuple(a.shape)}, got {tuple(grad_h.shape)}")
    dh = torch.empty_like(grad_h)
    acc = grad_h[..., -1, :]  # dh_{l−1} = g_{l−1}: nothing comes after the last state
    dh[..., -1, :] = acc
    for t in range(a.shape[-2] - 2, -1, -1):
        acc = a[..., t + 1, :] * acc + grad_h[..., t, :]  # (..., n)  gate a_{t+1}, not a_t
        dh[..., t, :] = acc
    grad_a = dh.clone()  # ∂a_t = dh_t · h_{t−1}, in place: no shifted copy of h
    grad_a[..., 1:, :] *= h[..., :-1, :]
    if initial_state is None:
        grad_a[..., 0, :] = 0.0
    else:
        grad_a[..., 0, :] *= initial_state
    return grad_a, dh  # (grad_a, grad_b): (..., l, n) each


class ChunkedScanFn(torch.autograd.Function):
    """h = scan(a, b) with h_t = a_t h_{t−1} + b_t; saves a, b and the c = ⌈l/q⌉ chunk-entry states.

    ``ChunkedScanFn.apply(a, b, chunk_size, initial_state)`` (``initial_state`` may be None).

    Shapes: a, b (..., l, n); initial_state (..., n); returns h (..., l, n).
    Saved for the backward: a, b (the inputs) and H (..., c, n), H_k = h_{kq−1} (H_0 = h_{−1}).
    The backward recomputes one chunk's states at a time from H_k (chunk k: steps kq … kq+q−1).
    """

    @staticmethod
    def forward(ctx, a, b, chunk_size, initial_state=None):
        check_scan_inputs(a, b, initial_state)
        l, q = a.shape[-2], chunk_size
        h = chunked_scan(a, b, q, initial_state)  # (..., l, n)
        H0 = (torch.zeros_like(h[..., :1, :]) if initial_state is None
              else initial_state[..., None, :])  # (..., 1, n)
        # cat makes a copy: saving a slice of h would keep all of h's memory alive
        H = torch.cat([H0, h[..., q - 1:l - 1:q, :]], dim=-2)  # (..., c, n)
        ctx.save_for_backward(a, b, H)
        ctx.chunk_size, ctx.has_initial = q, initial_state is not None
        return h

    @staticmethod
    def backward(ctx, grad_h):
        a, b, H = ctx.saved_tensors
        l, q = a.shape[-2], ctx.chunk_size
        grad_a, grad_b = torch.empty_like(a), torch.empty_like(b)
        carry = torch.zeros_like(H[..., 0, :])  # ∂ℒ/∂(state leaving chunk k), from later chunks
        for k in reversed(range(H.shape[-2])):
            s = slice(k * q, min(k * q + q, l))
            a_k, H_k = a[..., s, :], H[..., k, :]
            h_k = _scan_states(a_k, b[..., s, :], H_k)  # recomputed: (..., q, n)
            g = grad_h[..., s, :].clone()
            g[..., -1, :] += carry  # the last state of the chunk also feeds the next chunk
            grad_a[..., s, :], grad_b[..., s, :] = scan_backward(a_k, h_k, g, H_k)
            carry = a_k[..., 0, :] * grad_b[..., s.start, :]  # ∂ℒ/∂H_k
        return grad_a, grad_b, None, carry if ctx.has_initial else None


def _bc_layout(X):
    """B or C as (b|1, g, n, l|1), a view: (d, n) → (1, d, n, 1); (b, n, l) → (b, 1, n, l)."""
    if X.ndim == 2:
        return X[None, :, :, None]
    return X[:, None] if X.ndim == 3 else X


def _bc_chunk(X, s, d):
    """Steps ``s`` of a (b|1, g, n, l|1) B or C, per channel: (b|1, d|1, q|1, n).

    g = 1 or g = d broadcast as they are (a view); 1 < g < d copies one chunk's worth.
    """
    X = X[..., s] if X.shape[-1] > 1 else X
    if 1 < X.shape[1] < d:
        X = X.repeat_interleave(d // X.shape[1], dim=1)  # (b|1, d, n, q|1)
    return X.transpose(-1, -2)  # (b|1, d|1, q|1, n)


def _reduce_bc(grad, X):
    """Sum a (b, d, q, n) gradient down to the chunk of X's (b|1, g, n, q|1) layout."""
    b, d, q, n = grad.shape
    g = X.shape[1]
    grad = grad.reshape(b, g, d // g, q, n).sum(2).transpose(-1, -2)  # (b, g, n, q)
    if X.shape[0] == 1:
        grad = grad.sum(0, keepdim=True)
    return grad.sum(-1, keepdim=True) if X.shape[-1] == 1 else grad


class _SelectiveScanRecompute(torch.autograd.Function):
    """The selective scan with D, z, delta_bias, softplus, mask inside, recomputed chunk by chunk.

    Saves only its inputs and H (b, d, c, n); holds at most a few (b, d, q, n) tensors at a time.
    """

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, mask, h0, softplus, q):
        b, d, l = u.shape
        out = torch.empty_like(u)
        H = torch.empty(b, d, -(-l // q), A.shape[1], dtype=u.dtype, device=u.device)
        h = torch.zeros_like(H[:, :, 0]) if h0 is None else h0  # (b, d, n)
        for k in range(H.shape[2]):
            s = slice(k * q, min(k * q + q, l))
            H[:, :, k] = h
            x = _chunk_inputs(u, delta, A, B, delta_bias, mask, softplus, s)
            h_k = _scan_states(x["A_bar"], x["Bx"], h)  # (b, d, q, n)
            h = h_k[:, :, -1]
            y = torch.einsum("bdqn,bdqn->bdq", h_k, _bc_chunk(C, s, d).expand_as(h_k))
            out[..., s] = _chunk_output(y, u[..., s], D, z, mask, s)
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, mask, H)
        ctx.softplus, ctx.q, ctx.has_h0 = softplus, q, h0 is not None
        return out, h

    @staticmethod
    def backward(ctx, grad_out, grad_last):
        u, delta, A, B, C, D, z, delta_bias, mask, H = ctx.saved_tensors
        b, d, l = u.shape
        q = ctx.q
        g = {k: torch.zeros_like(v) for k, v in dict(u=u, delta=delta, A=A, B=B, C=C).items()}
        g.update({k: torch.zeros_like(v) for k, v in dict(D=D, z=z, bias=delta_bias).items()
                  if v is not None})
        carry = grad_last.clone()  # ∂ℒ/∂(state leaving the chunk), from later chunks
        for k in reversed(range(H.shape[2])):
            s = slice(k * q, min(k * q + q, l))
            x = _chunk_inputs(u, delta, A, B, delta_bias, mask, softplus=ctx.softplus, s=s)
            h_k = _scan_states(x["A_bar"], x.pop("Bx"), H[:, :, k])  # recomputed (b, d, q, n)
            C_k = _bc_chunk(C, s, d)  # (b|1, d, q|1, n)
            y = torch.einsum("bdqn,bdqn->bdq", h_k, C_k.expand_as(h_k))
            dy = _chunk_output_backward(grad_out[..., s], y, u[..., s], D, z, mask, s, g)
            g["C"][..., s if C.shape[-1] > 1 else slice(None)] += _reduce_bc(dy[..., None] * h_k, C)
            grad_h = dy[..., None] * C_k  # (b, d, q, n), a fresh tensor
            grad_h[:, :, -1] += carry  # the chunk's last state also feeds the next chunk
            grad_a, grad_b = scan_backward(x["A_bar"], h_k, grad_h, H[:, :, k])
            del h_k, grad_h
            carry = x["A_bar"][:, :, 0] * grad_b[:, :, 0]
            _discretization_backward(grad_a, grad_b, x, u[..., s], A, B, delta, delta_bias, mask,
                                     ctx.softplus, s, g)
        return (g["u"], g["delta"], g["A"], g["B"], g["C"], g.get("D"), g.get("z"), g.get("bias"),
                None, carry if ctx.has_h0 else None, None, None)


def _chunk_inputs(u, delta, A, B, delta_bias, mask, softplus, s):
    """Δ, Ā = exp(ΔA) and B̄x = ΔBx for steps ``s`` only: (b, d, q) and (b, d, q, n) tensors."""
    d = u.shape[1]
    pre = delta[..., s] if delta_bias is None else delta[..., s] + delta_bias[:, None]  # (b, d, q)
    dt = F.softplus(pre) if softplus else pre
    if mask is not None:
        dt = dt.masked_fill(~mask[:, None, s], 0.0)  # Δ = 0: the state is kept
    A_bar = torch.exp(dt[..., None] * A[:, None, :])  # (b, d, q, n)
    B_k = _bc_chunk(B, s, d)  # (b|1, d, q|1, n)
    Bx = (dt * u[..., s])[..., None] * B_k  # (b, d, q, n)
    return dict(pre=pre, dt=dt, A_bar=A_bar, Bx=Bx, B_k=B_k)


def _chunk_output(y, u, D, z, mask, s):
    """out = (y + D x) · silu(z), zero at masked steps.  (b, d, q)"""
    out = y if D is None else y + D[:, None] * u
    if z is not None:
        out = out * F.silu(z[..., s])
    return out if mask is None else out.masked_fill(~mask[:, None, s], 0.0)


def _chunk_output_backward(grad_out, y, u, D, z, mask, s, g):
    """Backward of :func:`_chunk_output`: fills ∂D, ∂z and the skip part of ∂x; returns ∂y."""
    if mask is not None:
        grad_out = grad_out.masked_fill(~mask[:, None, s], 0.0)
    pre = y if D is None else y + D[:, None] * u  # y + D x
    if z is not None:
        sig = torch.sigmoid(z[..., s])
        g["z"][..., s] = grad_out * pre * sig * (1 + z[..., s] * (1 - sig))  # silu′(z)
        grad_out = grad_out * z[..., s] * sig  # ∂ℒ/∂(y + D x)
    if D is not None:
        g["D"] += (grad_out * u).sum((0, 2))
        g["u"][..., s] += grad_out * D[:, None]
    return grad_out


def _discretization_backward(grad_a, grad_b, x, u, A, B, delta, delta_bias, mask, softplus, s, g):
    """From ∂ℒ/∂Ā, ∂ℒ/∂(B̄x) of one chunk to ∂x, ∂Δ, ∂A, ∂B (and ∂delta_bias) through Ā = exp(ΔA)."""
    dt, B_k = x["dt"], x["B_k"]
    grad_logA = grad_a * x["A_bar"]  # ∂ℒ/∂(ΔA): (b, d, q, n)
    g["A"] += torch.einsum("bdqn,bdq->dn", grad_logA, dt)
    grad_Bk = grad_b * B_k  # ∂ℒ/∂(Δx) per state: (b, d, q, n)
    grad_dt = (grad_logA * A[:, None, :]).sum(-1) + (grad_Bk.sum(-1) * u)  # (b, d, q)
    g["u"][..., s] += grad_Bk.sum(-1) * dt
    grad_B = _reduce_bc(grad_b * (dt * u)[..., None], B)  # (b|1, g, n, q|1)
    g["B"][..., s if B.shape[-1] > 1 else slice(None)] += grad_B
    if mask is not None:
        grad_dt = grad_dt.masked_fill(~mask[:, None, s], 0.0)
    if softplus:
        grad_dt = grad_dt * torch.sigmoid(x["pre"])  # softplus′ = sigmoid
    g["delta"][..., s] = grad_dt
    if delta_bias is not None:
        g["bias"] += grad_dt.sum((0, 2))


def selective_scan_recompute(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                             delta_softplus=False, return_last_state=False, mask=None,
                             initial_state=None, chunk_size=32):
    """h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t, y = C h + D x, out = y·silu(z); recomputed by chunks.

    Shapes: those of :func:`mambalearn.scan.sequential.selective_scan_sequential` (u, delta, z
    (b, d, l); A (d, n); B, C (b, n, l), (b, g, n, l) or (d, n); D, delta_bias (d,); mask (b, l)
    bool; initial_state (b, d, n)), plus ``chunk_size`` q. Returns out (b, d, l) in u's dtype, or
    (out, last_state (b, d, n)).

    Never holds a (b, d, l, n) tensor: the forward keeps the inputs and one (b, d, n) state per
    chunk; the backward recomputes Ā, B̄x and h for one chunk at a time. Peak memory is
    O(b·d·l) + O(b·d·n·(l/q + q)): smallest near q ≈ √(l/10) (the working set is ~10 chunk
    tensors). Same idea as mamba_ssm's CUDA ``selective_scan_fn``, whose backward recomputes the
    states from chunk states.
    """
    from mambalearn.scan.sequential import check_inputs, compute_dtype

    check_inputs(u, delta, A, B, C, D, z, delta_bias, mask, initial_state)
    chunk_size = check_chunk_size(chunk_size)
    dtype = compute_dtype(u, delta, A, B, C)
    cast = lambda t: None if t is None else t.to(dtype)
    out, last = _SelectiveScanRecompute.apply(
        cast(u), cast(delta), cast(A), _bc_layout(cast(B)), _bc_layout(cast(C)), cast(D), cast(z),
        cast(delta_bias), mask, cast(initial_state), bool(delta_softplus), chunk_size)
    out = out.to(u.dtype)
    return (out, last) if return_last_state else out


def selective_scan_checkpointed(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                                delta_softplus=False, return_last_state=False, mask=None,
                                initial_state=None, chunk_size=32):
    """The baseline: :func:`selective_scan_chunked` on each chunk under ``torch.utils.checkpoint``.

    Same arguments as :func:`selective_scan_recompute`. ``checkpoint`` keeps each chunk's inputs
    (views of u, delta, …) and its entry state; the backward re-runs one chunk's forward *with*
    autograd, which stores every intermediate of that chunk — the same asymptotics as the
    hand-written backward, with a larger constant.
    """
    from torch.utils.checkpoint import checkpoint

    from mambalearn.scan.chunked import selective_scan_chunked
    from mambalearn.scan.sequential import check_inputs

    b, d, l, n = check_inputs(u, delta, A, B, C, D, z, delta_bias, mask, initial_state)
    step = lambda X, s: X[..., s] if X is not None and X.ndim >= 3 else X
    h, outs = initial_state, []
    for k in range(-(-l // chunk_size)):
        s = slice(k * chunk_size, min(k * chunk_size + chunk_size, l))
        out_k, h = checkpoint(
            selective_scan_chunked, u[..., s], delta[..., s], A, step(B, s), step(C, s), D,
            step(z, s), delta_bias, delta_softplus, True, None if mask is None else mask[:, s], h,
            chunk_size, use_reentrant=False)
        outs.append(out_k)
    out = torch.cat(outs, dim=-1)  # (b, d, l)
    return (out, h) if return_last_state else out


@contextlib.contextmanager
def saved_tensor_bytes(exclude=()):
    """Count the bytes autograd saves for the backward inside the ``with`` block.

    Yields a dict whose ``"bytes"`` grows as tensors are saved; each storage counts once, whole
    (a saved slice keeps its whole storage alive), and storages of the tensors in ``exclude``
    (the inputs) are not counted. Uses ``torch.autograd.graph.saved_tensors_hooks``, which also
    sees ``ctx.save_for_backward`` of custom Functions.

    >>> with saved_tensor_bytes(exclude=[a, b]) as saved:  # doctest: +SKIP
    ...     h = ChunkedScanFn.apply(a, b, 4, None)
    >>> saved["bytes"]  # doctest: +SKIP
    """
    seen = {t.untyped_storage().data_ptr() for t in exclude if t is not None}
    result = {"bytes": 0, "tensors": 0}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            result["bytes"] += storage.nbytes()
            result["tensors"] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield result
