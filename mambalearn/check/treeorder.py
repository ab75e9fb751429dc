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

import inspect
import random

import torch

from mambalearn import ops
from mambalearn.check import _core


def _as_pair_op(op):
    fn = getattr(op, "fn", op)  # JITFunction -> the Python function it wraps
    n_args = len(inspect.signature(fn).parameters)
    if n_args == 4:
        return (lambda l, r: tuple(fn(*l, *r))), False
    if n_args == 2:
        return (lambda l, r: tuple(fn(l, r))), True
    raise TypeError(f"a combine takes (left, right) or (a_l, u_l, a_r, u_r); got {n_args} arguments")


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


def _eval_tree(tree, steps, op):
    if isinstance(tree, int):
        return steps[tree]
    return op(_eval_tree(tree[0], steps, op), _eval_tree(tree[1], steps, op))


def _show(tree):
    return f"s{tree}" if isinstance(tree, int) else f"({_show(tree[0])}⊗{_show(tree[1])})"


def _hillis_steele(steps, op):
    """Inclusive prefixes by doubling: x_i ← x_{i−k} ⊗ x_i for k = 1, 2, 4, …"""
    x, k = list(steps), 1
    while k < len(x):
        x = [x[i] if i < k else op(x[i - k], x[i]) for i in range(len(x))]
        k *= 2
    return x


def _blelloch(steps, op, ident):
    """Exclusive prefixes by up-sweep and down-sweep over a power-of-two padded tree."""
    n = 1 << (len(steps) - 1).bit_length()
    x = list(steps) + [ident] * (n - len(steps))
    k = 1
    while k < n:  # up-sweep: x[i] holds the combine of the block ending at i
        for i in range(2 * k - 1, n, 2 * k):
            x[i] = op(x[i - k], x[i])
        k *= 2
    x[n - 1] = ident
    while k > 1:  # down-sweep: pass prefixes down; the left child gets the parent's prefix
        k //= 2
        for i in range(2 * k - 1, n, 2 * k):
            x[i - k], x[i] = x[i], op(x[i], x[i - k])
    return x[: len(steps)]


def tree_order(op, *, name=None, matrix=None, length=11, n_trees=20, g=None):
    """Check ``op`` against ``ops.combine`` under left/right folds, random trees, Hillis–Steele, Blelloch.

    Raises AssertionError naming the first bracketing that disagrees; returns the number of checks.
    """
    name = name or _core._name(op)
    pair_op, takes_pairs = _as_pair_op(op)
    matrix = takes_pairs if matrix is None else matrix
    g = g or _core.generator()
    rnd = random.Random(g.initial_seed())
    steps = _random_steps(length, matrix, g)
    prefixes = [ops.fold(steps[: i + 1]) for i in range(length)]  # the truth, in time order
    checks = 0

    def expect(got, want, order):
        nonlocal checks
        for part, (x, y) in zip(("A", "u"), zip(got, want)):
            _core.compare(torch.as_tensor(x, dtype=torch.float64).expand_as(y).clone(), y,
                          what=f"{name}: the {part} part", case=order, g=g)
        checks += 1

    call = lambda l, r: _core.call(pair_op, l, r, case="a tree-order check")
    # 1. the two folds; a right fold already catches most order mistakes
    expect(ops.fold(steps, call), prefixes[-1], "the left fold (((s0⊗s1)⊗s2)⊗…)")
    right = steps[-1]
    for s in reversed(steps[:-1]):
        right = call(s, right)
    expect(right, prefixes[-1], "the right fold (s0⊗(s1⊗(s2⊗…)))")
    # 2. random bracketings, as a GPU's tree of warps might choose
    for _ in range(n_trees):
        tree = _random_tree(0, length, rnd)
        expect(_eval_tree(tree, steps, call), prefixes[-1], f"the bracketing {_show(tree)}")
    # 3. the two parallel scans of chapter 04, every prefix
    for i, got in enumerate(_hillis_steele(steps, call)):
        expect(got, prefixes[i], f"Hillis–Steele prefix {i}")
    ident = ops.identity(*steps[0])
    for i, got in enumerate(_blelloch(steps, call, ident)):
        expect(got, prefixes[i - 1] if i else ident, f"Blelloch exclusive prefix {i}")
    return checks
