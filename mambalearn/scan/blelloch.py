"""Blelloch: the work-efficient scan; up-sweep + down-sweep, depth 2·log₂ P, work 2(P−1).

The steps, padded with the identity (I, 0) to a power of two P, are the leaves of a binary tree.

    up-sweep     each node = left child ⊗ right child, level by level up to the root
                 (the root is s_0 ⊗ … ⊗ s_{P−1})
    down-sweep   each node receives E, the combine of everything before its block (the root gets
                 the identity); its left child gets E, its right child gets E ⊗ (left child)
    leaves       now hold the exclusive prefixes E_t = s_0 ⊗ … ⊗ s_{t−1}

Exclusive → inclusive without another ⊗: the inclusive prefix at t is the exclusive one at t + 1,
and at the last position it is the root. Padding at the end never changes a prefix of a real step,
and because the pad is the identity even the root is the true total.

States instead of steps on the way down: the scan starts from h_{−1} = 0, so of a prefix E only
E applied to 0, the state h entering the block, is ever used, and (E ⊗ L) applied to 0 is
L applied to h (``ops.apply``). The down-sweep therefore hands states down: the left child gets h,
the right child gets L·h (A_L h + u_L). Same tree, same result, and the A half of every
down-sweep combine (a product per node; for matrices n³ instead of n² work) is never computed.

One buffer of P + 1 states, in place (the classic layout). Slot t of ``H`` is the state between
step t − 1 and step t: H[0] = h_{−1} = 0, H[t + 1] = h_t, so the inclusive result is the view
H[1 : l + 1] and the state each step read, h_{t−1}, is H[:l]. A block of steps [s, e) enters at
slot s and leaves at slot e (``reverse=True`` runs time backwards, h_t = a_t h_{t+1} + b_t: the
block enters at e and leaves at s; H[P] = 0, H[t] = h_t).

    up-sweep     a block's (A, u) is stored at its exit slot (A in a second buffer, ``A_up``).
                 Two sibling blocks of length k share their middle slot; the first (in scan
                 order) leaves there, the second leaves where the parent leaves, so the parent is
                 written over the second child, and first children are never overwritten.
    down-sweep   top down, the state entering a pair of siblings (already in H) gives the state
                 at their middle slot, A_first h + u_first, written over u_first.

Memory passes (one pass = reading or writing every element of an (l, …) tensor once): the up-sweep
reads 3 and writes 1 half-tensor for u = A₂u₁ + u₂ (``torch.addcmul``) and reads 2, writes 1 for
A = A₂A₁ per level, 7 passes in all; the down-sweep reads 3 and writes 1 half-tensor at the leaves
and half that above, 4 passes: 11 in all. (The version before this one made a new tensor per level,
with separate multiply and add, and interleaved the down-sweep with ``torch.stack``: 21 passes,
and autograd through every level added 68 in the backward.)

The backward (:class:`BlellochScan`) is a Blelloch scan too: for a loss with g_t = ∂ℒ/∂h_t,

    dh_t = g_t + a_{t+1} dh_{t+1}     (the same scan run the other way, the gate shifted by one)
    ∂ℒ/∂b_t = dh_t,   ∂ℒ/∂a_t = dh_t h_{t−1}   (matrices: dh_t h_{t−1}ᵀ, the gate transposed)

(chapter 07 derives them; ``mambalearn.autograd.scan_backward`` is the loop version). It keeps
only a and H, not the tree: 16 passes (shifted gate 2, scan 11, ∂a 3) instead of autograd through
every level.

Blelloch, "Prefix sums and their applications" (1990); ⊗ is ``mambalearn.ops.combine``.
"""

import torch
from torch.autograd.function import once_differentiable

from mambalearn import ops
from mambalearn.scan.layout import is_matrix, time_first


def blelloch_scan(a, b, dim=-1, reverse=False, pad=True, counter=None):
    """Inclusive h_t = a_t h_{t−1} + b_t (h_{−1} = 0) for every t, by up-sweep and down-sweep.

    Shapes: as ``hillis_steele_scan``: a broadcastable to b (diagonal), or (..., l, n, n) matrices
    for b (..., l, n); b (..., l, ...) with time on ``dim``; returns h shaped like b.
    ``pad=False`` refuses a length that is not a power of two (ValueError) instead of padding it
    with identity steps. ``counter``: optional ``ScanCounter`` (work, depth, the tree's pairs, as
    positions in scan order). Differentiable through :class:`BlellochScan` (saves a and h only).
    """
    A, U, restore = time_first(a, b, dim)  # (l, ...): no flip, the sweeps run either way
    l = U.shape[0]
    P = 1 << (l - 1).bit_length()  # the next power of two ≥ l
    if P != l and not pad:
        raise ValueError(f"blelloch_scan(pad=False) needs a power-of-two length; got l={l} "
                         f"on dim={dim} (pad=True pads to {P} with identity steps)")
    return restore(BlellochScan.apply(A, U, reverse, counter))  # (l, ...) → b's layout


class BlellochScan(torch.autograd.Function):
    """h = scan(A, U) over dim 0 by up-/down-sweep; its backward is the same scan run the other way.

    ``BlellochScan.apply(A, U, reverse=False, counter=None)``. Shapes: A, U time first (l, ...),
    A of U's shape (diagonal) or (l, ..., n, n) for U (l, ..., n) (matrix); returns h (l, ...), a
    view of the state buffer H (P + 1, ...). Saved for the backward: A and H.
    """

    @staticmethod
    def forward(ctx, A, U, reverse=False, counter=None):
        H = scan_states(A, U, reverse, counter)  # (P+1, ...)
        ctx.save_for_backward(A, H)
        ctx.reverse = reverse
        return inclusive(H, U.shape[0], reverse)  # (l, ...), a view: no copy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_h):
        A, H = ctx.saved_tensors
        l, reverse = A.shape[0], ctx.reverse
        # dh_t = g_t + a_{t+1} dh_{t+1}: a scan the other way, gate a_{t+1} (reverse: a_{t−1})
        matrix = is_matrix(A, H)
        G = scan_states(_shifted_gate(A, reverse, matrix), grad_h, not reverse)  # (P+1, ...)
        dh = inclusive(G, l, not reverse)  # (l, ...) = ∂ℒ/∂b, a view of G
        grad_A = None
        if ctx.needs_input_grad[0]:
            h_prev = inclusive(H, l, not reverse)  # what each step read: h_{t−1} (rev. h_{t+1})
            grad_A = dh[..., :, None] * h_prev[..., None, :] if matrix else dh * h_prev
        return grad_A, dh, None, None


def scan_states(A, U, reverse=False, counter=None):
    """The P + 1 states of the scan of (A, U) (time first, length l padded to P): H (P+1, ...).

    H[0] = 0, H[t+1] = h_t (reverse: H[P] = 0, H[t] = h_t); read the result with ``inclusive``.
    """
    l = U.shape[0]
    P = 1 << (l - 1).bit_length()
    if P != l:  # identity steps at the end: a scan either way leaves the real steps unchanged
        A_id, U_id = ops.identity(A[: P - l], U[: P - l])  # (P−l, ...): P − l < l always
        A, U = torch.cat([A, A_id]), torch.cat([U, U_id])  # (P, ...)
    dtype = torch.promote_types(A.dtype, U.dtype)
    H = U.new_empty((P + 1, *U.shape[1:]), dtype=dtype)  # the states, slot by slot
    A_up = A.new_empty((P + 1, *A.shape[1:]), dtype=dtype)  # the blocks' A (only even slots used)
    H[P if reverse else 0] = 0  # the state entering the root's block
    up_sweep(A, U, H, A_up, reverse, counter)
    down_sweep(A, U, H, A_up, reverse, counter)
    return H


def inclusive(H, l, reverse=False):
    """h_0 … h_{l−1} from the state buffer: H[1 : l+1] (reverse: H[:l]). A view.  (l, ...)

    ``inclusive(H, l, not reverse)`` is the other window: the state each step read.
    """
    return H[:l] if reverse else H[1 : l + 1]


def up_sweep(A, U, H, A_up, reverse=False, counter=None):
    """Each block of 2k steps = first child ⊗ second child (scan order), stored at its exit slot.

    A, U (P, ...) are the leaves (read only); H and A_up (P+1, ...) receive the blocks' u and A.
    Afterwards the root's u, the state after all P steps, sits in H at slot P (reverse: 0).
    """
    P, matrix = H.shape[0] - 1, is_matrix(A, U)
    if P == 1:  # one step: the leaf is the root
        H[_exits(1, P, reverse)] = U
    k = 1
    while k < P:
        A_k, U_k = _level(A, U, H, A_up, k, reverse)  # the P/k children: (P/k, ...)
        (A_1, U_1), (A_2, U_2) = _siblings(A_k, U_k, reverse)  # (P/2k, ...) each
        parent = _exits(2 * k, P, reverse)  # = the second children's slots: written over them
        _apply_into(A_2, U_1, U_2, out=H[parent])  # u = A₂u₁ + u₂
        _compose_into(A_2, A_1, A_up[parent], matrix)  # A = A₂A₁
        if counter is not None:
            ends = range(2 * k - 1, P, 2 * k)
            counter.add(len(ends), src=[t - k for t in ends], dst=list(ends), phase="up-sweep")
        k *= 2


def down_sweep(A, U, H, A_up, reverse=False, counter=None):
    """Hand every block the state entering it, top down; fills H (P+1, ...) with every h_t.

    The root enters with H[0] = h_{−1} = 0 (reverse: H[P] = 0). A pair of siblings entered with
    state h: the first (in scan order) gets h, the second A₁h + u₁ (the state after the first),
    which is the state at the slot between them.
    """
    P = H.shape[0] - 1
    k = P // 2
    while k >= 1:
        A_k, U_k = _level(A, U, H, A_up, k, reverse)  # (P/k, ...)
        (A_1, U_1), _ = _siblings(A_k, U_k, reverse)  # (P/2k, ...)
        h = H[_exits(2 * k, P, not reverse)]  # the state entering each pair: (P/2k, ...)
        _apply_into(A_1, h, U_1, out=H[k:P : 2 * k])  # into the middle slots (over u₁ if k ≥ 2)
        if counter is not None:
            ends = range(2 * k - 1, P, 2 * k)
            counter.add(len(ends), src=[t - k for t in ends], dst=list(ends), phase="down-sweep")
        k //= 2


def _exits(k, P, reverse):
    """The slots where the blocks of k steps are left: k, 2k, …, P (reverse: 0, k, …, P − k)."""
    return slice(0, P, k) if reverse else slice(k, P + 1, k)


def _level(A, U, H, A_up, k, reverse):
    """The (A, u) of the P/k blocks of k steps, in time order: the leaves for k = 1, else views
    of what the up-sweep stored at the blocks' exit slots."""
    if k == 1:
        return A, U
    s = _exits(k, H.shape[0] - 1, reverse)
    return A_up[s], H[s]


def _siblings(A, U, reverse):
    """((A₁, u₁), (A₂, u₂)): the first and second child of each pair, in scan order."""
    even, odd = (A[0::2], U[0::2]), (A[1::2], U[1::2])
    return (odd, even) if reverse else (even, odd)


def _apply_into(A, h, u, out):
    """``ops.apply((A, u), h)`` = A h + u, written into ``out`` (may be u itself): one pass."""
    if is_matrix(A, u):
        return torch.add(u, (A @ h[..., None])[..., 0], out=out)
    return torch.addcmul(u, A, h, out=out)  # u + A·h in one kernel (ops.apply: two)


def _compose_into(A_2, A_1, out, matrix):
    """The A half of ``ops.combine``: A₂A₁ (the later step on the left), written into ``out``
    (may be A₂ itself: elementwise that is safe; a matrix product goes through a temporary)."""
    return out.copy_(A_2 @ A_1) if matrix else torch.mul(A_2, A_1, out=out)


def _shifted_gate(A, reverse, matrix):
    """The backward scan's gate: A_{t+1} (reverse: A_{t−1}), zero where it falls off the end;
    matrices transposed (∂ℒ/∂h_{t−1} gets A_tᵀ ∂ℒ/∂h_t). A new tensor: one copy.  (l, ...)"""
    A = A.mT if matrix else A
    out = torch.empty(A.shape, dtype=A.dtype, device=A.device)
    src, dst, edge = (A[:-1], out[1:], out[:1]) if reverse else (A[1:], out[:-1], out[-1:])
    dst.copy_(src)
    edge.zero_()
    return out
