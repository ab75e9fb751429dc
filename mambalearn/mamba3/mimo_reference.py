"""Mamba-3 MIMO prefill: rank-r inputs and outputs per head, the loop oracle and the chunked form.

SISO (``reference``) gives each head one input v_t = x_t and one readout per token. MIMO gives it
r of each, from learned per-rank weights Ψ_ρ, ζ_ρ, Φ_ρ (h, r, p) and r pairs (B_{t,ρ}, C_{t,ρ}):

    v_{t,ρ} = x_t ⊙ Ψ_ρ, q_{t,ρ} = R(θ_t)(C_{t,ρ} + Cbias_ρ), k_{t,ρ} = R(θ_t)(B_{t,ρ} + Bbias_ρ)
    h_t = α_t h_{t−1} + β_t Σ_ρ v_{t−1,ρ} k_{t−1,ρ}ᵀ + γ_t Σ_ρ v_{t,ρ} k_{t,ρ}ᵀ      h_t: (p, n)
    y_{t,ρ} = h_t q_{t,ρ} + D v_{t,ρ}
    out_t = Σ_ρ Φ_ρ ⊙ y_{t,ρ} ⊙ silu(z_t ⊙ ζ_ρ)          the output contraction (MIMO_Out)

α, β, γ, θ are SISO's (one per head and token). The state is the same size as SISO's, but each
step adds a rank-r update and reads r outputs: r× the arithmetic on the same bytes.

Chunked (:func:`mamba3_mimo_chunked`), the r ranks fold into the rows: a chunk of q steps is a
(q·r)-row block where row (t, ρ) holds q_{t,ρ}, k_{t,ρ}, v_{t,ρ}, and SISO's chunked algorithm runs
on the rows with the step index of each row deciding the mask — below the step diagonal
e^{c_t − c_s} w_s, on it (every ρ, ρ′ of the same step) γ_t. The products are (q·r) × (q·r) and
(q·r) × n matmuls: the tensor-core shape of the Triton kernel (``mambalearn.mamba3.mimo_api``).

Layouts are mamba_ssm's ``mamba3_mimo`` (``ops/tilelang/mamba3/mamba3_mimo.py``): Q, K
(b, l, r, g, n); V, Z (b, l, h, p); ADT, DT, Trap (b, h, l); Q_bias, K_bias (h, r, n); MIMO_V,
MIMO_Z, MIMO_Out (h, r, p); Angles (b, l, h, na); D (h,). Differences: the pairs that rotate are
interleaved (2j, 2j + 1), j < na, as in this course's SISO (mamba_ssm's MIMO kernel pairs column
j with j + n/2: a fixed permutation of the state's columns, the same model); MIMO_Z None means
ζ = 1; Input_States (angle (b, h, na), ssm (b, h, p, n), k (b, r, h, n) rotated, v (b, h, p)) are
taken and returned, as by mamba_ssm's decode step (its MIMO prefill has none).
"""

import torch
import torch.nn.functional as F

from mambalearn.mamba2.reference import segsum
from mambalearn.mamba3.reference import (
    angle_cumsum,
    compute_dtype,
    rotate_pairs,
    trapezoid_coefficients,
)
from mambalearn.mamba3.reference_chunked import trapezoid_weights
from mambalearn.utils import check_same_device, check_tensor


def check_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles,
                 D=None, Z=None, Input_States=None):
    """Raise a clear error unless the arguments have the MIMO layouts; (b, l, h, p, r, g, n, na)."""
    check_tensor("V", V, ndim=4)
    b, l, h, p = V.shape
    if l == 0:
        raise ValueError("V has sequence length l = 0; Mamba-3 needs at least one step")
    check_tensor("Q", Q, ndim=5)
    r, g, n = Q.shape[2:]
    check_tensor("Q", Q, shape=(b, l, None, None, None))
    check_tensor("K", K, shape=(b, l, r, g, n))
    if r == 0 or g == 0 or h % g:
        raise ValueError(f"Q and K have rank r = {r} and g = {g} heads; r ≥ 1 and g must divide "
                         f"the h = {h} heads of V")
    if n % 2:
        raise ValueError(f"the state size n = {n} (last dim of Q, K) must be even: pairs rotate")
    for name, t in (("ADT", ADT), ("DT", DT), ("Trap", Trap)):
        check_tensor(name, t, shape=(b, h, l))
    for name, t, s in (("Q_bias", Q_bias, (h, r, n)), ("K_bias", K_bias, (h, r, n)),
                       ("MIMO_V", MIMO_V, (h, r, p)), ("MIMO_Z", MIMO_Z, (h, r, p)),
                       ("MIMO_Out", MIMO_Out, (h, r, p)), ("D", D, (h,)), ("Z", Z, (b, l, h, p))):
        if t is not None or name in ("Q_bias", "K_bias", "MIMO_V"):
            check_tensor(name, t, shape=s)
    check_tensor("Angles", Angles, shape=(b, l, h, None))
    na = Angles.shape[3]
    if na > n // 2:
        raise ValueError(f"Angles has na = {na} angles but n/2 = {n // 2} pairs can rotate")
    if Input_States is not None:
        if len(Input_States) != 4:
            raise ValueError("Input_States must be (angle, ssm, k, v) states, all four")
        for name, t, s in zip(("angle", "ssm", "k", "v"), Input_States,
                              ((b, h, na), (b, h, p, n), (b, r, h, n), (b, h, p)), strict=True):
            check_tensor(f"Input_States {name}", t, shape=s)
    check_same_device(Q=Q, K=K, V=V, ADT=ADT, DT=DT, Trap=Trap, Q_bias=Q_bias, K_bias=K_bias,
                      MIMO_V=MIMO_V, MIMO_Z=MIMO_Z, MIMO_Out=MIMO_Out, Angles=Angles, D=D, Z=Z)
    return b, l, h, p, r, g, n, na


def prepare(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z,
            Input_States):
    """Checks and float32/64 copies; θ, the rotated q, k (b, l, r, h, n) and v (b, l, r, h, p)."""
    b, l, h, p, r, g, n, na = check_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z,
                                           MIMO_Out, Angles, D, Z, Input_States)
    f = compute_dtype(Q, K, V, ADT, DT, Q_bias, K_bias, MIMO_V, Angles)
    states = None if Input_States is None else tuple(s.to(f) for s in Input_States)
    theta = angle_cumsum(Angles.to(f), DT.to(f), None if states is None else states[0])
    heads = lambda X: X.to(f).repeat_interleave(h // g, dim=3)  # (b, l, r, h, n)
    turn = lambda X: rotate_pairs(X, theta[:, :, None])  # θ is shared by the r ranks
    q = turn(heads(Q) + Q_bias.to(f).transpose(0, 1))  # (b, l, r, h, n)
    k = turn(heads(K) + K_bias.to(f).transpose(0, 1))
    v = V.to(f)[:, :, None] * MIMO_V.to(f).transpose(0, 1)  # (b, l, r, h, p)
    return dict(q=q, k=k, v=v, theta=theta, adt=ADT.to(f), dt=DT.to(f), trap=Trap.to(f),
                states=states, f=f)


def finish(y, v, V, D, Z, MIMO_Z, MIMO_Out, f):
    """out = Σ_ρ Φ_ρ (y_ρ + D v_ρ) silu(z ζ_ρ) in V's dtype (per rank, (b, l, r, h, p), without
    MIMO_Out). y, v: (b, l, r, h, p)."""
    if D is not None:
        y = y + D.to(f)[:, None] * v
    if Z is not None:
        zeta = 1.0 if MIMO_Z is None else MIMO_Z.to(f).transpose(0, 1)  # (r, h, p)
        y = y * F.silu(Z.to(f)[:, :, None] * zeta)
    if MIMO_Out is not None:
        y = (y * MIMO_Out.to(f).transpose(0, 1)).sum(2)  # (b, l, h, p)
    return y.to(V.dtype)


def mamba3_mimo_sequential(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out,
                           Angles, D=None, Z=None, Input_States=None, return_final_states=False):
    """Mamba-3 MIMO one step at a time (the module docstring has the formula and the shapes):

        h_t = α_t h_{t−1} + β_t Σ_ρ v_{t−1,ρ} k_{t−1,ρ}ᵀ + γ_t Σ_ρ v_{t,ρ} k_{t,ρ}ᵀ
        y_{t,ρ} = h_t q_{t,ρ}

    Returns out (b, l, h, p) ((b, l, r, h, p) without MIMO_Out), and with ``return_final_states``
    the angle, ssm, k (b, r, h, n, rotated) and v states after the last token. r = 1 with
    Ψ = ζ = Φ = 1 is ``mamba3_siso_sequential``; one step is ``step.mamba3_mimo_step_ref``.
    """
    x = prepare(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z,
                Input_States)
    q, k, v = x["q"], x["k"], x["v"]
    b, l, r, h, n = q.shape
    alpha, beta, gamma = trapezoid_coefficients(x["adt"], x["dt"], x["trap"])  # (b, h, l)
    if x["states"] is None:
        hs, k_prev, v_prev = q.new_zeros(b, h, v.shape[-1], n), q.new_zeros(b, r, h, n), None
    else:
        _, hs, k_prev, V_prev = x["states"]
        v_prev = V_prev[:, None] * MIMO_V.to(x["f"]).transpose(0, 1)  # (b, r, h, p)
    ys = []
    for t in range(l):
        a, bt, c = (w[..., t, None, None] for w in (alpha, beta, gamma))  # (b, h, 1, 1)
        hs = a * hs + c * torch.einsum("brhp,brhn->bhpn", v[:, t], k[:, t])
        if v_prev is not None:  # the left end of the trapezoid: last token's r inputs
            hs = hs + bt * torch.einsum("brhp,brhn->bhpn", v_prev, k_prev)
        ys.append(torch.einsum("bhpn,brhn->brhp", hs, q[:, t]))
        k_prev, v_prev = k[:, t], v[:, t]
    out = finish(torch.stack(ys, dim=1), v, V, D, Z, MIMO_Z, MIMO_Out, x["f"])
    if not return_final_states:
        return out
    return out, x["theta"][:, -1], hs, k_prev, V[:, -1].to(x["f"])


def initial_pre_state(states, DT, Trap, MIMO_V):
    """The pre-state entering step 0: ssm + (1 − λ_0)Δ_0 Σ_ρ v_prev,ρ k_prev,ρᵀ (the previous call's
    last token still owes its left trapezoid half), zeros without states.  (b, h, p, n)"""
    _, ssm, k_prev, V_prev = states
    owe = (1 - torch.sigmoid(Trap[:, :, 0])) * DT[:, :, 0]  # (b, h)
    v_prev = V_prev[:, None] * MIMO_V.to(V_prev.dtype).transpose(0, 1)  # (b, r, h, p)
    return ssm + owe[..., None, None] * torch.einsum("brhp,brhn->bhpn", v_prev, k_prev)


def mamba3_mimo_chunked(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out,
                        Angles, D=None, Z=None, Input_States=None, chunk_size=16,
                        return_final_states=False):
    """Mamba-3 MIMO by chunks of q steps, the r ranks folded into the rows (module docstring):

        1. diagonal blocks   y_diag = (L ∘ Q Kᵀ) V over (q·r) rows, L by each row's step
        2. chunk states      S_c = Σ_{rows s} e^{c_end − c_s} w_s v_s k_sᵀ
        3. state passing     H_c = (e^{Σ ADT}, S) ⊗ … over chunks (chapter 03's ⊗)
        4. off-diagonal      y_off = e^{c_t} H_c q_t

    Arguments and results as :func:`mamba3_mimo_sequential`; differentiable with autograd.
    """
    x = prepare(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z,
                Input_States)
    q, k, v = x["q"], x["k"], x["v"]
    b, l, r, h, n = q.shape
    p, qs = v.shape[-1], int(chunk_size)
    if qs < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    w, gamma = trapezoid_weights(x["dt"], x["trap"])  # (b, h, l)
    H = q.new_zeros(b, h, p, n) if x["states"] is None else initial_pre_state(
        x["states"], x["dt"], x["trap"], MIMO_V.to(x["f"]))
    c, pad = -(-l // qs), -(-l // qs) * qs - l
    rows = lambda X: F.pad(X, (0, 0, 0, 0, 0, 0, 0, pad)).unflatten(1, (c, qs)).flatten(2, 3)
    q, k, v_c = rows(q), rows(k), rows(v)  # (b, c, q·r, h, ·): row t·r + ρ
    steps = lambda X: F.pad(X, (0, pad)).unflatten(-1, (c, qs))  # (b, h, c, q)
    adt, w, gamma = steps(x["adt"]), steps(w), steps(gamma)
    cs = torch.cumsum(adt, dim=-1)  # (b, h, c, q): c_t from the chunk start
    per_row = lambda X, dim=-1: X.repeat_interleave(r, dim=dim)  # a step's value on its r rows
    # 1. diagonal blocks: w_s below the step diagonal, γ_t on it (all ρ, ρ′ of step t)
    L = per_row(per_row(torch.exp(segsum(adt)) * w[..., None, :]), -2)  # (b, h, c, qr, qr)
    step_of = torch.arange(qs, device=q.device).repeat_interleave(r)  # (q·r,): each row's step
    same = step_of[:, None] == step_of[None, :]
    L = torch.where(same, per_row(gamma)[..., :, None], L)
    scores = torch.einsum("bcihn,bcjhn->bhcij", q, k) * L
    y = torch.einsum("bhcij,bcjhp->bcihp", scores, v_c)  # (b, c, q·r, h, p)
    # 2. chunk states, 3. state passing, 4. off-diagonal blocks
    to_end = per_row(torch.exp(cs[..., -1:] - cs) * w)  # (b, h, c, q·r)
    S = torch.einsum("bcjhn,bcjhp->bchpn", k, to_end.permute(0, 2, 3, 1)[..., None] * v_c)
    H_in = []
    for i in range(c):
        H_in.append(H)
        H = torch.exp(cs[:, :, i, -1])[..., None, None] * H + S[:, i]  # (b, h, p, n)
    q_in = q * per_row(torch.exp(cs)).permute(0, 2, 3, 1)[..., None]  # (b, c, q·r, h, n)
    y = y + torch.einsum("bcihn,cbhpn->bcihp", q_in, torch.stack(H_in))
    y = y.unflatten(2, (qs, r)).flatten(1, 2)[:, :l]  # (b, l, r, h, p)
    out = finish(y, x["v"], V, D, Z, MIMO_Z, MIMO_Out, x["f"])
    if not return_final_states:
        return out
    k_last = k.unflatten(2, (qs, r)).flatten(1, 2)[:, l - 1]  # (b, r, h, n)
    return out, x["theta"][:, -1], H, k_last, V[:, -1].to(x["f"])
