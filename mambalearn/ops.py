"""The associative operator ⊗ on affine steps — written once, used by every scan in the course.

One step of the recurrence h_t = A_t h_{t-1} + u_t is the affine map  h ↦ A_t h + u_t, stored as
the pair (A_t, u_t). Doing step 1 then step 2 is again an affine map:

    (A₂, u₂) ⊗ (A₁, u₁) = (A₂A₁, A₂u₁ + u₂)          identity: (I, 0)

In code the arguments come in *time order*: ``combine(left, right)`` with ``left`` the earlier
step, exactly like Triton's ``combine_fn(left..., right...)`` in ``tl.associative_scan``. So

    combine((A_l, u_l), (A_r, u_r)) = (A_r·A_l, A_r·u_l + u_r)

⊗ is associative because matrix products associate and distribute over sums (chapter 03 proves
it); it is *not* commutative, so the order of the arguments matters.

A may be a scalar or a diagonal stored as a vector (Mamba: elementwise products), or a full
matrix with one more dimension than u (``A: (..., n, n)``, ``u: (..., n)``).
"""


def combine_elementwise(a_l, u_l, a_r, u_r):
    """⊗ for scalar or diagonal A, on flat arguments: (a_r·a_l, a_r·u_l + u_r).

    Only ``*`` and ``+``: the same function is jitted as the ``combine_fn`` of
    ``tl.associative_scan`` in ``mambalearn.triton.scan`` and works on tensors, floats and
    ``fractions.Fraction``.

    Shapes: a_l, u_l, a_r, u_r broadcastable to one shape s (scalars too) → two tensors of s.
    """
    return a_r * a_l, a_r * u_l + u_r


def _is_matrix(A, u):
    return getattr(A, "ndim", 0) == getattr(u, "ndim", 0) + 1


def combine(left, right):
    """(A_l, u_l) then (A_r, u_r): returns (A_r·A_l, A_r·u_l + u_r). ``left`` is the earlier step.

    Shapes: elementwise A and u of broadcastable shapes, or full A ``(..., n, n)`` with
    u ``(..., n)``; the result has the shapes of the inputs.
    """
    (A_l, u_l), (A_r, u_r) = left, right
    if _is_matrix(A_r, u_r):
        return A_r @ A_l, (A_r @ u_l[..., None])[..., 0] + u_r
    return combine_elementwise(A_l, u_l, A_r, u_r)


def identity(A, u):
    """The identity step (I, 0) shaped like the step (A, u): combine(identity, x) == x.

    Shapes: as (A, u): A (...) or (..., n, n), u (...) or (..., n).
    """
    import torch

    if _is_matrix(A, u):
        eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        return eye.expand_as(A).clone(), torch.zeros_like(u)
    return torch.ones_like(A), torch.zeros_like(u)


def apply(step, h):
    """Run one (possibly composed) step on a state: A·h + u.

    Shapes: step = (A, u) as in :func:`combine`; h shaped like u → shaped like u.
    """
    A, u = step
    if _is_matrix(A, u):
        return (A @ h[..., None])[..., 0] + u
    return A * h + u


def fold(steps, op=combine):
    """Left-to-right fold s₀ ⊗ s₁ ⊗ … in time order: ((s₀, s₁), s₂)…; the slow, obvious oracle.

    ``steps`` is a non-empty sequence of (A, u) pairs, earliest first. ``op`` lets the checkers fold
    with a student's operator.

    Shapes: every step (A, u) as in :func:`combine`, all alike → one step of those shapes.
    """
    steps = list(steps)
    if not steps:
        raise ValueError("fold needs at least one step")
    acc = steps[0]
    for step in steps[1:]:
        acc = op(acc, step)
    return acc
