"""Chapter 01 — from the continuous SSM h′(t) = A h(t) + B x(t) to a recurrence
h_t = Ā h_{t−1} + B̄ x_t.

Zero-order hold (ZOH) assumes x is constant over each step of length Δ and solves the ODE exactly:

    Ā = exp(ΔA)            B̄ = (ΔA)⁻¹ (exp(ΔA) − I) ΔB

For diagonal A this is elementwise, and (exp(ΔA) − 1)/(ΔA) is computed with ``expm1`` so it stays
accurate as ΔA → 0 (where it tends to 1). For a full A we never invert ΔA: the exponential of the
block matrix [[ΔA, ΔB], [0, 0]] is [[Ā, B̄], [0, 1]] (Van Loan), which also works when A is singular.

Mamba keeps Ā = exp(ΔA) but simplifies B̄ = ΔB (``zoh_simplified``): one step errs by O(Δ²) (O(Δ)
over a fixed time), and the selective Δ is learned anyway (Mamba paper, §3.5 / appendix). S4 used
the bilinear transform; exact ZOH came with S4D.

Shapes (everywhere in this module): A (n,) diagonal or (n, n) full; B (n,); C (n,);
delta a positive float or tensor of any shape s; results carry s in front: Ā s+(n,) or s+(n, n).
"""

import torch

from mambalearn.utils import check_tensor


def _check(A, B, delta):
    check_tensor("A", A, ndim=(1, 2))
    if A.ndim == 2 and A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be square (n, n) or diagonal (n,), got shape {tuple(A.shape)}")
    check_tensor("B", B, shape=(A.shape[0],))
    if not isinstance(delta, torch.Tensor):
        delta = torch.tensor(float(delta), dtype=A.dtype, device=A.device)
    check_tensor("delta", delta)
    if not bool((delta > 0).all()):
        raise ValueError("delta (the step size Δ) must be > 0 everywhere")
    return delta.to(A.dtype)


def zoh(A, B, delta):
    """Exact zero-order hold: Ā = exp(ΔA), B̄ = (ΔA)⁻¹(exp(ΔA) − I)ΔB.

    Diagonal A uses ``expm1(ΔA)/A``-style arithmetic (the limit 1 where ΔA = 0: an integrator);
    full A the Van Loan block exponential. Returns (A_bar, B_bar).
    Shapes: A (n,) diagonal or (n, n); B (n,); delta a float or a tensor of shape s, > 0 →
        A_bar s + (n,) or s + (n, n), B_bar s + (n,).

    Reference: Mamba §2 eq. (4); S4D's discretization (Gu et al., 2022). S4 used the bilinear
    transform (:func:`bilinear`).
    """
    delta = _check(A, B, delta)
    if A.ndim == 1:
        dA = delta[..., None] * A  # s + (n,)
        # (exp(x) − 1)/x with x = ΔA; where x == 0 the limit is 1 (expm1 keeps small x exact)
        safe = torch.where(dA == 0, torch.ones_like(dA), dA)
        phi = torch.where(dA == 0, torch.ones_like(dA), torch.expm1(dA) / safe)
        return torch.exp(dA), phi * delta[..., None] * B
    n = A.shape[0]
    M = A.new_zeros(*delta.shape, n + 1, n + 1)  # s + (n+1, n+1)
    M[..., :n, :n] = delta[..., None, None] * A
    M[..., :n, n] = delta[..., None] * B
    E = torch.linalg.matrix_exp(M)  # [[Ā, B̄], [0, 1]]
    return E[..., :n, :n], E[..., :n, n]


def zoh_simplified(A, B, delta):
    """Mamba's discretization: Ā = exp(ΔA) exactly, B̄ = ΔB (first order in Δ).

    Shapes: A (n,) diagonal or (n, n); B (n,); delta a float or a tensor of shape s, > 0 →
        A_bar s + (n,) or s + (n, n), B_bar s + (n,).

    Reference: Mamba §3.5 and ``mamba_ssm.selective_scan_ref`` (deltaB_u = Δ·B·u).
    """
    delta = _check(A, B, delta)
    if A.ndim == 1:
        A_bar = torch.exp(delta[..., None] * A)
    else:
        A_bar = torch.linalg.matrix_exp(delta[..., None, None] * A)
    return A_bar, delta[..., None] * B


def euler(A, B, delta):
    """Forward Euler: Ā = I + ΔA, B̄ = ΔB — first order, and unstable once Δ·|A| > 2.

    Shapes: A (n,) diagonal or (n, n); B (n,); delta a float or a tensor of shape s, > 0 →
        A_bar s + (n,) or s + (n, n), B_bar s + (n,).
    """
    delta = _check(A, B, delta)
    if A.ndim == 1:
        return 1 + delta[..., None] * A, delta[..., None] * B
    eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
    return eye + delta[..., None, None] * A, delta[..., None] * B


def bilinear(A, B, delta):
    """Bilinear (Tustin) transform used by S4: Ā = (I − ΔA/2)⁻¹(I + ΔA/2), B̄ = (I − ΔA/2)⁻¹ΔB.

    Shapes: A (n,) diagonal or (n, n); B (n,); delta a float or a tensor of shape s, > 0 →
        A_bar s + (n,) or s + (n, n), B_bar s + (n,).

    Reference: Gu et al., S4 §2 (the bilinear method).
    """
    delta = _check(A, B, delta)
    if A.ndim == 1:
        dA = delta[..., None] * A
        return (1 + dA / 2) / (1 - dA / 2), delta[..., None] * B / (1 - dA / 2)
    eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
    left = eye - delta[..., None, None] * A / 2  # s + (n, n)
    A_bar = torch.linalg.solve(left, eye + delta[..., None, None] * A / 2)
    B_bar = torch.linalg.solve(left, (delta[..., None] * B)[..., None])[..., 0]
    return A_bar, B_bar


def exp_trapezoidal(A, B, delta, lam=0.5, taps=False):
    """Mamba-3's exponential-trapezoidal rule: Ā = exp(ΔA) exact, the input integral by a trapezoid.

    Over one step the exact solution is h_t = exp(ΔA) h_{t−1} + ∫₀^Δ exp((Δ−τ)A) B x(t−Δ+τ) dτ.
    Exponential-Euler (Mamba-1/2, ``zoh_simplified``) keeps only the right end of that integral,
    Δ·B x_t; the trapezoid weighs both ends, the left one carried through exp(ΔA):

        h_t = Ā h_{t−1} + B̄₀ x_{t−1} + B̄₁ x_t,   B̄₀ = (1 − λ) Δ exp(ΔA) B,   B̄₁ = λ Δ B

    λ = 1 is exponential-Euler again; λ = ½ the classical trapezoid, second order (local error
    O(Δ³) against O(Δ²)). Mamba-3 learns λ_t ∈ (0, 1) per token (a sigmoid of ``trap``).
    With ``taps=False`` returns (A_bar, B_bar) for an input held over the step (x_{t−1} = x_t,
    what ZOH assumes and the other functions of this module return): B̄ = B̄₀ + B̄₁. With
    ``taps=True`` returns (A_bar, B_bar_prev, B_bar_cur). Shapes as the module docstring.
    Reference: Lahoti et al., Mamba-3 (arXiv 2603.15569), §3.1.
    """
    delta = _check(A, B, delta)
    lam = torch.as_tensor(lam, dtype=A.dtype, device=A.device)
    if not bool(((lam >= 0) & (lam <= 1)).all()):
        raise ValueError("lam (the trapezoid weight λ) must lie in [0, 1]")
    lam = lam[..., None] if lam.ndim else lam  # broadcasts like delta
    if A.ndim == 1:
        A_bar = torch.exp(delta[..., None] * A)  # s + (n,)
        B_prev = (1 - lam) * delta[..., None] * A_bar * B
    else:
        A_bar = torch.linalg.matrix_exp(delta[..., None, None] * A)  # s + (n, n)
        B_prev = (1 - lam) * delta[..., None] * (A_bar @ B)
    B_cur = lam * delta[..., None] * B
    return (A_bar, B_prev, B_cur) if taps else (A_bar, B_prev + B_cur)


def _step(A_bar, h):
    return A_bar * h if A_bar.ndim == 1 else A_bar @ h


def ssm_kernel(A_bar, B_bar, C, length):
    """The LTI convolution kernel K = (C·B̄, C·Ā·B̄, …, C·Ā^{L−1}·B̄).

    Shapes: A_bar (n,) or (n, n); B_bar (n,); C (n,); length an int ≥ 1 → K (length,).
    """
    check_tensor("A_bar", A_bar, ndim=(1, 2))
    check_tensor("B_bar", B_bar, shape=(A_bar.shape[0],))
    check_tensor("C", C, shape=(A_bar.shape[0],))
    if int(length) < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    K, v = [], B_bar
    for _ in range(int(length)):
        K.append(C @ v)
        v = _step(A_bar, v)  # Ā^k B̄
    return torch.stack(K)  # (length,)


def recurrence(A_bar, B_bar, C, x):
    """The slow oracle: h_t = Ā h_{t−1} + B̄ x_t, y_t = C h_t, h_{−1} = 0.

    Shapes: A_bar (n,) or (n, n); B_bar (n,); C (n,); x (..., l) → y (..., l).
    """
    check_tensor("A_bar", A_bar, ndim=(1, 2))
    check_tensor("B_bar", B_bar, shape=(A_bar.shape[0],))
    check_tensor("C", C, shape=(A_bar.shape[0],))
    check_tensor("x", x)
    h = torch.zeros(*x.shape[:-1], A_bar.shape[0], dtype=x.dtype, device=x.device)
    ys = []
    for t in range(x.shape[-1]):
        h = (_step(A_bar, h.unsqueeze(-1)).squeeze(-1) if A_bar.ndim == 2 else A_bar * h) \
            + B_bar * x[..., t, None]
        ys.append(h @ C)
    return torch.stack(ys, -1)


def causal_conv(K, x):
    """y = K * x (causal): y_t = Σ_{k≤t} K_k x_{t−k}, through the FFT in O(l log l).

    Zero-padding to 2l turns the FFT's circular convolution into a linear one.

    Shapes: K (k,) with k ≥ l; x (..., l) → y (..., l).
    """
    check_tensor("K", K, ndim=1)
    check_tensor("x", x)
    l = x.shape[-1]
    if l == 0:
        raise ValueError("x must have at least one time step (got length 0)")
    if K.shape[-1] < l:
        raise ValueError(f"kernel K has length {K.shape[-1]} < sequence length {l}")
    f = torch.fft.rfft(x, n=2 * l) * torch.fft.rfft(K[..., :l], n=2 * l)
    return torch.fft.irfft(f, n=2 * l)[..., :l]
