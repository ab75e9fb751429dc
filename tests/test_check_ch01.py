"""Chapter 01 checks pass the library and reject the classic wrong answers."""

import pytest
import torch

from mambalearn import check, discretize


def slip_zoh(A, B, delta):
    """B̄ = (ΔA)⁻¹(Ā − A)ΔB: A where I belongs."""
    A_bar, _ = discretize.zoh(A, B, delta)
    d = torch.as_tensor(delta, dtype=A.dtype)
    if A.ndim == 1:
        return A_bar, (A_bar - A) / (d[..., None] * A) * d[..., None] * B
    rhs = (A_bar - A) @ (d[..., None] * B)[..., None]
    return A_bar, torch.linalg.solve(d[..., None, None] * A, rhs)[..., 0]


def kernel_off_by_one(A_bar, B_bar, C, length):
    return discretize.ssm_kernel(A_bar, B_bar, C, length + 1)[1:]  # starts at CĀB̄


def test_library_functions_pass(capsys):
    check.zoh(discretize.zoh)
    check.bilinear(discretize.bilinear)
    check.ssm_kernel(discretize.ssm_kernel)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all(line.startswith("✓") for line in out)


@pytest.mark.parametrize("wrong", [discretize.euler, discretize.zoh_simplified, discretize.bilinear,
                                   slip_zoh])
def test_zoh_rejects(wrong):
    with pytest.raises(AssertionError, match="zoh"):
        check.zoh(wrong)


def test_bilinear_rejects_zoh():
    with pytest.raises(AssertionError):
        check.bilinear(discretize.zoh)


def test_kernel_rejects_off_by_one_and_reports_index():
    with pytest.raises(AssertionError, match="first wrong index"):
        check.ssm_kernel(kernel_off_by_one)


def test_not_implemented_passes_through():
    def stub(A, B, delta):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        check.zoh(stub)


def test_crash_becomes_assertion_naming_the_case():
    with pytest.raises(AssertionError, match="raised ZeroDivisionError on diagonal A"):
        check.zoh(lambda A, B, delta: 1 / 0)


def test_hardcoded_answer_fails():
    """Fresh random inputs each run: an answer captured from one run fails the next."""
    captured = {}

    def record(A, B, delta):
        out = discretize.zoh(A, B, delta)
        captured.setdefault(len(captured), out)
        return out

    check.zoh(record)
    replay = iter(captured.values())
    with pytest.raises(AssertionError):
        check.zoh(lambda A, B, delta: next(replay))


def expm1_over_x_zoh(A, B, delta):
    """The shipped solution before issue 19: expm1(x)/x with no guard, NaN where ΔA = 0."""
    delta = torch.as_tensor(delta, dtype=A.dtype)
    if A.ndim == 1:
        dA = delta[..., None] * A
        return torch.exp(dA), torch.expm1(dA) / dA * delta[..., None] * B
    return discretize.zoh(A, B, delta)


def test_rejects_nan_where_delta_A_is_zero():
    """An integrator (a_i = 0) makes ΔA = 0: (e^x − 1)/x must be its limit 1, not 0/0."""
    with pytest.raises(AssertionError, match="integrators"):
        check.zoh(expm1_over_x_zoh)
    with pytest.raises(AssertionError, match=r"limit is 1"):
        check.zoh(expm1_over_x_zoh)
