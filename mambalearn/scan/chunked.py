"""The chunked scan: scan short chunks in parallel, then carry one state from chunk to chunk.

Split the l steps of h_t = a_t h_{t−1} + b_t into c = ⌈l/q⌉ chunks of q steps. Inside chunk k
(steps kq … kq+q−1) run the scan from a zero state, for every chunk at once; that gives the local
states h̃ and, with the cumulative gate products P, each chunk's *summary* (⊗ of its steps):

    P_{kq+j} = a_{kq+j} ⋯ a_{kq}                  (product of gates since the chunk began)
    h̃_{kq+j} = Σ_{i≤j} (a_{kq+j} ⋯ a_{kq+i+1}) b_{kq+i}      (the chunk's own inputs only)
    summary_k = (P_{kq+q−1}, h̃_{kq+q−1})

The state entering chunk k+1 follows from the one entering chunk k by one affine step,

    H_{k+1} = P_{kq+q−1} · H_k + h̃_{kq+q−1}      i.e. (·, H_{k+1}) = (·, H_k) ⊗ summary_k

(c steps, sequential here, or a scan of the summaries), and the *fix-up* adds each chunk's carry:

    h_{kq+j} = P_{kq+j} · H_k + h̃_{kq+j}.

Work O(l), and only q + c steps depend on each other (minimal near q ≈ √l): that is the chunk-size
trade-off of chapter 06. The same skeleton — local scans, summaries, state passing, fix-up — is
Mamba-2's chunked SSD and the block structure of the Triton kernels.

Layout: time is the second-to-last dimension, the state the last, as mamba_ssm's naive scan lays
out Ā and B̄x: ``(b, d, l, n)``; any leading dimensions work.

    scan_reference          the loop h_t = a_t h_{t−1} + b_t (the oracle)
    chunked_scan            the chunked scan above
    selective_scan_chunked  the whole selective scan on top of it (materializes (b, d, l, n))
"""

import torch

from mambalearn import ops
from mambalearn.utils import check_chunk_size, check_same_device, check_tensor


def check_scan_inputs(a, b, initial_state):
    """Raise unless a, b are (..., l, n) steps of one shape (l ≥ 1) and initial_state (..., n)."""
    check_tensor("a", a)
    check_tensor("b", b)
    if a.ndim < 2:
        raise ValueError(f"a must have shape (..., l, n) with at least 2 dimensions, got "
                         f"{tuple(a.shape)}")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape (..., l, n), got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    if a.shape[-2] == 0:
        raise ValueError("a has sequence length l = 0 (dim -2); the scan needs at least one step")
    if initial_state is not None:
        check_tensor("initial_state", initial_state,
                     shape=tuple(a.shape[:-2]) + (a.shape[-1],))
    check_same_device(a=a, b=b, initial_state=initial_state)


def scan_reference(a, b, initial_state=None, return_final_state=False):
    """h_t = a_t ⊙ h_{t−1} + b_t with h_{−1} = ``initial_state`` (zeros if None): a loop over l.

    Shapes:
        a, b:           (..., l, n)   gates and inputs; time is dim −2 (e.g. (b, d, l, n))
        initial_state:  (..., n)
        returns h (..., l, n), or (h, h_{l−1}) if ``return_final_state``.

    The slow, obvious oracle of :func:`chunked_scan` and of the chapter 07 backward.
    """
    check_scan_inputs(a, b, initial_state)
    h = torch.zeros_like(b[..., 0, :]) if initial_state is None else initial_state
    hs = []
    for t in range(a.shape[-2]):
        h = a[..., t, :] * h + b[..., t, :]  # (..., n)
        hs.append(h)
    h_all = torch.stack(hs, dim=-2)  # (..., l, n)
    return (h_all, h) if return_final_state else h_all


def _local_scan(a, b):
    """Inclusive scan along dim −2 from a zero state, with ⊗: returns (P, h̃), both (..., q, n).

    A loop over the q steps of a chunk, each step vectorized over every chunk (and b, d, n).
    """
    acc = (a[..., 0, :], b[..., 0, :])
    Ps, hs = [acc[0]], [acc[1]]
    for j in range(1, a.shape[-2]):
        acc = ops.combine(acc, (a[..., j, :], b[..., j, :]))  # earlier ⊗ later
        Ps.append(acc[0])
        hs.append(acc[1])
    return torch.stack(Ps, dim=-2), torch.stack(hs, dim=-2)  # (..., q, n) each


def chunked_scan(a, b, chunk_size, initial_state=None, return_final_state=False):
    """h_t = a_t ⊙ h_{t−1} + b_t by chunks: H_k = P_{kq−1} H_{k−1} + h̃_{kq−1}, h = P·H + h̃.

    Shapes:
        a, b:           (..., l, n)   time is dim −2 (the (b, d, l, n) layout of Ā and B̄x)
        chunk_size:     q ≥ 1; need not divide l (the last chunk is padded with identity steps
                        (a, b) = (1, 0), which leave the state unchanged)
        initial_state:  (..., n), h_{−1}; zeros if None
        returns h (..., l, n), or (h, h_{l−1}) if ``return_final_state``.

    Equals :func:`scan_reference` up to rounding. Mamba-2's ``_chunk_scan``/``_state_passing``
    (mamba_ssm.ops.triton.ssd_*) have the same four steps.
    """
    check_scan_inputs(a, b, initial_state)
    chunk_size = check_chunk_size(chunk_size)
    *batch, l, n = a.shape
    q = min(chunk_size, l)
    c = -(-l // q)  # number of chunks, ⌈l / q⌉
    pad = c * q - l
    if pad:  # identity steps (1, 0) at the end: they do not change the state
        a = torch.cat([a, a.new_ones(*batch, pad, n)], dim=-2)  # (..., c·q, n)
        b = torch.cat([b, b.new_zeros(*batch, pad, n)], dim=-2)
    a = a.reshape(*batch, c, q, n)  # (..., c, q, n)
    b = b.reshape(*batch, c, q, n)
    # 1. local scans, every chunk at once, from a zero state
    P, h_local = _local_scan(a, b)  # (..., c, q, n) each
    # 2. chunk summaries: the ⊗ of all q steps of each chunk
    summaries = (P[..., -1, :], h_local[..., -1, :])  # (..., c, n) each
    # 3. state passing: H_k, the state entering chunk k, by ⊗ of the summaries (c sequential steps)
    H = torch.zeros_like(b[..., 0, 0, :]) if initial_state is None else initial_state  # (..., n)
    carries = []
    for k in range(c):
        carries.append(H)
        H = ops.apply((summaries[0][..., k, :], summaries[1][..., k, :]), H)  # (..., n)
    H_in = torch.stack(carries, dim=-2)  # (..., c, n)
    # 4. fix-up: every state gets its chunk's carry, decayed by the gates since the chunk began
    h = P * H_in[..., None, :] + h_local  # (..., c, q, n)
    h = h.reshape(*batch, c * q, n)[..., :l, :]  # (..., l, n)
    return (h, H) if return_final_state else h


def selective_inputs(u, delta, A, B, delta_bias=None, delta_softplus=False, mask=None):
    """Ā = exp(Δ A) and B̄x = Δ B x at every step, materialized: the two (b, d, l, n) tensors.

    Δ = softplus(delta + delta_bias) (softplus if asked); at masked steps Δ = 0, so Ā = 1, B̄x = 0
    and the state is kept. Returns (A_bar, Bx, delta) with delta the effective Δ (b, d, l).
    """
    from mambalearn.scan.sequential import as_bdnl, compute_dtype, effective_delta

    dtype = compute_dtype(u, delta, A, B)
    b, d, l = u.shape
    delta = effective_delta(delta, delta_bias, delta_softplus, dtype)  # (b, d, l)
    if mask is not None:
        delta = delta.masked_fill(~mask[:, None, :], 0.0)
    A_bar = torch.exp(delta[..., None] * A.to(dtype)[:, None, :])  # (b, d, l, n)
    B = as_bdnl(B, d, dtype).transpose(-1, -2)  # (b|1, d|1, l|1, n)
    Bx = delta[..., None] * B * u.to(dtype)[..., None]  # (b, d, l, n)
    return A_bar, Bx, delta


def selective_scan_chunked(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                           delta_softplus=False, return_last_state=False, mask=None,
                           initial_state=None, chunk_size=64):
    """h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t, y = C h + D x, out = y·silu(z), by chunked_scan.

    Shapes: those of :func:`mambalearn.scan.sequential.selective_scan_sequential` (u, delta, z
    (b, d, l); A (d, n); B, C (b, n, l), (b, g, n, l) or (d, n); D, delta_bias (d,); mask (b, l);
    initial_state (b, d, n)), plus ``chunk_size`` q.

    This is the "store everything" PyTorch path: Ā, B̄x and all states h are (b, d, l, n) tensors
    in device memory, and autograd keeps them for the backward. Chapter 07 removes them.
    """
    from mambalearn.scan.sequential import as_bdnl, check_inputs, finish

    b, d, l, n = check_inputs(u, delta, A, B, C, D, z, delta_bias, mask, initial_state)
    A_bar, Bx, _ = selective_inputs(u, delta, A, B, delta_bias, delta_softplus, mask)
    h0 = None if initial_state is None else initial_state.to(A_bar.dtype)
    h, last = chunked_scan(A_bar, Bx, chunk_size, h0, return_final_state=True)  # (b, d, l, n)
    C = as_bdnl(C, d, A_bar.dtype)  # (b|1, d|1, n, l|1)
    y = torch.einsum("bdln,bdnl->bdl", h, C.expand(b, d, n, l))  # C_t h_t: (b, d, l)
    out = finish(y, u, D, z, mask, u.dtype)
    return (out, last) if return_last_state else out
