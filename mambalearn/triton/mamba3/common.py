"""What the Mamba-3 forward and backward kernels both compute for one chunk of one (batch, head).

The n state columns come in pairs (2j, 2j+1), the real and imaginary parts of n/2 complex numbers
(chapter 15): every kernel loads the even and the odd columns as two (q, J) tiles, so a rotation
is four multiplies and no shuffle, and every product over n is two ``tl.dot`` of depth J = n/2.

Inputs are contiguous (the launcher makes them so) in mamba_ssm's layouts:
Q, K (b, l, g, n); V, Z (b, l, h, p); ADT, DT, Trap (b, h, l); Q_bias, K_bias (h, n);
Angles (b, l, h, na).
"""

import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)

PI = tl.constexpr(3.141592653589793)  # a global a kernel may read
# The length is a run-time int Triton should not specialise on (it would compile again for every
# l that is or is not a multiple of 16); the model's sizes (h, p, n, …) keep their specialisation,
# which lets loads with strides h·p or g·n be vectorised.
SIZES = ["l", "n_chunks"]


@triton.jit
def chunk_scalars(dt_ptr, adt_ptr, trap_ptr, offs_t, l):
    """Per-step scalars of a chunk: Δ, ADT, λ, γ = λΔ and w = γ + (1 − λ_{t+1})Δ_{t+1}.

    ``dt_ptr`` etc. point at the (batch, head) row; positions ≥ l read as Δ = ADT = 0 (no step).
    """
    mask_t = offs_t < l
    dt = tl.load(dt_ptr + offs_t, mask=mask_t, other=0.0).to(tl.float32)
    adt = tl.load(adt_ptr + offs_t, mask=mask_t, other=0.0).to(tl.float32)
    lam = tl.sigmoid(tl.load(trap_ptr + offs_t, mask=mask_t, other=0.0).to(tl.float32))
    # the next step's (1 − λ)Δ: the left half of x_t's trapezoid, paid by step t + 1
    ahead = offs_t + 1 < l
    dt_next = tl.load(dt_ptr + offs_t + 1, mask=ahead, other=0.0).to(tl.float32)
    lam_next = tl.sigmoid(tl.load(trap_ptr + offs_t + 1, mask=ahead, other=0.0).to(tl.float32))
    gamma = lam * dt
    w = gamma + (1.0 - lam_next) * dt_next
    return dt, adt, lam, gamma, w


@triton.jit
def chunk_angles(ang_ptr, stride_ang_t, offs_t, offs_j, l, na, dt, theta0):
    """θ_t = θ₀ + Σ_{s≤t in chunk} Δ_s π tanh(a_s), mod 2π, for a (q, J) tile; also the raw a.

    Pairs j ≥ na (not rotated) read a = 0, so their θ stays 0. Returns (theta, tanh_a, chunk_sum).
    """
    mask = (offs_t[:, None] < l) & (offs_j[None, :] < na)
    a = tl.load(ang_ptr + offs_t[:, None] * stride_ang_t + offs_j[None, :], mask=mask,
                other=0.0).to(tl.float32)
    tanh_a = 2.0 * tl.sigmoid(2.0 * a) - 1.0  # tanh, through the sigmoid Triton has everywhere
    rate = PI * tanh_a * dt[:, None]  # (q, J): the angle step t turns each pair by
    theta = theta0[None, :] + tl.cumsum(rate, axis=0)
    theta = theta - 2.0 * PI * tl.floor(theta / (2.0 * PI))  # mod 2π: cos/sin stay accurate
    return theta, tanh_a, tl.sum(rate, axis=0)


@triton.jit
def load_pairs(ptr, bias_ptr, stride_t, offs_t, offs_j, l, half):
    """The even and odd columns of a (q, n) tile plus its bias (h, n) row; 0 beyond l or n/2."""
    mask = (offs_t[:, None] < l) & (offs_j[None, :] < half)
    base = ptr + offs_t[:, None] * stride_t + 2 * offs_j[None, :]
    be = tl.load(bias_ptr + 2 * offs_j, mask=offs_j < half, other=0.0).to(tl.float32)
    bo = tl.load(bias_ptr + 2 * offs_j + 1, mask=offs_j < half, other=0.0).to(tl.float32)
    xe = tl.load(base, mask=mask, other=0.0).to(tl.float32) + be[None, :]
    xo = tl.load(base + 1, mask=mask, other=0.0).to(tl.float32) + bo[None, :]
    return tl.where(mask, xe, 0.0), tl.where(mask, xo, 0.0)  # bias only where a step exists


@triton.jit
def rotate(xe, xo, cos, sin):
    """(x_e, x_o) turned by θ: x_e + i x_o ↦ e^{iθ}(x_e + i x_o)."""
    return xe * cos - xo * sin, xe * sin + xo * cos


@triton.jit
def causal_decay(cs, Q: tl.constexpr):
    """L_ts = exp(c_t − c_s) for s < t, 0 on and above the diagonal: a (q, q) tile."""
    rows = tl.arange(0, Q)
    # min(·, 0) keeps exp from overflowing where the mask throws the value away anyway
    L = tl.exp(tl.minimum(cs[:, None] - cs[None, :], 0.0))
    return tl.where(rows[:, None] > rows[None, :], L, 0.0)


def blocks(n, p, chunk_size):
    """(J, P, Q): tile sizes for n/2 pairs, p channels, the chunk; ≥ 16 for ``tl.dot``."""
    J = max(16, triton.next_power_of_2(n // 2))
    P = max(16, triton.next_power_of_2(p))
    Q = int(chunk_size)
    if Q < 16 or Q & (Q - 1):
        raise ValueError(f"chunk_size must be a power of two ≥ 16, got {chunk_size}")
    return J, P, Q
