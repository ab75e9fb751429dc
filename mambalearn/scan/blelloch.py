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

In place, on one array of P entries (as the classic pseudocode does), node values overwrite each
other; here each level is its own tensor (the even and odd entries of the level below, taken as
views), so nothing is overwritten and autograd can differentiate through the scan.

Blelloch, "Prefix sums and their applications" (1990); ⊗ is ``mambalearn.ops.combine``.
"""

import torch

from mambalearn import ops
from mambalearn.scan.layout import time_first


def blelloch_scan(a, b, dim=-1, reverse=False, pad=True, counter=None):
    """Inclusive h_t = a_t h_{t−1} + b_t (h_{−1} = 0) for every t, by up-sweep and down-sweep.

    Shapes: as ``hillis_steele_scan``: a broadcastable to b (diagonal), or (..., l, n, n) matrices
    for b (..., l, n); b (..., l, ...) with time on ``dim``; returns h shaped like b.
    ``pad=False`` refuses a length that is not a power of two (ValueError) instead of padding it
    with identity steps. ``counter``: optional ``ScanCounter`` (work, depth, the tree's pairs).
    """
    A, U, restore = time_first(a, b, dim, reverse)  # (l, ...)
    l = U.shape[0]
    P = 1 << (l - 1).bit_length()  # the next power of two ≥ l
    if P != l:
        if not pad:
            raise ValueError(f"blelloch_scan(pad=False) needs a power-of-two length; got l={l} "
                             f"on dim={dim} (pad=True pads to {P} with identity steps)")
        A_id, U_id = ops.identity(A[: P - l], U[: P - l])  # (P−l, ...): P − l < l always
        A, U = torch.cat([A, A_id]), torch.cat([U, U_id])  # (P, ...)
    levels, root = up_sweep(A, U, counter)
    h_in = down_sweep(levels, root, counter)  # the state entering each step, h_{t−1}: (P, ...)
    # inclusive h_t = the state entering step t + 1; after the last step it is the root's u
    H = torch.cat([h_in[1:], root[1][None]]) if l == P else h_in[1 : l + 1]
    return restore(H)


def up_sweep(A, U, counter=None):
    """Combine neighbours level by level. Returns (levels, root): levels[j] = the (A, U) of level j.

    Level 0 is the leaves (P, ...); level j has P/2^j nodes, node m = the combine of the 2^j steps
    ending at time (m+1)·2^j − 1.
    """
    levels, k = [], 1
    while U.shape[0] > 1:
        levels.append((A, U))
        # the left child (earlier steps) goes on the left of ⊗
        A, U = ops.combine((A[0::2], U[0::2]), (A[1::2], U[1::2]))  # (m/2, ...)
        if counter is not None:
            ends = range(2 * k - 1, len(levels[0][1]), 2 * k)
            counter.add(U.shape[0], src=[t - k for t in ends], dst=list(ends), phase="up-sweep")
        k *= 2
    return levels, (A[0], U[0])


def down_sweep(levels, root, counter=None):
    """Hand every node the state entering its block; returns the leaves' states h_{t−1}. (P, ...)

    The root's entering state is h_{−1} = 0. A node entered with state h passes h to its left child
    and L·h = A_L h + u_L (the state after the left child L) to its right child.
    """
    h = torch.zeros_like(root[1][None])  # h_{−1}, entering the root's block: (1, ...)
    for A, U in reversed(levels):
        k = len(levels[0][1]) // A.shape[0]  # the children's block length
        right = ops.apply((A[0::2], U[0::2]), h)  # the state after each left child: (m/2, ...)
        h = torch.stack([h, right], dim=1).flatten(0, 1)  # interleave left, right: (m, ...)
        if counter is not None:
            ends = range(2 * k - 1, len(levels[0][1]), 2 * k)
            counter.add(right.shape[0], src=[t - k for t in ends], dst=list(ends),
                        phase="down-sweep")
    return h
