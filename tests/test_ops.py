"""The ⊗ operator: laws checked on random elements, and the tree-order checker's verdicts."""

from fractions import Fraction

import pytest
import torch

from mambalearn import ops
from mambalearn.check import tree_order
from mambalearn.testing import assert_close

f64 = dict(dtype=torch.float64)


def random_step(kind, g):
    if kind == "scalar":
        return torch.randn((), generator=g, **f64), torch.randn((), generator=g, **f64)
    if kind == "diagonal":
        return torch.randn(4, generator=g, **f64), torch.randn(4, generator=g, **f64)
    return torch.randn(3, 3, generator=g, **f64), torch.randn(3, generator=g, **f64)


def assert_step_close(x, y):
    assert_close(x[0], y[0])
    assert_close(x[1], y[1])


@pytest.mark.parametrize("kind", ["scalar", "diagonal", "matrix"])
def test_associative_and_identity(kind):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    s1, s2, s3 = (random_step(kind, g) for _ in range(3))
    assert_step_close(ops.combine(ops.combine(s1, s2), s3), ops.combine(s1, ops.combine(s2, s3)))
    e = ops.identity(*s1)
    assert_step_close(ops.combine(e, s1), s1)
    assert_step_close(ops.combine(s1, e), s1)


@pytest.mark.parametrize("kind", ["scalar", "diagonal", "matrix"])
def test_combine_is_doing_one_step_then_the_next(kind):
    g = torch.Generator().manual_seed(7)
    s1, s2 = random_step(kind, g), random_step(kind, g)
    h = torch.randn_like(s1[1])
    assert_close(ops.apply(ops.combine(s1, s2), h), ops.apply(s2, ops.apply(s1, h)))


def test_exact_rationals():
    steps = [(Fraction(1, k + 2), Fraction(k, 3)) for k in range(6)]
    left = ops.fold(steps)
    right = steps[-1]
    for s in reversed(steps[:-1]):
        right = ops.combine_elementwise(*s, *right)
    assert left == right  # exact equality, no rounding anywhere


def test_matrices_do_not_commute_so_order_matters():
    g = torch.Generator().manual_seed(3)
    s1, s2 = random_step("matrix", g), random_step("matrix", g)
    assert (ops.combine(s1, s2)[0] - ops.combine(s2, s1)[0]).abs().max() > 1e-3


def test_fold_needs_steps():
    with pytest.raises(ValueError):
        ops.fold([])


WRONG = {
    "swapped order": lambda l, r: ops.combine(r, l),
    "A_1 u_2 instead of A_2 u_1":
        lambda l, r: (r[0] @ l[0], (l[0] @ r[1][..., None])[..., 0] + l[1]),
    "drops A_l from the product": lambda l, r: (r[0], (r[0] @ l[1][..., None])[..., 0] + r[1]),
}


def test_tree_order_accepts_the_real_operator_in_both_forms():
    assert tree_order(ops.combine) > 40
    assert tree_order(ops.combine_elementwise) > 40


@pytest.mark.parametrize("name", WRONG)
def test_tree_order_rejects_wrong_operators(name):
    with pytest.raises(AssertionError):
        tree_order(WRONG[name], name=name)


def test_tree_order_catches_a_u_only_bug_that_a_left_fold_hides():
    """u-part right for (prefix, single step) pairs, wrong once two composites meet (a tree)."""
    def only_u_right(a_l, u_l, a_r, u_r):
        return a_r, a_r * u_l + u_r  # forgets a_l: a left fold of u is still right

    steps = [(torch.rand(3, **f64) + 0.5, torch.randn(3, **f64)) for _ in range(6)]
    h_fold = ops.fold(steps, lambda l, r: only_u_right(*l, *r))[1]
    assert_close(h_fold, ops.fold(steps)[1])  # the interpreter-style fold looks right ...
    with pytest.raises(AssertionError):  # ... the tree-order checker does not
        tree_order(only_u_right)
