"""The tree-order checker: does an operator give the same answer in *every* bracketing?

A scan may combine steps in any bracketing that keeps their time order: a left fold
(((s₀⊗s₁)⊗s₂)⊗s₃), Hillis–Steele's doubling, Blelloch's up-/down-sweep tree, or whatever order a
GPU's warps happen to use. Only an associative operator gives one answer for all of them.

Triton's CPU interpreter runs ``tl.associative_scan`` as a left fold, so a non-associative or
half-right ``combine_fn`` (say one that drops A_l in the product, (A_r, A_r·u_l + u_r)) looks right
there and fails on the GPU. This checker evaluates the candidate in many orders on random 2×2
matrices (where A₂A₁ ≠ A₁A₂, so a swapped order shows) or random vectors, against
``mambalearn.ops.fold`` of the reference ⊗.

The candidate may take ``(left, right)`` pairs like ``ops.combine``, or flat arguments
``(a_l, u_l, a_r, u_r)`` like a Triton ``combine_fn`` (a ``@triton.jit`` function is unwrapped).
"""

import random

import torch

from mambalearn import ops
from mambalearn.check import _core, _probes


def _random_steps(length, matrix, g):
    if matrix:  # 2x2 matrices: products do not commute, so order mistakes show
        return [(torch.randn(2, 2, generator=g, dtype=torch.float64),
                 torch.randn(2, generator=g, dtype=torch.float64)) for _ in range(length)]
    return [(torch.rand(3, generator=g, dtype=torch.float64) + 0.5,
             torch.randn(3, generator=g, dtype=torch.float64)) for _ in range(length)]


def _random_tree(lo, hi, rnd):
    """A random bracketing of steps lo..hi-1 as nested tuples of indices."""
    if hi - lo == 1:
        return lo
    mid = rnd.randint(lo + 1, hi - 1)
    return (_random_tree(lo, mid, rnd), _random_tree(mid, hi, rnd))


def _show(tree):
    return f"s{tree}" if isinstance(tree, int) else f"({_show(tree[0])}⊗{_show(tree[1])})"


def _left(lo, hi):
    return lo if hi - lo == 1 else (_left(lo, hi - 1), hi - 1)


def _right(lo, hi):
    return lo if hi - lo == 1 else (lo, _right(lo + 1, hi))


def _arity(op):
    """2 (pairs, like ``ops.combine``) or 4 (flat, like a Triton ``combine_fn``)."""
    import inspect

    fn = getattr(op, "fn", op)
    n_args = len(inspect.signature(fn).parameters)
    if n_args not in (2, 4):
        raise AssertionError(f"a combine takes (left, right) or (a_l, u_l, a_r, u_r); "
                             f"{_core._name(op)} takes {n_args} arguments")
    return n_args


def tree_order(op, *, name=None, matrix=None, length=11, n_trees=20, g=None):
    """Check ``op`` against ``ops.combine`` in folds, random trees, Hillis–Steele and Blelloch.

    The bracketings are evaluated with the student's ``op`` (in the grading kernel, if grading), the
    truth with ``ops.fold`` here. Raises AssertionError naming the first bracketing that disagrees;
    returns the number of checks.
    """
    name = name or _core._name(op)
    takes_pairs = _arity(op) == 2
    matrix = takes_pairs if matrix is None else matrix
    g = g or _core.generator()
    rnd = random.Random(g.initial_seed())
    steps = _random_steps(length, matrix, g)
    prefixes = [ops.fold(steps[: i + 1]) for i in range(length)]  # the truth, in time order
    trees = [("the left fold (((s0⊗s1)⊗s2)⊗…)", _left(0, length)),
             ("the right fold (s0⊗(s1⊗(s2⊗…)))", _right(0, length))]
    for _ in range(n_trees):  # random bracketings, as a GPU's tree of warps might choose
        tree = _random_tree(0, length, rnd)
        trees.append((f"the bracketing {_show(tree)}", tree))
    orders = [("tree", t) for _, t in trees] + [("hs",), ("blelloch",)]
    ident = ops.identity(*steps[0])
    got = _core.probe(_probes.tree_results, op, steps, orders, ident, case="a tree-order check")
    checks = 0

    def expect(result, want, order):
        nonlocal checks
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise AssertionError(f"{name} must return a pair (A, u); got {_core.kind(result)} "
                                 f"in {order}")
        for part, x, y in zip(("A", "u"), result, want, strict=True):
            if not isinstance(x, (torch.Tensor, int, float)):
                raise AssertionError(f"{name}: the {part} part is a {_core.kind(x)} in {order}")
            _core.compare(torch.as_tensor(x, dtype=torch.float64).expand_as(y).clone(), y,
                          what=f"{name}: the {part} part", case=order, g=g)
        checks += 1

    for (desc, _), result in zip(trees, got[: len(trees)], strict=True):
        expect(result, prefixes[-1], desc)
    for i, result in enumerate(got[len(trees)]):  # the two parallel scans of chapter 04
        expect(result, prefixes[i], f"Hillis–Steele prefix {i}")
    for i, result in enumerate(got[len(trees) + 1]):
        expect(result, prefixes[i - 1] if i else ident, f"Blelloch exclusive prefix {i}")
    return checks
