"""Mamba-2's state space duality (SSD): one recurrence, three ways to compute it (chapter 10).

Mamba-2 makes A a *scalar per head*, so the decay of head h at step t is one number
a_t = exp(Δ_t A_h) shared by all p·n state entries. The recurrence (per batch b and head h)

    h_t = a_t h_{t−1} + Δ_t x_t B_tᵀ          h_t: (p, n)
    y_t = h_t C_t                              y_t: (p,)

unrolls to y_t = Σ_{s≤t} (C_t·B_s) exp(Σ_{k=s+1..t} Δ_k A) Δ_s x_s, i.e. the *quadratic form*

    y = (L ∘ C Bᵀ) (Δ x),    L_ts = exp(segsum(ΔA)_ts) for t ≥ s, 0 above the diagonal,

a masked "attention" whose mask L is a 1-semiseparable decay matrix. The chunked algorithm
(``ssd_chunked``) splits L into q×q diagonal blocks (computed quadratically, on matrix units) and
low-rank off-diagonal blocks (carried by a short scan over chunk states).

Layouts are ``mamba_ssm``'s: x (b, l, h, p), dt (b, l, h), A (h,), B/C (b, l, g, n); head h reads
group h // (h_total / g). Glossary: see ``mambalearn/__init__.py``.

    segsum               stable segment sums, the exponent of L
    ssd_quadratic        y = (L ∘ C Bᵀ)(Δx), O(l²)
    ssd_sequential       the scan of chapter 02 specialised to scalar A, O(l)
    ssd_chunked          the four-step chunked algorithm (the oracle of the Triton kernels)
    mamba_chunk_scan_ref mamba_chunk_scan_combined's full signature (D, z, dt_bias, softplus,
                         initial_states, seq_idx, final states) on top of ssd_chunked
    linear_attention     y_t = Σ_{s≤t} (q_t·k_s) v_s: SSD with decay 1 (ΔA = 0) and Δ = 1
    simple_gla           flash-linear-attention's simple GLA as a loop: the same recurrence
"""

import torch
import torch.nn.functional as F

from mambalearn.utils import check_chunk_size, check_same_device, check_tensor


def segsum(x):
    """segsum(x)_ts = Σ_{k=s+1..t} x_k for t ≥ s, −∞ for t < s, so exp(segsum(x)) is L.

    Computed as a cumulative sum of a masked copy (never as cumsum_t − cumsum_s: that difference of
    two large numbers loses all precision and exp(cumsum) overflows for long sequences).

    Shapes: x (..., T) → (..., T, T).  Matches ``segsum`` of mamba_ssm's ``ssd_minimal.py``.
    """
    T = x.shape[-1]
    x = x[..., None].expand(*x.shape, T)  # (..., T, T): x[..., k, s] = x_k
    strict = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-1)
    x = x.masked_fill(~strict, 0)  # keep x_k only for k > s
    out = torch.cumsum(x, dim=-2)  # out[..., t, s] = Σ_{s<k≤t} x_k
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    return out.masked_fill(~causal, float("-inf"))  # (..., T, T)


def check_inputs(x, dt, A, B, C, allow_empty=False):
    """Raise a clear error unless the arguments have mamba_ssm's SSD layouts.

    Returns (b, l, h, p, g, n). ``allow_empty``: l = 0 is valid (the kernels return an empty
    output); the oracles need at least one step."""
    check_tensor("x", x, ndim=4)
    b, l, h, p = x.shape
    if l == 0 and not allow_empty:
        raise ValueError("x has sequence length l = 0; SSD needs at least one step")
    check_tensor("dt", dt, shape=(b, l, h))
    check_tensor("A", A, shape=(h,))
    check_tensor("B", B, ndim=4)
    g, n = B.shape[2], B.shape[3]
    check_tensor("B", B, shape=(b, l, None, None))
    check_tensor("C", C, shape=(b, l, g, n))
    if g == 0 or h % g:
        raise ValueError(f"B and C have g = {g} groups, which must divide the number of heads "
                         f"h = {h}")
    check_same_device(x=x, dt=dt, A=A, B=B, C=C)
    return b, l, h, p, g, n


def _per_head(X, h):
    """(b, l, g, n) → (b, l, h, n): head i reads group i // (h // g) (a view-free repeat)."""
    return X.repeat_interleave(h // X.shape[2], dim=2)


def _dtype(*ts):
    return torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32


def ssd_quadratic(x, dt, A, B, C):
    """y = (L ∘ C Bᵀ)(Δ x) with L = exp(segsum(Δ A)): the "attention" form, O(l²) time and memory.

    Shapes: x (b, l, h, p), dt (b, l, h) (already positive), A (h,), B/C (b, l, g, n) →
    y (b, l, h, p) in float32 (float64 if x is).
    """
    b, l, h, p, g, n = check_inputs(x, dt, A, B, C)
    f = _dtype(x, dt, A, B, C)
    x, dt, A = x.to(f), dt.to(f), A.to(f)
    B, C = _per_head(B.to(f), h), _per_head(C.to(f), h)  # (b, l, h, n)
    L = torch.exp(segsum((dt * A).transpose(1, 2)))  # (b, h, l, l)
    scores = torch.einsum("bthn,bshn->bhts", C, B) * L  # (b, h, l, l): L ∘ C Bᵀ
    return torch.einsum("bhts,bsh,bshp->bthp", scores, dt, x)  # (b, l, h, p)


def ssd_sequential(x, dt, A, B, C, initial_states=None):
    """h_t = exp(Δ_t A) h_{t−1} + Δ_t x_t B_tᵀ, y_t = h_t C_t: chapter 02's loop, A scalar per head.

    The (b, l, h, p) layout becomes chapter 02's (b, d, l) with d = h·p channels; every channel of
    head i gets the same A_i on all n states and the same Δ, and reads B/C group i // (h // g).

    Shapes: x (b, l, h, p), dt (b, l, h), A (h,), B/C (b, l, g, n), initial_states (b, h, p, n) →
    (y (b, l, h, p), final state (b, h, p, n)), float32 (float64 if x is).
    """
    from mambalearn.scan.sequential import selective_scan_sequential

    b, l, h, p, g, n = check_inputs(x, dt, A, B, C)
    f = _dtype(x, dt, A, B, C)
    u = x.to(f).permute(0, 2, 3, 1).reshape(b, h * p, l)  # (b, d, l), d = h·p
    delta = dt.to(f).permute(0, 2, 1).repeat_interleave(p, dim=1)  # (b, d, l)
    A_full = A.to(f).repeat_interleave(p)[:, None].expand(h * p, n)  # (d, n): scalar per head
    h0 = None if initial_states is None else initial_states.to(f).reshape(b, h * p, n)
    y, last = selective_scan_sequential(u, delta, A_full, B.to(f).permute(0, 2, 3, 1),
                                        C.to(f).permute(0, 2, 3, 1), initial_state=h0,
                                        return_last_state=True)  # (b, d, l), (b, d, n)
    return y.reshape(b, h, p, l).permute(0, 3, 1, 2), last.reshape(b, h, p, n)


def ssd_chunked(x, dt, A, B, C, chunk_size, initial_states=None, seq_idx=None):
    """The chunked SSD algorithm: y = (L ∘ C Bᵀ)(Δx) with L split into q×q blocks.

        1. diagonal blocks:   y_diag[c] = (L_c ∘ C_c B_cᵀ)(Δx)_c             (quadratic, in-chunk)
        2. chunk states:      S_c = Σ_{s∈c} exp(ΣΔA_{s+1..end}) Δ_s x_s B_sᵀ    (b, c, h, p, n)
        3. state passing:     H_c = exp(ΣΔA over chunk c−1) H_{c−1} + S_{c−1}        (a scan over c)
        4. off-diagonal:      y_off[c]_t = exp(ΣΔA_{start..t}) H_c C_t

    l need not be a multiple of q: the tail is padded with Δ = 0 (decay 1, no input), which leaves
    states and outputs unchanged. ``seq_idx`` (b, l) marks packed sequences: no term crosses from
    one sequence index to another; the initial state belongs to sequence index 0 (as in mamba_ssm).

    Shapes: x (b, l, h, p), dt (b, l, h) (positive), A (h,), B/C (b, l, g, n),
    initial_states (b, h, p, n), seq_idx (b, l) int → (y (b, l, h, p), final state (b, h, p, n)),
    float32 (float64 if x is). Mirrors ``ssd_minimal_discrete`` of mamba_ssm plus padding/seq_idx.
    """
    b, l, h, p, g, n = check_inputs(x, dt, A, B, C)
    q = check_chunk_size(chunk_size)
    f = _dtype(x, dt, A, B, C)
    c = -(-l // q)
    pad = c * q - l
    pad_t = lambda X: F.pad(X, (0, 0) * (X.ndim - 2) + (0, pad))  # pad the l axis (dim 1)
    x, dt = pad_t(x.to(f)), pad_t(dt.to(f))
    B, C = pad_t(_per_head(B.to(f), h)), pad_t(_per_head(C.to(f), h))  # (b, c·q, h, n)
    x, B, C = (X.reshape(b, c, q, h, -1) for X in (x, B, C))  # (b, c, q, h, ·)
    dt = dt.reshape(b, c, q, h)  # (b, c, q, h)
    # A floored at −1e30 (the kernels floor Δ A alike): A = −∞ would make the cumulative sums −∞
    # and exp(dA_cs_t − dA_cs_s) a NaN, −∞ − (−∞); Δ = 0 on the padding would make 0 · (−∞) one
    A = A.to(f).clamp(min=-1e30)
    dA = (dt * A).permute(0, 3, 1, 2)  # (b, h, c, q)
    dA_cs = torch.cumsum(dA, dim=-1)  # (b, h, c, q): decay from chunk start to t
    same_in, same_last, keep, same_prev = _seq_masks(seq_idx, b, l, c, q, pad, x.device)

    # 1. diagonal blocks: the quadratic form inside each chunk
    seg = segsum(dA)  # (b, h, c, q, q)
    L = torch.exp(seg) * same_in  # (b, h, c, q, q)
    scores = torch.einsum("bcthn,bcshn->bhcts", C, B) * L  # (b, h, c, q, q): L ∘ C Bᵀ
    y_diag = torch.einsum("bhcts,bcshp->bcthp", scores, dt[..., None] * x)  # (b, c, q, h, p)
    # 2. chunk states: each chunk's inputs decayed to its last step
    decay_out = torch.exp(seg[..., -1, :]) * same_last  # (b, h, c, q): segsum's last row
    w = decay_out.permute(0, 2, 3, 1) * dt  # (b, c, q, h): decay to the chunk end times Δ_s
    # two operands per einsum: a 4-operand einsum may build a (b, c, q, h, p, n) intermediate
    S = torch.einsum("bcshn,bcshp->bchpn", B, w[..., None] * x)  # (b, c, h, p, n)
    # 3. state passing: H_c is the state entering chunk c (a sequential scan over c chunks)
    H0 = x.new_zeros(b, h, p, n) if initial_states is None else initial_states.to(f)
    H, states_in = H0, []
    for k in range(c):
        states_in.append(H)
        a = torch.exp(dA_cs[:, :, k, -1]) * keep[:, :, k]  # (b, h): 0 if chunk k starts a sequence
        H = a[..., None, None] * H + S[:, k]  # (b, h, p, n)
    Hin = torch.stack(states_in, dim=1)  # (b, c, h, p, n)
    # 4. off-diagonal blocks: the entering state read out by C, decayed to step t
    decay_in = torch.exp(dA_cs) * same_prev  # (b, h, c, q)
    C_in = C * decay_in.permute(0, 2, 3, 1)[..., None]  # (b, c, q, h, n)
    y_off = torch.einsum("bcthn,bchpn->bcthp", C_in, Hin)  # (b, c, q, h, p)
    y = (y_diag + y_off).reshape(b, c * q, h, p)[:, :l]  # (b, l, h, p)
    return y, H


def _seq_masks(seq_idx, b, l, c, q, pad, device):
    """Masks for packed sequences, shaped to broadcast against (b, h, c, ...); ones without seq_idx.

    same_in (b, 1, c, q, q): step s may feed step t (same sequence).
    same_last (b, 1, c, q): step s belongs to the sequence of its chunk's last step (chunk state).
    keep (b, 1, c): the state leaving chunk k−1 survives chunk k (chunk k's last step is in the
        sequence of chunk k−1's last step; "chunk −1" is the initial state, sequence 0).
    same_prev (b, 1, c, q): step t continues the sequence of the state entering its chunk.
    """
    if seq_idx is None:
        one = torch.ones((), device=device)
        return one, one, torch.ones(b, 1, c, device=device), one
    if tuple(seq_idx.shape) != (b, l) or seq_idx.is_floating_point():
        raise ValueError(f"seq_idx must be an integer tensor of shape (b, l) = {(b, l)}, "
                         f"got {tuple(seq_idx.shape)} {seq_idx.dtype}")
    s = torch.cat([seq_idx, seq_idx[:, -1:].expand(b, pad)], dim=1)  # tail continues the last seq
    s = s.reshape(b, c, q)  # (b, c, q)
    ends = torch.cat([torch.zeros_like(s[:, :1, 0]), s[..., -1]], dim=1)  # (b, c+1)
    same_in = s[..., :, None] == s[..., None, :]  # (b, c, q, q)
    same_last = s == s[..., -1:]  # (b, c, q)
    keep = ends[:, 1:] == ends[:, :-1]  # (b, c)
    same_prev = s == ends[:, :-1, None]  # (b, c, q)
    return tuple(m[:, None].float() for m in (same_in, same_last, keep, same_prev))


def effective_dt(dt, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf"))):
    """Δ = clamp(softplus(dt + dt_bias), *dt_limit) (softplus only if asked), in float32/64.

    Shapes: dt (b, l, h), dt_bias (h,) → (b, l, h).  As ``_chunk_cumsum_fwd`` of mamba_ssm.
    """
    f = _dtype(dt)
    dt = dt.to(f) if dt_bias is None else dt.to(f) + dt_bias.to(f)
    if dt_softplus:
        dt = torch.where(dt <= 20.0, F.softplus(dt), dt)  # mamba_ssm's threshold
    if dt_limit != (0.0, float("inf")):
        dt = dt.clamp(*dt_limit)
    return dt


def check_dt_limit(dt_limit):
    """dt_limit must be a pair (dt_min, dt_max) of numbers with dt_min ≤ dt_max (Δ is clamped to
    it; mamba_ssm's default (0, ∞) clamps nothing)."""
    try:
        lo, hi = (float(v) for v in dt_limit)
    except (TypeError, ValueError):
        raise ValueError(f"dt_limit must be a pair (dt_min, dt_max) of numbers, got "
                         f"{dt_limit!r}") from None
    if not lo <= hi:  # also NaN
        raise ValueError(f"dt_limit = {dt_limit!r} must have dt_min ≤ dt_max")
    return lo, hi


def check_extras(b, l, h, p, n, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                 dt_limit=(0.0, float("inf"))):
    """Checks of the optional arguments of ``mamba_chunk_scan_combined`` (shapes, seq_idx an
    integer tensor, dt_limit a pair)."""
    check_dt_limit(dt_limit)
    if D is not None:
        check_tensor("D", D, ndim=(1, 2))
        check_tensor("D", D, shape=(h,) if D.ndim == 1 else (h, p))
    if z is not None:
        check_tensor("z", z, shape=(b, l, h, p))
    if dt_bias is not None:
        check_tensor("dt_bias", dt_bias, shape=(h,))
    if initial_states is not None:
        check_tensor("initial_states", initial_states, shape=(b, h, p, n))
    if seq_idx is not None:
        if not isinstance(seq_idx, torch.Tensor) or seq_idx.is_floating_point() \
                or seq_idx.is_complex() or seq_idx.dtype == torch.bool:
            raise TypeError(f"seq_idx must be an integer tensor (b, l), got "
                            f"{getattr(seq_idx, 'dtype', type(seq_idx).__name__)}")
        if tuple(seq_idx.shape) != (b, l):
            raise ValueError(f"seq_idx must have shape (b, l) = {(b, l)}, "
                             f"got {tuple(seq_idx.shape)}")


def finish(y, x, D=None, z=None):
    """out = (y + D x) · silu(z).  y, x, z: (b, l, h, p); D: (h,) or (h, p)."""
    if D is not None:
        Dp = D.to(y.dtype)[:, None] if D.ndim == 1 else D.to(y.dtype)  # (h, 1) or (h, p)
        y = y + Dp * x.to(y.dtype)
    if z is not None:
        y = y * F.silu(z.to(y.dtype))
    return y


def mamba_chunk_scan_ref(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                         initial_states=None, seq_idx=None, dt_softplus=False,
                         dt_limit=(0.0, float("inf")), return_final_states=False):
    """out = ((L ∘ C Bᵀ)(Δx) + D x) · silu(z), Δ = softplus(dt + dt_bias): the oracle of
    ``mamba_chunk_scan_combined`` (differentiable with autograd; computes in float32, or float64).

    Shapes: x, z (b, l, h, p); dt (b, l, h); A, dt_bias (h,); B, C (b, l, g, n); D (h,) or (h, p);
    initial_states (b, h, p, n); seq_idx (b, l) int → out (b, l, h, p) in x's dtype, and the final
    states (b, h, p, n) float32 if ``return_final_states``.
    Matches ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined`` (no cu_seqlens).
    A = −∞ gives the recurrence's output and finite gradients (``ssd_chunked`` floors A at −1e30);
    a NaN in x reaches its chunk's earlier steps as in the kernels (0 · NaN in the einsum).
    """
    b, l, h, p, g, n = check_inputs(x, dt, A, B, C)
    check_extras(b, l, h, p, n, D, z, dt_bias, initial_states, seq_idx, dt_limit)
    delta = effective_dt(dt, dt_bias, dt_softplus, dt_limit)  # (b, l, h)
    y, final = ssd_chunked(x, delta, A, B, C, chunk_size, initial_states, seq_idx)
    out = finish(y, x, D, z).to(x.dtype)  # (b, l, h, p)
    return (out, final) if return_final_states else out


def linear_attention(q, k, v):
    """y_t = Σ_{s≤t} (q_t · k_s) v_s: causal linear attention (no feature map, no normalizer).

    SSD with decay ā = e^{ΔA} = 1 (A = 0: L is the causal mask of ones) and Δ = 1 is exactly
    this with q = C, k = B, v = x — "SSD with A = 1 is linear attention", A meaning the decay.

    Shapes: q, k (b, l, h, n); v (b, l, h, p) → (b, l, h, p).
    """
    check_tensor("q", q, ndim=4)
    check_tensor("k", k, shape=tuple(q.shape))
    check_tensor("v", v, shape=tuple(q.shape[:3]) + (None,))
    scores = torch.einsum("bthn,bshn->bhts", q, k).tril()  # (b, h, l, l), causal
    return torch.einsum("bhts,bshp->bthp", scores, v)  # (b, l, h, p)


def simple_gla(q, k, v, g, scale=1.0, initial_state=None):
    """S_t = e^{g_t} S_{t−1} + k_t v_tᵀ,  o_t = scale · S_tᵀ q_t: simple gated linear attention.

    flash-linear-attention's ``chunk_simple_gla`` computes this recurrence (its oracle is
    ``naive_recurrent_simple_gla``); it is SSD's with q = C, k = B, v = Δ x, g = Δ A and
    S = hᵀ, and scale = 1 (FLA's default scale is n^{-1/2}).

    Shapes (FLA's layout): q, k (b, l, h, n); v (b, l, h, p); g (b, l, h) log-decays;
    initial_state (b, h, n, p) → (o (b, l, h, p), final state S (b, h, n, p)), float32/64.
    """
    check_tensor("q", q, ndim=4)
    b, l, h, n = q.shape
    check_tensor("k", k, shape=(b, l, h, n))
    check_tensor("v", v, shape=(b, l, h, None))
    check_tensor("g", g, shape=(b, l, h))
    f = _dtype(q, k, v, g)
    S = q.new_zeros(b, h, n, v.shape[-1], dtype=f) if initial_state is None else \
        initial_state.to(f).clone()
    outs = []
    for t in range(l):
        kv = k[:, t, :, :, None].to(f) * v[:, t, :, None, :].to(f)  # (b, h, n, p)
        S = torch.exp(g[:, t].to(f))[..., None, None] * S + kv
        outs.append(scale * torch.einsum("bhn,bhnp->bhp", q[:, t].to(f), S))
    return torch.stack(outs, dim=1), S  # (b, l, h, p), (b, h, n, p)
