"""Blelloch: the work-efficient scan; up-sweep + down-sweep, depth 2·log₂ P, work 2(P−1) ⊗.

The steps, padded with the identity (I, 0) to a power of two P, are the leaves of a binary tree.

    up-sweep     each node = left child ⊗ right child, level by level up to the root
                 (the root is s_0 ⊗ … ⊗ s_{P−1})
    down-sweep   each node receives E, the combine of everything before its block (the root gets
                 the identity); its left child gets E, its right child gets E ⊗ (left child)
    leaves       now hold the exclusive prefixes E_t = s_0 ⊗ … ⊗ s_{t−1}

Exclusive → inclusive without another ⊗: the inclusive prefix at t is the exclusive one at t + 1,
and at the last position it is the root. Padding at the end never changes a prefix of a real step,
and because the pad is the identity even the root is the true total.

In place, on one array of P entries (as the classic pseudocode does), node values overwrite each
other; here each level is its own tensor (the even and odd entries of the level below, taken as
views), so nothing is overwritten and autograd can differentiate through the scan.

Blelloch, "Prefix sums and their applications" (1990); ⊗ is ``mambalearn.ops.combine``.
"""

import torch

from mambalearn import ops
from mambalearn.ops import combine
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
    E_A, E_U = down_sweep(levels, ops.identity(*root), counter)  # exclusive prefixes: (P, ...)
    # inclusive at t = exclusive at t + 1; at t = P − 1 it is the root
    H = torch.cat([E_U[1:], root[1][None]]) if l == P else E_U[1 : l + 1]
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
        A, U = combine((A[0::2], U[0::2]), (A[1::2], U[1::2]))  # (m/2, ...)
        if counter is not None:
            ends = range(2 * k - 1, len(levels[0][1]), 2 * k)
            counter.add(U.shape[0], src=[t - k for t in ends], dst=list(ends), phase="up-sweep")
        k *= 2
    return levels, (A[0], U[0])


def down_sweep(levels, identity, counter=None):
    """Hand every node the combine of all steps before its block; returns the leaves' (A, U).

    A node with prefix E passes E to its left child and E ⊗ (left child) to its right child.
    """
    E_A, E_U = identity[0][None], identity[1][None]  # the root: nothing before it. (1, ...)
    for A, U in reversed(levels):
        k = len(levels[0][1]) // A.shape[0]  # the children's block length
        R_A, R_U = combine((E_A, E_U), (A[0::2], U[0::2]))  # right children: E ⊗ left child
        E_A = torch.stack([E_A, R_A], dim=1).flatten(0, 1)  # interleave left, right: (2m, ...)
        E_U = torch.stack([E_U, R_U], dim=1).flatten(0, 1)
        if counter is not None:
            ends = range(2 * k - 1, len(levels[0][1]), 2 * k)
            counter.add(R_U.shape[0], src=[t - k for t in ends], dst=list(ends), phase="down-sweep")
    return E_A, E_U
