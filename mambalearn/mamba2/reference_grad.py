"""The backward of the chunked SSD, derived by hand, one step at a time (chapter 10).

Per batch and head, in chunks of q steps (cs = the cumsum of ΔA inside each chunk, Σ_c its last
entry, xΔ = Δ·x), the forward of ``mambalearn.mamba2.reference.ssd_chunked`` is four steps:

    1. diagonal blocks   y_t^d = Σ_{s≤t in the chunk} (C_t·B_s) L_ts xΔ_s,    L_ts = e^{cs_t − cs_s}
    2. chunk states      S_c   = Σ_{s in c} w_s xΔ_s B_sᵀ,                     w_s = e^{Σ_c − cs_s}
    3. state passing     H_{c+1} = a_c H_c + S_c,   a_c = e^{Σ_c},   H_0 = the initial state
    4. off-diagonal      y_t^o = e^{cs_t} H_c C_t

The backward runs them in reverse; every gradient is a product of an incoming gradient and a
forward value (dy is ∂loss/∂y, and d· of anything is ∂loss/∂·):

    4'. dH_c  = Σ_t e^{cs_t} dy_t C_tᵀ      dC_t += e^{cs_t} H_cᵀ dy_t     dcs_t += dy_t · y_t^o
    3'. g_c   = dH_c + a_c g_{c+1},  g_C = dH_final:  dS_c = g_{c+1},  dΣ_c += a_c ⟨g_{c+1}, H_c⟩
        — a reverse scan over chunks with the gate a_c, as chapter 07's adjoint
    2'. dxΔ_s += w_s dS_c B_s      dB_s += w_s dS_cᵀ xΔ_s      with u_s = w_s ⟨dS_c, xΔ_s B_sᵀ⟩:
        dΣ_c += Σ_s u_s,  dcs_s −= u_s
    1'. W = (C Bᵀ) ∘ L,  dW_ts = dy_t · xΔ_s:   dxΔ_s += Σ_t W_ts dy_t,
        d(C Bᵀ) = dW ∘ L → dC_t += Σ_s d(CBᵀ)_ts B_s,  dB_s += Σ_t d(CBᵀ)_ts C_t;
        R = dW ∘ W → dcs_t += Σ_s R_ts,  dcs_s −= Σ_t R_ts
    0'. cs = cumsum(ΔA):  d(ΔA)_j = Σ_{t ≥ j in the chunk} dcs_t  (a reverse cumsum; Σ_c is cs_last)
        dΔ = A d(ΔA) + Σ_p x dxΔ,   dA = Σ Δ d(ΔA),   dx = Δ dxΔ;   groups: dB, dC summed over heads

Each step is a function below, named after the forward step it differentiates; ``backward``
chains them. ``tests/test_ssd.py`` and chapter 10 check every step against autograd.

Shapes inside (chunked, B and C already repeated per head): x, xΔ (b, c, q, h, p);
Δ (b, c, q, h); cs (b, h, c, q); B, C (b, c, q, h, n); S, H (b, c, h, p, n).
"""

import torch
import torch.nn.functional as F

from mambalearn.mamba2 import reference as ssd


def diagonal(C, B, cs, xdt):
    """Step 1: y_t = Σ_{s≤t} (C_t·B_s) e^{cs_t − cs_s} xΔ_s inside every chunk → (b, c, q, h, p)."""
    L = torch.exp(ssd.segsum(_steps(cs)))  # (b, h, c, q, q)
    W = torch.einsum("bcthn,bcshn->bhcts", C, B) * L  # (b, h, c, q, q)
    return torch.einsum("bhcts,bcshp->bcthp", W, xdt)


def _steps(cs):
    """The ΔA steps back from their cumsum: segsum of them is cs_t − cs_s, summed stably."""
    return torch.diff(cs, dim=-1, prepend=torch.zeros_like(cs[..., :1]))


def diagonal_backward(dy, C, B, cs, xdt):
    """Step 1': (dC, dB, dcs, dxΔ) of :func:`diagonal` for the incoming dy (b, c, q, h, p)."""
    L = torch.exp(ssd.segsum(_steps(cs)))  # (b, h, c, q, q)
    CB = torch.einsum("bcthn,bcshn->bhcts", C, B)  # (b, h, c, q, q)
    W = CB * L
    dW = torch.einsum("bcthp,bcshp->bhcts", dy, xdt)  # dW_ts = dy_t · xΔ_s
    dxdt = torch.einsum("bhcts,bcthp->bcshp", W, dy)
    dCB = dW * L
    dC = torch.einsum("bhcts,bcshn->bcthn", dCB, B)
    dB = torch.einsum("bhcts,bcthn->bcshn", dCB, C)
    R = dW * W  # ∂/∂(cs_t − cs_s) of W_ts is W_ts itself
    dcs = R.sum(-1) - R.sum(-2)  # (b, h, c, q): + over s for cs_t, − over t for cs_s
    return dC, dB, dcs, dxdt


def chunk_states(B, cs, xdt):
    """Step 2: S_c = Σ_s e^{Σ_c − cs_s} xΔ_s B_sᵀ → (b, c, h, p, n)."""
    w = torch.exp(cs[..., -1:] - cs).permute(0, 2, 3, 1)  # (b, c, q, h)
    return torch.einsum("bcsh,bcshp,bcshn->bchpn", w, xdt, B)


def chunk_states_backward(dS, B, cs, xdt):
    """Step 2': (dB, dcs, dxΔ) of :func:`chunk_states` for the incoming dS (b, c, h, p, n)."""
    w = torch.exp(cs[..., -1:] - cs).permute(0, 2, 3, 1)  # (b, c, q, h)
    dxdt = w[..., None] * torch.einsum("bchpn,bcshn->bcshp", dS, B)
    dB = w[..., None] * torch.einsum("bchpn,bcshp->bcshn", dS, xdt)
    u = (dxdt * xdt).sum(-1).permute(0, 3, 1, 2)  # (b, h, c, q): w_s ⟨dS_c, xΔ_s B_sᵀ⟩
    dcs = -u
    dcs[..., -1] += u.sum(-1)  # Σ_c is cs at the chunk's last step
    return dB, dcs, dxdt


def state_passing(S, cs, H0):
    """Step 3: H_{c+1} = e^{Σ_c} H_c + S_c → (the states entering each chunk (b, c, h, p, n),
    the final state (b, h, p, n))."""
    H, states = H0, []
    for k in range(S.shape[1]):
        states.append(H)
        H = torch.exp(cs[:, :, k, -1])[..., None, None] * H + S[:, k]  # (b, h, p, n)
    return torch.stack(states, 1), H


def state_passing_backward(dH_in, dH_final, cs, H_in):
    """Step 3': (dS, dcs, dH0): a reverse scan over the chunks with the gate a_c = e^{Σ_c}."""
    g, dS, dcs = dH_final, torch.zeros_like(dH_in), torch.zeros_like(cs)
    for k in reversed(range(dH_in.shape[1])):
        a = torch.exp(cs[:, :, k, -1])  # (b, h)
        dS[:, k] = g  # S_k enters H_{k+1}, whose gradient is g
        dcs[:, :, k, -1] = a * (g * H_in[:, k]).sum((-1, -2))
        g = dH_in[:, k] + a[..., None, None] * g  # ∂loss/∂H_k
    return dS, dcs, g


def off_diagonal(C, cs, H_in):
    """Step 4: y_t = e^{cs_t} H_c C_t, the entering state read out → (b, c, q, h, p)."""
    e = torch.exp(cs).permute(0, 2, 3, 1)  # (b, c, q, h)
    return e[..., None] * torch.einsum("bcthn,bchpn->bcthp", C, H_in)


def off_diagonal_backward(dy, C, cs, H_in):
    """Step 4': (dC, dcs, dH_in) of :func:`off_diagonal` for the incoming dy (b, c, q, h, p)."""
    e = torch.exp(cs).permute(0, 2, 3, 1)[..., None]  # (b, c, q, h, 1)
    y_off = e * torch.einsum("bcthn,bchpn->bcthp", C, H_in)
    dC = e * torch.einsum("bcthp,bchpn->bcthn", dy, H_in)
    dH = torch.einsum("bcthp,bcthn->bchpn", e * dy, C)
    dcs = (dy * y_off).sum(-1).permute(0, 3, 1, 2)  # (b, h, c, q)
    return dC, dcs, dH


def _chunked(x, dt, A, B, C, q, initial_states):
    """The forward's inputs in chunks, B and C per head, padded with Δ = 0 to a multiple of q."""
    b, l, h, p, g, n = ssd.check_inputs(x, dt, A, B, C)
    c = -(-l // q)
    pad = lambda X: F.pad(X, (0, 0) * (X.ndim - 2) + (0, c * q - l))  # the l axis (dim 1)
    rep = lambda X: X.repeat_interleave(h // g, dim=2)  # group → heads
    x, dt, B, C = pad(x), pad(dt), pad(rep(B)), pad(rep(C))
    x, B, C = (X.reshape(b, c, q, h, -1) for X in (x, B, C))  # (b, c, q, h, ·)
    dt = dt.reshape(b, c, q, h)
    cs = torch.cumsum((dt * A).permute(0, 3, 1, 2), dim=-1)  # (b, h, c, q)
    H0 = x.new_zeros(b, h, p, n) if initial_states is None else initial_states
    return x, dt, B, C, cs, H0


def forward(x, dt, A, B, C, chunk_size, initial_states=None):
    """ssd_chunked's y and final state from the four step functions.

    Shapes: as ``ssd.ssd_chunked``; returns (y (b, l, h, p), H (b, h, p, n))."""
    l = x.shape[1]
    xc, dtc, Bc, Cc, cs, H0 = _chunked(x, dt, A, B, C, int(chunk_size), initial_states)
    xdt = dtc[..., None] * xc
    H_in, H = state_passing(chunk_states(Bc, cs, xdt), cs, H0)
    y = diagonal(Cc, Bc, cs, xdt) + off_diagonal(Cc, cs, H_in)  # (b, c, q, h, p)
    return y.reshape(x.shape[0], -1, *x.shape[2:])[:, :l], H


def backward(dy, x, dt, A, B, C, chunk_size, initial_states=None, dH_final=None):
    """∂loss/∂(x, dt, A, B, C, initial_states) of :func:`forward` given dy (b, l, h, p) and
    optionally the final state's gradient dH_final (b, h, p, n). Steps 4' → 0' of the docstring.

    Shapes: as ``ssd.ssd_chunked``; returns (dx, ddt, dA, dB, dC, dH0) with their inputs' shapes.
    """
    b, l, h, p, g, n = ssd.check_inputs(x, dt, A, B, C)
    q = int(chunk_size)
    xc, dtc, Bc, Cc, cs, H0 = _chunked(x, dt, A, B, C, q, initial_states)
    c = xc.shape[1]
    dy = F.pad(dy, (0, 0, 0, 0, 0, c * q - l)).reshape(b, c, q, h, p)
    xdt = dtc[..., None] * xc
    S = chunk_states(Bc, cs, xdt)
    H_in, _ = state_passing(S, cs, H0)
    # 4'. off-diagonal blocks
    dC, dcs, dH_in = off_diagonal_backward(dy, Cc, cs, H_in)
    # 3'. state passing, a reverse scan over the chunks
    dH_final = torch.zeros_like(H0) if dH_final is None else dH_final
    dS, dcs3, dH0 = state_passing_backward(dH_in, dH_final, cs, H_in)
    # 2'. chunk states
    dB, dcs2, dxdt = chunk_states_backward(dS, Bc, cs, xdt)
    # 1'. diagonal blocks
    dC1, dB1, dcs1, dxdt1 = diagonal_backward(dy, Cc, Bc, cs, xdt)
    dC, dB, dxdt = dC + dC1, dB + dB1, dxdt + dxdt1
    dcs = dcs + dcs3 + dcs2 + dcs1  # (b, h, c, q)
    # 0'. cs = cumsum(ΔA) inside each chunk: a reverse cumsum; then ΔA = Δ·A and xΔ = Δ·x
    ddA = torch.flip(torch.cumsum(torch.flip(dcs, [-1]), -1), [-1]).permute(0, 2, 3, 1)  # (b,c,q,h)
    ddt = A * ddA + (xc * dxdt).sum(-1)
    dA = (dtc * ddA).sum((0, 1, 2))
    dx = dtc[..., None] * dxdt
    unchunk = lambda X: X.reshape(b, c * q, *X.shape[3:])[:, :l]  # (b, l, ...)
    group = lambda X: unchunk(X).reshape(b, l, g, h // g, n).sum(3)  # heads → their group
    return unchunk(dx), unchunk(ddt), dA, group(dB), group(dC), dH0
