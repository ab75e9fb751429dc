"""Chapter 03 checks pass the library ⊗ and fold, and reject plausible wrong ones."""

import pytest
import torch

from mambalearn import check, ops


def test_library_passes(capsys):
    check.combine(ops.combine)
    check.fold(ops.fold)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line.startswith("✓") for line in out)


def _matmul(A, u):
    return (A @ u[..., None])[..., 0] if ops._is_matrix(A, u) else A * u


def _prod(X, Y):  # X·Y for scalars, diagonals (elementwise) and matrices
    return X @ Y if getattr(X, "ndim", 0) == 2 else X * Y


def swapped_arguments(left, right):
    """The textbook (A₂,u₂)⊗(A₁,u₁) typed with left/right the wrong way round."""
    return ops.combine(right, left)


def swapped_product(left, right):
    """A_l·A_r instead of A_r·A_l: right in any left fold, wrong in a tree (for matrices)."""
    (A_l, u_l), (A_r, u_r) = left, right
    return _prod(A_l, A_r), _matmul(A_r, u_l) + u_r


def a1_u2(left, right):
    """A₁u₂ instead of A₂u₁."""
    (A_l, _), (A_r, u_r) = left, right
    return _prod(A_r, A_l), _matmul(A_l, u_r) + u_r


def drops_A_left(left, right):
    """(A_r, A_r·u_l + u_r): the product forgotten; a left fold of u still looks right."""
    (_, u_l), (A_r, u_r) = left, right
    return A_r, _matmul(A_r, u_l) + u_r


@pytest.mark.parametrize("wrong", [swapped_arguments, swapped_product, a1_u2, drops_A_left])
def test_combine_rejects(wrong):
    with pytest.raises(AssertionError, match="combine"):
        check.combine(wrong)


def test_swapped_product_passes_a_left_fold_of_u():
    """Why the tree-order checker exists: the u part of a left fold cannot see these mistakes."""
    g = torch.Generator().manual_seed(0)
    steps = [(torch.randn(2, 2, generator=g, dtype=torch.float64),
              torch.randn(2, generator=g, dtype=torch.float64)) for _ in range(6)]
    for wrong in (swapped_product, drops_A_left):
        assert torch.allclose(ops.fold(steps, wrong)[1], ops.fold(steps)[1])


def right_fold(steps, op=ops.combine):
    steps = list(steps)
    if not steps:
        raise ValueError("empty")
    acc = steps[-1]
    for s in reversed(steps[:-1]):
        acc = op(s, acc)
    return acc


def arguments_reversed(steps, op=ops.combine):
    steps = list(steps)
    if not steps:
        raise ValueError("empty")
    acc = steps[0]
    for s in steps[1:]:
        acc = op(s, acc)
    return acc


def skips_first(steps, op=ops.combine):
    steps = list(steps)
    if not steps:
        raise ValueError("empty")
    acc = steps[-1]
    for s in steps[1:-1]:
        acc = op(acc, s)
    return acc


def ignores_op(steps, op=ops.combine):
    return ops.fold(steps)


def no_error_when_empty(steps, op=ops.combine):
    return ops.fold(steps, op) if steps else None


@pytest.mark.parametrize("wrong", [right_fold, arguments_reversed, skips_first, ignores_op,
                                   no_error_when_empty])
def test_fold_rejects(wrong):
    with pytest.raises(AssertionError):
        check.fold(wrong)
