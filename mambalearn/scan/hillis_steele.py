"""Hillis–Steele: the inclusive scan by doubling; depth ⌈log₂ l⌉, work l·log₂ l.

Round k = 1, 2, 4, …: every position t ≥ k combines with the one k steps earlier,

    x_t ← x_{t−k} ⊗ x_t                       (x_{t−k} is the earlier step: it goes on the left)

After the round with stride k, x_t holds the composition of the 2k steps ending at t (or of all
steps from 0 if there are fewer), so after ⌈log₂ l⌉ rounds x_t = s_0 ⊗ … ⊗ s_t and its u part is
h_t. Every round touches nearly all l positions: more total work than the sequential loop, but the
l combines of a round are independent, which is what a GPU wants.

Hillis & Steele, "Data parallel algorithms" (1986); ⊗ is ``mambalearn.ops.combine``.
"""

import torch

from mambalearn.ops import combine
from mambalearn.scan.layout import time_first


def hillis_steele_scan(a, b, dim=-1, reverse=False, counter=None):
    """Inclusive h_t = a_t h_{t−1} + b_t (h_{−1} = 0) for every t, by doubling rounds of ⊗.

    Shapes:
        a: broadcastable to b (diagonal or scalar decays), or (..., l, n, n) for b (..., l, n)
        b: (..., l, ...), time on ``dim``
        returns h shaped like b. ``reverse=True``: h_t = a_t h_{t+1} + b_t, h_l = 0.
        counter: optional ``ScanCounter``; each round adds its number of ⊗ applications.
    """
    A, U, restore = time_first(a, b, dim, reverse)  # (l, ...)
    l, k = U.shape[0], 1
    while k < l:
        # all t ≥ k at once: (A, U)[t] ← (A, U)[t−k] ⊗ (A, U)[t]
        A_new, U_new = combine((A[:-k], U[:-k]), (A[k:], U[k:]))  # (l−k, ...)
        A, U = torch.cat([A[:k], A_new]), torch.cat([U[:k], U_new])  # (l, ...)
        if counter is not None:
            counter.add(l - k, src=list(range(l - k)), dst=list(range(k, l)), phase=f"k={k}")
        k *= 2
    return restore(U)
