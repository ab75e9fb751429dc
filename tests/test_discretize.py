"""discretize against float64 references built from torch.linalg.matrix_exp and solve."""

import pytest
import torch

from mambalearn import discretize
from mambalearn.testing import assert_close

f64 = dict(dtype=torch.float64)


def stable_full(n, g):
    M = torch.randn(n, n, generator=g, **f64)
    return -(M @ M.T) / n - 0.2 * torch.eye(n, **f64)


def zoh_reference(A, B, delta):
    """Textbook formula with an explicit solve: fine for invertible, well-conditioned ΔA."""
    dA = delta * (torch.diag(A) if A.ndim == 1 else A)
    A_bar = torch.linalg.matrix_exp(dA)
    B_bar = torch.linalg.solve(dA, (A_bar - torch.eye(len(B), **f64)) @ (delta * B))
    return A_bar, B_bar


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("delta", [0.01, 0.37, 3.0])
def test_zoh_matches_matrix_exp_reference(n, delta):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    A_diag = -torch.rand(n, generator=g, **f64) * 3 - 0.1
    A_full = stable_full(n, g)
    B = torch.randn(n, generator=g, **f64)
    for A in (A_diag, A_full):
        A_bar, B_bar = discretize.zoh(A, B, delta)
        A_ref, B_ref = zoh_reference(A, B, delta)
        assert_close(torch.diag(A_bar) if A.ndim == 1 else A_bar, A_ref)
        assert_close(B_bar, B_ref)


def test_diagonal_and_full_paths_agree():
    A = -torch.rand(6, **f64) - 0.1
    B = torch.randn(6, **f64)
    deltas = torch.rand(4, 3, **f64) + 0.05  # batched step sizes
    A_bar, B_bar = discretize.zoh(A, B, deltas)
    A_bar_full, B_bar_full = discretize.zoh(torch.diag(A), B, deltas)
    assert A_bar.shape == (4, 3, 6) and A_bar_full.shape == (4, 3, 6, 6)
    assert_close(A_bar, torch.diagonal(A_bar_full, dim1=-2, dim2=-1))
    assert_close(B_bar, B_bar_full)


def test_small_delta_limit_is_delta_B_and_stays_accurate():
    A = -torch.rand(5, **f64) - 0.5
    B = torch.randn(5, **f64)
    for delta in (1e-6, 1e-10, 1e-14):
        A_bar, B_bar = discretize.zoh(A, B, delta)
        # B̄/Δ = (exp(ΔA) − 1)/(ΔA)·B → B; expm1 keeps the relative error at rounding level
        assert_close(B_bar / delta, B * (1 + delta * A / 2), rtol=1e-9, atol=0)
        assert_close(A_bar, 1 + delta * A, rtol=1e-9, atol=0)
    # float32: the naive (exp(x) − 1)/x would be 0 or 2 here; the library stays at ≈1
    _, B_bar32 = discretize.zoh(A.float(), B.float(), 1e-9)
    assert_close(B_bar32 / 1e-9, B.float())


def test_large_delta_decays_and_reaches_steady_state():
    A = -torch.rand(4, **f64) - 0.5
    B = torch.randn(4, **f64)
    A_bar, B_bar = discretize.zoh(A, B, 200.0)
    assert_close(A_bar, torch.zeros_like(A_bar), atol=1e-20, rtol=0)
    assert_close(B_bar, -B / A)  # steady state of h′ = Ah + B·1 is −A⁻¹B


def test_zero_eigenvalue_is_handled_by_the_block_exponential():
    A = torch.tensor([[0.0, 1.0], [0.0, -1.0]], **f64)  # singular: (ΔA)⁻¹ does not exist
    B = torch.tensor([0.0, 1.0], **f64)
    A_bar, B_bar = discretize.zoh(A, B, 0.5)
    # integrate ∫₀^Δ exp(sA) ds B with a fine trapezoid rule as the independent reference
    s = torch.linspace(0, 0.5, 20001, **f64)
    integrand = torch.linalg.matrix_exp(s[:, None, None] * A) @ B
    assert_close(B_bar, torch.trapezoid(integrand, s, dim=0), rtol=1e-8, atol=1e-10)
    assert torch.isfinite(A_bar).all()
    diag_A_bar, diag_B_bar = discretize.zoh(torch.tensor([0.0, -1.0], **f64), torch.ones(2, **f64),
                                            0.5)
    assert_close(diag_B_bar[0], torch.tensor(0.5, **f64))  # a = 0: B̄ = ΔB exactly


def test_common_slip_is_different():
    """B̄ = (ΔA)⁻¹(Ā − A)ΔB (A instead of I) must not pass for ZOH."""
    A = -torch.rand(3, **f64) - 0.2
    B = torch.randn(3, **f64)
    A_bar, B_bar = discretize.zoh(A, B, 0.5)
    slip = (A_bar - A) / (0.5 * A) * 0.5 * B
    assert (slip - B_bar).abs().max() > 1e-2


def test_bilinear_matches_formula_and_other_methods_converge():
    g = torch.Generator().manual_seed(1)
    A = stable_full(4, g)
    B = torch.randn(4, generator=g, **f64)
    eye = torch.eye(4, **f64)
    A_bar, B_bar = discretize.bilinear(A, B, 0.3)
    inv = torch.linalg.inv(eye - 0.15 * A)
    assert_close(A_bar, inv @ (eye + 0.15 * A))
    assert_close(B_bar, inv @ (0.3 * B))
    # every method approaches exact ZOH as Δ → 0, at its order
    orders = [(discretize.euler, 2), (discretize.bilinear, 3), (discretize.zoh_simplified, 2)]
    for method, order in orders:
        errs = [(method(A, B, d)[1] - discretize.zoh(A, B, d)[1]).abs().max() for d in (1e-2, 1e-3)]
        assert 10 ** (order - 0.3) < errs[0] / errs[1] < 10 ** (order + 0.3), method.__name__


@pytest.mark.parametrize("length", [1, 17, 128])
def test_convolution_equals_recurrence(length):
    g = torch.Generator().manual_seed(length)
    for A in (-torch.rand(5, generator=g, **f64) - 0.1, stable_full(5, g)):
        A_bar, B_bar = discretize.zoh(A, torch.randn(5, generator=g, **f64), 0.2)
        C = torch.randn(5, generator=g, **f64)
        x = torch.randn(3, length, generator=g, **f64)
        K = discretize.ssm_kernel(A_bar, B_bar, C, length)
        assert K.shape == (length,)
        assert_close(discretize.causal_conv(K, x), discretize.recurrence(A_bar, B_bar, C, x))


@pytest.mark.parametrize("fn", [discretize.zoh, discretize.bilinear, discretize.zoh_simplified,
                                discretize.euler])
def test_bad_input_raises_clear_errors(fn):
    A, B = -torch.ones(3), torch.ones(3)
    with pytest.raises(ValueError, match="delta"):
        fn(A, B, 0.0)
    with pytest.raises(ValueError, match="delta"):
        fn(A, B, torch.tensor([0.1, -0.1]))
    with pytest.raises(ValueError, match="A must"):
        fn(torch.ones(2, 3), B, 0.1)
    with pytest.raises(ValueError, match="A must have"):
        fn(torch.ones(1, 3, 3), B, 0.1)
    with pytest.raises(ValueError, match="B must have shape"):
        fn(A, torch.ones(4), 0.1)
    with pytest.raises(TypeError, match="A must be a real floating"):
        fn(torch.ones(3, dtype=torch.complex64), B, 0.1)
    with pytest.raises(TypeError, match="B must be a real floating"):
        fn(A, torch.ones(3, dtype=torch.int64), 0.1)


def test_kernel_bad_input():
    with pytest.raises(ValueError, match="length"):
        discretize.ssm_kernel(torch.ones(2), torch.ones(2), torch.ones(2), 0)
    with pytest.raises(ValueError, match="C must have shape"):
        discretize.ssm_kernel(torch.ones(2), torch.ones(2), torch.ones(3), 4)


def test_convolution_and_recurrence_bad_input():
    K, x = torch.ones(8), torch.ones(2, 8)
    with pytest.raises(ValueError, match="kernel K has length"):
        discretize.causal_conv(torch.ones(4), x)
    with pytest.raises(TypeError, match="x must be a real floating"):
        discretize.causal_conv(K, x.long())
    with pytest.raises(ValueError, match="at least one time step"):
        discretize.causal_conv(K, torch.ones(2, 0))
    with pytest.raises(ValueError, match="C must have shape"):
        discretize.recurrence(torch.ones(3), torch.ones(3), torch.ones(2), x)
