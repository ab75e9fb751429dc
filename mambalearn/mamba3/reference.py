"""Mamba-3 SISO as a loop over time: the oracle every faster form is compared against.

One head of Mamba-3 is Mamba-2's scalar-decay SSM with two changes (chapter 15):

    θ_t = θ_{t−1} + Δ_t ω_t,  ω_t = π tanh(Angles_t)            cumulative angles (angle_dt)
    q_t = R(θ_t)(Q_t + Q_bias),  k_t = R(θ_t)(K_t + K_bias)      C and B rotated pairwise
    α_t = exp(ADT_t),  β_t = (1 − λ_t) Δ_t α_t,  γ_t = λ_t Δ_t,  λ_t = sigmoid(Trap_t)
    h_t = α_t h_{t−1} + β_t v_{t−1} k_{t−1}ᵀ + γ_t v_t k_tᵀ          h_t: (p, n)
    y_t = h_t q_t + D v_t,   out_t = y_t · silu(Z_t)

The second line is a complex diagonal state in disguise (:func:`mamba3_complex_sequential`); the
fourth is the exponential-trapezoidal rule of ``mambalearn.discretize.exp_trapezoidal`` with
per-token Δ, A and λ. R(θ) rotates the pairs (2j, 2j+1) of the n state columns by θ_j for
j < na (the number of angles); the other pairs are not rotated.

Names and layouts are mamba_ssm's (``mamba3_siso_combined``): Q = C, K = B, V = x, ADT = Δ·A,
DT = Δ, Trap = the logit of λ. Shapes:
    Q, K (b, l, g, n) with g dividing h; V, Z (b, l, h, p); ADT, DT, Trap (b, h, l);
    Q_bias, K_bias (h, n); Angles (b, l, h, na) with na ≤ n/2; D (h,);
    Input_States = (angle (b, h, na), ssm (b, h, p, n), k (b, h, n), v (b, h, p)): the state of a
    previous call (k already rotated) → out (b, l, h, p) in V's dtype, and with
    ``return_final_states`` the same four states at the end.
"""

import math

import torch
import torch.nn.functional as F

from mambalearn.utils import check_same_device, check_tensor

TWO_PI = 2 * math.pi


def check_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None,
                 Input_States=None, allow_empty=False, step=False):
    """Raise a clear error unless the arguments have mamba_ssm's layouts.

    Returns (b, l, h, p, g, n, na). ``allow_empty``: l = 0 is valid (the kernels return an
    empty output and the states they were given); the oracles need at least one step.
    ``step``: the decode step's layouts, the same without the time axis (Q, K (b, g, n); V, Z
    (b, h, p); ADT, DT, Trap (b, h); Angles (b, h, na)), named so in the messages; l = 1.
    """
    check_tensor("V", V, ndim=3 if step else 4)
    b, *_, h, p = V.shape
    l = 1 if step else V.shape[1]
    T = () if step else (l,)  # the time axis, where the tensors have one
    if l == 0 and not allow_empty:
        raise ValueError("V has sequence length l = 0; Mamba-3 needs at least one step")
    check_tensor("Q", Q, shape=(b, *T, None, None))
    g, n = Q.shape[-2], Q.shape[-1]
    check_tensor("K", K, shape=(b, *T, g, n))
    if g == 0 or h % g:
        raise ValueError(f"Q and K have g = {g} heads, which must divide the h = {h} heads of V")
    if n % 2:
        raise ValueError(f"the state size n = {n} (last dim of Q, K) must be even: pairs rotate")
    for name, t in (("ADT", ADT), ("DT", DT), ("Trap", Trap)):
        check_tensor(name, t, shape=(b, h, *T))
    check_tensor("Q_bias", Q_bias, shape=(h, n))
    check_tensor("K_bias", K_bias, shape=(h, n))
    check_tensor("Angles", Angles, shape=(b, *T, h, None))
    na = Angles.shape[-1]
    if na > n // 2:
        raise ValueError(f"Angles has na = {na} angles but n/2 = {n // 2} pairs can rotate")
    if D is not None:
        check_tensor("D", D, shape=(h,))
    if Z is not None:
        check_tensor("Z", Z, shape=(b, *T, h, p))
    states = dict.fromkeys(("angle", "ssm", "k", "v"))
    if Input_States is not None:
        if not isinstance(Input_States, (tuple, list)) or len(Input_States) != 4:
            raise ValueError("Input_States must be (angle, ssm, k, v) states, all four")
        states = dict(zip(states, Input_States, strict=True))
        for (name, t), s in zip(states.items(), ((b, h, na), (b, h, p, n), (b, h, n), (b, h, p)),
                                strict=True):
            check_tensor(f"Input_States {name}", t, shape=s)
    check_same_device(Q=Q, K=K, V=V, ADT=ADT, DT=DT, Trap=Trap, Q_bias=Q_bias, K_bias=K_bias,
                      Angles=Angles, D=D, Z=Z, **{f"Input_States {k}": t for k, t in
                                                  states.items()})
    return b, l, h, p, g, n, na


def compute_dtype(*ts):
    """float64 if any input is, else float32 (bf16 inputs are computed in float32)."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) \
        else torch.float32


def per_head(X, h):
    """(b, l, g, n) → (b, l, h, n): head i reads Q/K head i // (h // g) (mamba_ssm's GQA)."""
    return X.repeat_interleave(h // X.shape[2], dim=2)


def angle_rates(Angles, DT):
    """Δ_t ω_t = Δ_t π tanh(Angles_t), the angle each pair turns by at step t.

    Shapes: Angles (b, l, h, na), DT (b, h, l) → (b, l, h, na). As ``angle_dt`` of mamba_ssm.
    """
    return math.pi * torch.tanh(Angles) * DT.transpose(1, 2)[..., None]


def angle_cumsum(Angles, DT, init=None):
    """θ_t = (θ_init + Σ_{s≤t} Δ_s ω_s) mod 2π: the cumulative angles (``angle_dt_fwd``).

    Shapes: Angles (b, l, h, na), DT (b, h, l), init (b, h, na) → θ (b, l, h, na). The mod keeps
    θ small (cos and sin stay accurate over long sequences) and has derivative 1 almost everywhere.
    """
    theta = torch.cumsum(angle_rates(Angles, DT), dim=1)  # (b, l, h, na)
    if init is not None:
        theta = theta + init[:, None]
    return torch.remainder(theta, TWO_PI)


def rotate_pairs(X, theta):
    """R(θ) X: the pairs (X_2j, X_2j+1) turned by θ_j for j < na, the other pairs left alone.

        (x₀, x₁) ↦ (x₀ cos θ − x₁ sin θ,  x₀ sin θ + x₁ cos θ)   i.e. x₀ + i x₁ ↦ e^{iθ}(x₀ + i x₁)

    Shapes: X (..., n), theta (..., na) with na ≤ n/2 → (..., n). ``apply_rotary_emb`` in
    interleaved form, with rotary dim 2·na.
    """
    na = theta.shape[-1]
    pairs = X.unflatten(-1, (-1, 2))  # (..., n/2, 2)
    x0, x1 = pairs[..., :na, 0], pairs[..., :na, 1]  # (..., na)
    c, s = torch.cos(theta), torch.sin(theta)
    turned = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)  # (..., na, 2)
    return torch.cat([turned, pairs[..., na:, :]], dim=-2).flatten(-2)  # (..., n)


def final_k(K, K_bias, theta_final):
    """k_F = R(θ_F)(K_{l−1} + K_bias) per head: the last step's key turned by the final angle,
    the k state the next call starts from. Shapes: K (b, l, g, n), K_bias (h, n), theta_final
    (b, h, na) → (b, h, n) float32."""
    k_last = per_head(K[:, -1:].float(), K_bias.shape[0])[:, 0] + K_bias.float()  # (b, h, n)
    return rotate_pairs(k_last, theta_final)


def trapezoid_coefficients(ADT, DT, Trap):
    """(α, β, γ) = (exp(ΔA), (1 − λ)Δ exp(ΔA), λΔ), λ = sigmoid(Trap): the three weights of a step.

    Shapes: ADT, DT, Trap (b, h, l) → three (b, h, l). λ = 1 (Trap → +∞) is Mamba-2's
    exponential-Euler step (β = 0, γ = Δ).
    """
    lam = torch.sigmoid(Trap)
    alpha = torch.exp(ADT)
    return alpha, (1 - lam) * DT * alpha, lam * DT


def prepare(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, Input_States):
    """Checks, float32/64 copies, biases added, heads expanded: what every form starts from.

    Returns a dict: q, k (b, l, h, n) with bias, not rotated; v (b, l, h, p); adt, dt, trap
    (b, h, l); angles (b, l, h, na); D (h,) or None; Z or None; states or None; f (the dtype).
    """
    b, l, h, p, g, n, na = check_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z,
                                        Input_States)
    f = compute_dtype(Q, K, V, ADT, DT, Q_bias, K_bias, Angles)
    q = per_head(Q.to(f), h) + Q_bias.to(f)  # (b, l, h, n)
    k = per_head(K.to(f), h) + K_bias.to(f)  # (b, l, h, n)
    states = None if Input_States is None else tuple(s.to(f) for s in Input_States)
    return dict(q=q, k=k, v=V.to(f), adt=ADT.to(f), dt=DT.to(f), trap=Trap.to(f),
                angles=Angles.to(f), D=None if D is None else D.to(f),
                Z=None if Z is None else Z.to(f), states=states, f=f)


def finish(y, v, D, Z, out_dtype):
    """out = (y + D v) · silu(Z), in ``out_dtype``. y, v, Z: (b, l, h, p); D (h,)."""
    if D is not None:
        y = y + D[:, None] * v
    if Z is not None:
        y = y * F.silu(Z)
    return y.to(out_dtype)


def mamba3_siso_sequential(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None,
                           Input_States=None, return_final_states=False):
    """Mamba-3 SISO, one step at a time (the module docstring has the formula and the shapes):

        h_t = α_t h_{t−1} + β_t v_{t−1} k_{t−1}ᵀ + γ_t v_t k_tᵀ,   y_t = h_t q_t (+ D v_t)

    with q, k rotated by the cumulative angles θ_t. Computes in float32 (float64 if an input is).
    Matches ``mamba_ssm.ops.triton.mamba3.mamba3_siso_combined`` (without cu_seqlens) and, step
    by step, ``mamba3_siso_step``.
    """
    x = prepare(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, Input_States)
    q, k, v = x["q"], x["k"], x["v"]
    b, l, h, n = q.shape
    p, na = v.shape[-1], x["angles"].shape[-1]
    alpha, beta, gamma = trapezoid_coefficients(x["adt"], x["dt"], x["trap"])  # (b, h, l) each
    rates = angle_rates(x["angles"], x["dt"])  # (b, l, h, na)
    if x["states"] is None:  # no previous call: θ = 0, h = 0, and no previous input
        theta, hs = q.new_zeros(b, h, na), q.new_zeros(b, h, p, n)
        k_prev, v_prev = q.new_zeros(b, h, n), q.new_zeros(b, h, p)
    else:
        theta, hs, k_prev, v_prev = x["states"]
    ys = []
    for t in range(l):
        theta = torch.remainder(theta + rates[:, t], TWO_PI)  # (b, h, na)
        q_t, k_t = rotate_pairs(q[:, t], theta), rotate_pairs(k[:, t], theta)  # (b, h, n)
        v_t = v[:, t]  # (b, h, p)
        a, bt, c = (w[..., t, None, None] for w in (alpha, beta, gamma))  # (b, h, 1, 1)
        hs = a * hs + bt * v_prev[..., None] * k_prev[..., None, :] \
            + c * v_t[..., None] * k_t[..., None, :]  # (b, h, p, n)
        ys.append(torch.einsum("bhpn,bhn->bhp", hs, q_t))
        k_prev, v_prev = k_t, v_t
    out = finish(torch.stack(ys, dim=1), v, x["D"], x["Z"], V.dtype)  # (b, l, h, p)
    return (out, theta, hs, k_prev, v_prev) if return_final_states else out


def mamba3_complex_sequential(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None):
    """The same model with a *complex* diagonal state and no rotations anywhere:

        ā_t = exp(Δ_t (A_t − i ω_t)),   A_t = ADT_t / Δ_t,   ω_t = π tanh(Angles_t)
        H_t = ā_t H_{t−1} + (1 − λ_t) Δ_t ā_t v_{t−1} b_{t−1}ᵀ + λ_t Δ_t v_t b_tᵀ
        y_t = Re(H_t c̄_t) (+ D v_t)

    b_t = k_{2j} + i k_{2j+1} and c_t = q_{2j} + i q_{2j+1} pack the n real columns into n/2
    complex ones (pairs j ≥ na have ω = 0). It is the exponential-trapezoidal discretization of
    h′ = (A − iω) h + b x, and equals :func:`mamba3_siso_sequential`: since H_t = e^{−iθ_t} S_t
    for the rotated state S_t, rotating B and C by the cumulative angle θ_t *is* the complex
    eigenvalue. Shapes as the module docstring (no Input_States). Computes in complex128.
    """
    x = prepare(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, None)
    q, k, v = (x[name].to(torch.float64) for name in ("q", "k", "v"))
    b, l, h, n = q.shape
    lam = torch.sigmoid(x["trap"].to(torch.float64))  # (b, h, l)
    dt, adt = x["dt"].to(torch.float64), x["adt"].to(torch.float64)
    omega = q.new_zeros(b, l, h, n // 2)  # pairs beyond na do not turn
    na = x["angles"].shape[-1]
    omega[..., :na] = math.pi * torch.tanh(x["angles"].to(torch.float64))  # (b, l, h, n/2)
    as_complex = lambda X: torch.view_as_complex(X.unflatten(-1, (-1, 2)).contiguous())
    bc, cc = as_complex(k), as_complex(q)  # (b, l, h, n/2) complex
    H = torch.zeros(b, h, v.shape[-1], n // 2, dtype=torch.complex128, device=q.device)
    b_prev, v_prev = torch.zeros_like(bc[:, 0]), torch.zeros_like(v[:, 0])
    ys = []
    for t in range(l):
        a_bar = torch.exp(adt[:, :, t, None] - 1j * dt[:, :, t, None] * omega[:, t])  # (b,h,n/2)
        w_prev = (1 - lam[:, :, t, None, None]) * dt[:, :, t, None, None]  # (b, h, 1, 1)
        w_cur = lam[:, :, t, None, None] * dt[:, :, t, None, None]
        H = a_bar[:, :, None] * (H + w_prev * v_prev[..., None] * b_prev[:, :, None]) \
            + w_cur * v[:, t, ..., None] * bc[:, t, :, None]  # (b, h, p, n/2)
        ys.append(torch.einsum("bhpj,bhj->bhp", H, cc[:, t].conj()).real)
        b_prev, v_prev = bc[:, t], v[:, t]
    y = torch.stack(ys, dim=1)  # (b, l, h, p)
    D64 = None if x["D"] is None else x["D"].to(torch.float64)
    Z64 = None if x["Z"] is None else x["Z"].to(torch.float64)
    return finish(y, v, D64, Z64, V.dtype)
