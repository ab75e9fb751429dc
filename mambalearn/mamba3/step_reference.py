"""The Mamba-3 decode step, SISO and MIMO, and what one step costs (chapter 05's roofline).

SISO: one token moves the state (p × n per head) once through the trapezoid,

    h ← α h + β v_prev k_prevᵀ + γ v kᵀ,   y = h q + D v,

which is :func:`mamba3_siso_sequential` with l = 1: the step *is* the scan of one token, and the
cache is the four states (angle, h, the last rotated k, the last v).

MIMO (multi-input, multi-output, rank r): each head takes r inputs and gives r outputs per token,
x_r = x ⊙ xproj_r, with r pairs (B_r, C_r):

    h ← α h + Σ_r β (x_prev ⊙ xproj_r) B_prev,rᵀ + Σ_r γ (x ⊙ xproj_r) B_rᵀ
    y_r = h C_r + D x_r,   out = Σ_r outproj_r ⊙ y_r · silu(z ⊙ zproj_r)

The state is the same size, so a step still reads and writes p·n floats per head, but it does
about r times the arithmetic on them: the arithmetic intensity grows with r at equal state size,
and a decode step that was bound by memory bandwidth gets r× the work for almost the same time.
Names and layouts are mamba_ssm's ``mamba3_siso_step`` and ``mamba3_step_fn`` (CuTe DSL).
"""

import torch
import torch.nn.functional as F

from mambalearn.mamba3.reference import check_inputs, mamba3_siso_sequential
from mambalearn.roofline import Cost
from mambalearn.utils import check_same_device, check_tensor


def check_siso_step(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None,
                    Input_States=None):
    """The SISO step's argument rules (for the oracle and the kernel), in the step's layouts.
    Returns (b, h, p, g, n, na)."""
    if Input_States is None:
        raise ValueError("Input_States (angle, ssm, k, v) is required: the step continues a cache")
    b, _, h, p, g, n, na = check_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z,
                                        Input_States, step=True)
    return b, h, p, g, n, na


def check_mimo_step(state, Bstate, Xstate, A, B, C, D, x, dt, trap, xproj, outproj=None,
                    z=None, zproj=None):
    """The MIMO step's argument rules (for the oracle and the kernel). Returns (b, r, h, p, n)."""
    check_tensor("state", state, ndim=4)
    b, h, p, n = state.shape
    check_tensor("B", B, shape=(b, None, h, n))
    r = B.shape[1]
    if (z is None) != (zproj is None):
        raise ValueError("z and zproj go together: pass both (the gate z ⊙ zproj_r) or neither")
    for name, X, s in (("Bstate", Bstate, (b, r, h, n)), ("C", C, (b, r, h, n)),
                       ("x", x, (b, h, p)), ("Xstate", Xstate, (b, h, p)), ("A", A, (b, h)),
                       ("dt", dt, (b, h)), ("trap", trap, (b, h)), ("D", D, (h,)),
                       ("xproj", xproj, (r, h, p)), ("outproj", outproj, (r, h, p)),
                       ("z", z, (b, h, p)), ("zproj", zproj, (r, h, p))):
        if X is not None or name not in ("outproj", "z", "zproj"):
            check_tensor(name, X, shape=s)
    check_same_device(state=state, Bstate=Bstate, Xstate=Xstate, A=A, B=B, C=C, D=D, x=x, dt=dt,
                      trap=trap, xproj=xproj, outproj=outproj, z=z, zproj=zproj)
    return b, r, h, p, n


def mamba3_siso_step_ref(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None,
                         Input_States=None):
    """One token of Mamba-3 SISO: the oracle with l = 1, from and to the cache.

    Shapes: Q, K (b, g, n); V, Z (b, h, p); ADT, DT, Trap (b, h); Q_bias, K_bias (h, n);
    Angles (b, h, na); D (h,); Input_States (angle (b, h, na), ssm (b, h, p, n), k (b, h, n),
    v (b, h, p)) → (out (b, h, p), [angle, ssm, k, v]). Matches ``mamba3_siso_step``.
    """
    check_siso_step(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, Input_States)
    t = lambda X: None if X is None else X[:, None]  # a length-1 sequence
    l1 = lambda X: X[..., None]  # (b, h) → (b, h, 1)
    out, *states = mamba3_siso_sequential(t(Q), t(K), t(V), l1(ADT), l1(DT), l1(Trap), Q_bias,
                                          K_bias, t(Angles), D, t(Z), Input_States, True)
    return out[:, 0], states


def mamba3_mimo_step_ref(state, Bstate, Xstate, A, B, C, D, x, dt, trap, xproj, outproj=None,
                         z=None, zproj=None):
    """One MIMO token (module docstring), ``state`` updated in place; returns out.

    Shapes: state (b, h, p, n) float32; Bstate, B, C (b, r, h, n) (already rotated); Xstate, x,
    z (b, h, p); A, dt, trap (b, h) with trap = λ ∈ [0, 1] (after the sigmoid); D (h,);
    xproj, outproj, zproj (r, h, p) → out (b, h, p), or (b, r, h, p) without ``outproj``.
    Matches ``mamba_ssm.ops.cute.mamba3.mamba3_step_fn``.
    """
    check_mimo_step(state, Bstate, Xstate, A, B, C, D, x, dt, trap, xproj, outproj, z, zproj)
    f = torch.float64 if state.dtype == torch.float64 else torch.float32
    alpha = torch.exp(A.to(f) * dt.to(f))  # (b, h)
    beta, gamma = (1 - trap.to(f)) * dt.to(f) * alpha, trap.to(f) * dt.to(f)
    x_r = x.to(f)[:, None] * xproj.to(f)  # (b, r, h, p): the r inputs of each head
    xs_r = Xstate.to(f)[:, None] * xproj.to(f)
    h_new = alpha[..., None, None] * state.to(f) \
        + torch.einsum("brhp,brhn->bhpn", x_r * gamma[:, None, :, None], B.to(f)) \
        + torch.einsum("brhp,brhn->bhpn", xs_r * beta[:, None, :, None], Bstate.to(f))
    state.copy_(h_new)
    y = torch.einsum("bhpn,brhn->brhp", h_new, C.to(f)) + x_r * D.to(f)[:, None]  # (b, r, h, p)
    if z is not None:
        y = y * F.silu(z.to(f)[:, None] * zproj.to(f))
    if outproj is not None:
        y = torch.einsum("brhp,rhp->bhp", y, outproj.to(f))
    return y.to(x.dtype)


def decode_cost(b, h, p, n, rank=1, state_bytes=4, in_bytes=2):
    """Bytes and FLOPs of one decode step with MIMO rank r (r = 1: SISO), a ``roofline.Cost``.

    The state (b, h, p, n) is read and written once; per state element a step does the decay
    (1 multiply), r + r outer-product FMAs (this token's and the previous one's inputs) and r
    output FMAs: (1 + 6r) FLOPs. Small inputs: x, z, out, Xstate (b, h, p), B, C, Bstate
    (b, r, h, n), the per-head scalars. Intensity ≈ (1 + 6r) / (2·state_bytes) FLOP per byte.
    """
    state = b * h * p * n
    small = in_bytes * (4 * b * h * p + 3 * b * rank * h * n + 3 * b * h)
    return Cost(bytes=2 * state * state_bytes + small, flops=(1 + 6 * rank) * state,
                exps=b * h)
