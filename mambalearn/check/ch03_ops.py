"""Checks for chapter 03: ``combine`` (the ⊗ of ``mambalearn.ops``) and ``fold``."""

from fractions import Fraction

import torch

from mambalearn import ops
from mambalearn.check import _core, _probes
from mambalearn.check.treeorder import tree_order

__all__ = ["combine", "fold"]
REBUILDS = {
    "combine": ["mambalearn.ops.combine", "@elementwise combines", "mambalearn.ops.apply"],
    "fold": ["mambalearn.ops.fold"],
}

HINTS = {
    "combine": [
        "left is the earlier step: the result is (A_r·A_l, A_r·u_l + u_r), A_r on the left of both",
        "A is a matrix exactly when it has one more dim than u (getattr(A, 'ndim', 0) == "
        "getattr(u, 'ndim', 0) + 1): then use @ and (A_r @ u_l[..., None])[..., 0]; otherwise *, "
        "which also serves floats, Fractions and (..., n) batches",
    ],
    "fold": [
        "fold(steps, op) = op(…op(op(s0, s1), s2)…, sk): start from steps[0] and combine each "
        "later step on the right",
        "use the op you are given (never a fixed ⊗), one step returns that step, and no steps at "
        "all raise ValueError",
    ],
}

f64 = torch.float64


KINDS = {  # (A's shape, u's shape) for a state of n: A matrix iff it has one more dim than u
    "scalar": lambda n: ((), ()),
    "diagonal": lambda n: ((n,), (n,)),
    "matrix": lambda n: ((n, n), (n,)),
    "a (3, n) batch of diagonal": lambda n: ((3, n), (3, n)),
    "a (2, 3, n) batch of diagonal": lambda n: ((2, 3, n), (2, 3, n)),
    "a (3, n, n) batch of matrix": lambda n: ((3, n, n), (3, n)),
    "a (2, 3, n, n) batch of matrix": lambda n: ((2, 3, n, n), (2, 3, n)),
}


def _step(kind, g, n):
    """One random step (A, u) of ``kind`` (a key of ``KINDS``); diagonal A in [0.5, 1.5)."""
    shape_A, shape_u = KINDS[kind](n)
    u = torch.randn(shape_u, generator=g, dtype=f64)
    if len(shape_A) > len(shape_u):
        return torch.randn(shape_A, generator=g, dtype=f64), u
    return torch.rand(shape_A, generator=g, dtype=f64) + 0.5, u


def _steps(kind, length, g):
    n = int(torch.randint(2, 5, (1,), generator=g))
    return [_step(kind, g, n) for _ in range(length)]


def _fractions(length, g):
    ri = lambda: int(torch.randint(-9, 10, (1,), generator=g))
    return [(Fraction(ri(), abs(ri()) + 1), Fraction(ri(), abs(ri()) + 1)) for _ in range(length)]


def _same_step(got, want, what, case, g):
    if not (isinstance(got, tuple | list) and len(got) == 2):
        raise AssertionError(f"{what} must return a pair (A, u); got {_core.kind(got)} "
                             f"on {case}")
    for part, x, y in zip(("A", "u"), got, want, strict=True):
        if isinstance(y, Fraction):
            if x != y:
                raise AssertionError(f"{what}: the {part} part is wrong on {case}: expected "
                                     f"{y}, got {x} (exact arithmetic: no rounding to blame)")
        else:
            _core.compare(x, y, what=f"{what}: the {part} part", case=case, g=g)


def combine(fn):
    """Check ``fn(left, right) -> (A_r·A_l, A_r·u_l + u_r)``, ``left`` the earlier step.

    One pair for scalar, diagonal and matrix A, and batches of each, (..., n) and (..., n, n):
    A is a matrix exactly when it has one more dimension than u; exact ``Fraction``s; the identity
    laws; then ``tree_order`` on 2×2 matrices and on vectors (every bracketing must agree).
    """
    g = _core.generator()
    n_checks = 0
    for kind in KINDS:
        left, right = _steps(kind, 2, g)
        case = f"one pair with {kind} A (left = earlier step)"
        _same_step(_core.call(fn, left, right, case=case), ops.combine(left, right),
                   "combine", case, g)
        e = ops.identity(*left)
        for args, desc in (((e, left), "combine(identity, x)"),
                           ((left, e), "combine(x, identity)")):
            case = f"{desc} with {kind} A: the identity (I, 0) must change nothing"
            _same_step(_core.call(fn, *args, case=case), left, "combine", case, g)
        n_checks += 3
    left, right = _fractions(2, g)
    case = f"Fractions: left={left}, right={right}"
    _same_step(_core.call(fn, left, right, case=case), ops.combine(left, right), "combine", case, g)
    n_checks += 1
    n_checks += tree_order(fn, name="combine", matrix=True, g=g)
    n_checks += tree_order(fn, name="combine", matrix=False, g=g)
    _core.passed("combine", n_checks)


def fold(fn):
    """Check ``fn(steps, op=combine)``: the left fold ((s₀ ⊗ s₁) ⊗ s₂) ⊗ …, earliest step first.

    The ``op`` passed in is never the library's ⊗ (it is switched off while grading): labels that
    show the bracketing, and a ⊗ of the probe's own on random steps and exact Fractions.
    """
    g = _core.generator()
    n_checks = 0
    names = [f"s{i}" for i in range(4)]
    label = lambda l, r: f"({l}⊗{r})"
    for k in (1, 2, 4):
        case = f"the labels {names[:k]} with op(l, r) = '(l⊗r)'"
        got = _core.probe(_probes.fold_labels, fn, names[:k], case=case)
        want = ops.fold(names[:k], op=label)
        if got != want:
            raise AssertionError(f"fold combines in the wrong order on {case}: expected {want!r} "
                                 f"(a left fold, earlier steps on the left), got {got!r}")
        n_checks += 1
    try:
        _core.raw_probe(_probes.fold_labels, fn, [])
    except NotImplementedError:
        raise
    except ValueError:
        n_checks += 1
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"fold([]) must raise ValueError (no steps), not "
                             f"{type(e).__name__}: {e}") from e
    else:
        raise AssertionError("fold([]) must raise ValueError: there is no step to return")
    length = int(torch.randint(5, 13, (1,), generator=g))
    for kind in ("scalar", "diagonal", "matrix"):
        for n_steps in (1, 2, length):
            steps = _steps(kind, n_steps, g)
            case = f"{n_steps} random steps with {kind} A, op = ⊗"
            _same_step(_core.probe(_probes.fold_matrices, fn, steps, case=case), ops.fold(steps),
                       "fold", case, g)
            n_checks += 1
    steps = _fractions(length, g)
    case = f"{length} steps of Fractions, op = ⊗"
    _same_step(_core.probe(_probes.fold_matrices, fn, steps, case=case), ops.fold(steps), "fold",
               case, g)
    _core.passed("fold", n_checks + 1)
