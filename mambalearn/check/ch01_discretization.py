"""Checks for chapter 01: ``zoh``, ``bilinear``, ``ssm_kernel`` against `mambalearn.discretize`."""

import torch

from mambalearn import discretize
from mambalearn.check import _core

__all__ = ["zoh", "bilinear", "ssm_kernel"]
# What each exercise rebuilds: switched off in the library while a notebook is graded.
REBUILDS = {
    "zoh": ["mambalearn.discretize.zoh"],
    "bilinear": ["mambalearn.discretize.bilinear"],
    "ssm_kernel": ["mambalearn.discretize.ssm_kernel"],
}

HINTS = {  # shown one more on each failure (docs/AUTHORING.md)
    "zoh": [
        "exact ZOH, not Euler: A_bar = exp(ΔA), and for a diagonal A B_bar = expm1(x)/x · ΔB with "
        "x = ΔA, elementwise; where x = 0 the limit of expm1(x)/x is 1: torch.where(x == 0, 1, "
        "expm1(x) / torch.where(x == 0, 1, x))",
        "turn delta into a tensor first (torch.as_tensor(delta, dtype=A.dtype)) and give it "
        "trailing dims, delta[..., None] (and [..., None, None] for a full A): a batch of Δ "
        "then broadcasts",
        "full A: no inverse. M = [[ΔA, ΔB], [0, 0]] of size (n+1)×(n+1); of "
        "torch.linalg.matrix_exp(M), [..., :n, :n] is A_bar and [..., :n, n] is B_bar, even "
        "when A is singular",
    ],
    "bilinear": [
        "A_bar = (I − Δ/2·A)⁻¹ (I + Δ/2·A), B_bar = (I − Δ/2·A)⁻¹ Δ B: the same left factor twice",
        "diagonal A: the inverse is a division by (1 − Δ/2·a); full A: torch.linalg.solve(I − "
        "Δ/2·A, …) for both, with the identity torch.eye(n) broadcast to Δ's batch",
    ],
    "ssm_kernel": [
        "K[k] = C · (Ā^k B̄): keep v = B̄ and multiply it by Ā once per step, after reading C · v",
        "diagonal Ā: v = A_bar * v; full Ā: v = A_bar @ v. K[0] is C · B̄ (no Ā yet), and K has "
        "exactly `length` entries",
    ],
}


def _stable_A(n, full, g):
    """A random stable A: negative diagonal, or −(MMᵀ + 0.1 I) plus a skew part (Re λ < 0)."""
    if not full:
        return -(torch.rand(n, generator=g, dtype=torch.float64) * 2 + 0.05)
    M = torch.randn(n, n, generator=g, dtype=torch.float64) / n**0.5
    S = torch.randn(n, n, generator=g, dtype=torch.float64)
    return -(M @ M.T + 0.1 * torch.eye(n, dtype=torch.float64)) + (S - S.T) / 2


def _cases(g):
    """(description, A, B, delta): random sizes and Δ, plus the edge cases students trip on."""
    cases = []
    for full in (False, True):
        kind = "full" if full else "diagonal"
        for n, delta in [(1, 0.7), (int(torch.randint(2, 9, (1,), generator=g)), None), (5, 1e-6),
                         (4, 8.0)]:
            delta = float(torch.rand(1, generator=g)) * 2 + 0.05 if delta is None else delta
            A, B = _stable_A(n, full, g), torch.randn(n, generator=g, dtype=torch.float64)
            cases.append((f"{kind} A with n={n}, delta={delta:.3g}", A, B, delta))
    A = _stable_A(3, False, g)
    deltas = torch.rand(2, 5, generator=g, dtype=torch.float64) + 0.1  # a batch of step sizes
    cases.append(("diagonal A with a (2, 5) batch of delta", A, torch.randn(3, generator=g,
                  dtype=torch.float64), deltas))
    # integrators: a_i = 0 makes ΔA = 0, where (e^x − 1)/x is 0/0 in floating point (limit 1)
    A = _stable_A(5, False, g)
    A[torch.randperm(5, generator=g)[:2]] = 0.0
    cases.append(("diagonal A with zeros (integrators, ΔA = 0)", A,
                  torch.randn(5, generator=g, dtype=torch.float64), 0.4))
    A = torch.zeros(3, 3, dtype=torch.float64)
    A[0, 1] = 1.0  # nilpotent: singular, so (ΔA)⁻¹ does not exist; Van Loan still works
    cases.append(("full singular A (a zero eigenvalue)", A,
                  torch.randn(3, generator=g, dtype=torch.float64), 0.7))
    return cases


def _nan_hint(desc, A, x):
    """Say where a NaN comes from when it sits exactly where ΔA = 0."""
    if not isinstance(x, torch.Tensor) or not bool(torch.isnan(x).any()) or A.ndim != 1:
        return ""
    zero = (A == 0).expand_as(x)
    if bool(torch.isnan(x)[zero].any()) and not bool(torch.isnan(x)[~zero].any()):
        return ("\nhint: NaN exactly where a_i = 0 (ΔA = 0): (e^x − 1)/x is 0/0 there, but its "
                "limit is 1 (B̄ = ΔB for an integrator). Guard x = 0 with torch.where, and divide "
                "by a safe x so no NaN is computed at all.")
    return ""


def _check_discretization(name, student, oracle):
    g = _core.generator()
    cases = _cases(g)
    for desc, A, B, delta in cases:
        got = _core.call(student, A, B, delta, case=desc)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise AssertionError(f"{name} must return the pair (A_bar, B_bar); got "
                                 f"{_core.kind(got)} on {desc}")
        want = oracle(A, B, delta)
        for part, x, y in zip(("A_bar", "B_bar"), got, want, strict=True):
            try:
                _core.compare(x, y, what=f"{name}: {part}", case=desc, g=g)
            except AssertionError as e:
                raise AssertionError(str(e) + _nan_hint(desc, A, x)) from None
    _core.passed(name, len(cases))


def zoh(fn):
    """Check an exact ZOH ``fn(A, B, delta) -> (A_bar, B_bar)`` (diagonal and full A, tiny and
    large Δ, ΔA = 0)."""
    _check_discretization("zoh", fn, discretize.zoh)


def bilinear(fn):
    """Check a bilinear ``fn(A, B, delta) -> (A_bar, B_bar)``."""
    _check_discretization("bilinear", fn, discretize.bilinear)


def ssm_kernel(fn):
    """Check ``fn(A_bar, B_bar, C, length) -> K`` (length (length,)) for diagonal and full Ā."""
    g = _core.generator()
    n_checks = 0
    for full in (False, True):
        for n, length in [(1, 1), (3, 7), (4, 64)]:
            A = _stable_A(n, full, g)
            A_bar, B_bar = discretize.zoh(A, torch.randn(n, generator=g, dtype=torch.float64), 0.5)
            C = torch.randn(n, generator=g, dtype=torch.float64)
            case = f"{'full' if full else 'diagonal'} Ā with n={n}, length={length}"
            got = _core.call(fn, A_bar, B_bar, C, length, case=case)
            _core.compare(got, discretize.ssm_kernel(A_bar, B_bar, C, length), what="ssm_kernel",
                          case=case, g=g)
            n_checks += 1
    _core.passed("ssm_kernel", n_checks)
