"""The cross-rank summary scan, over the wire: ring, all-gather or log-depth scan, fwd and bwd.

Each rank holds its summary s_r = (P_r, h_r) (``summary.py``) and needs H_r, the state entering
its shard; in the backward it holds g_r = ∂ℒ/∂H_r and needs Ĝ_{r+1}, the total gradient of the
state leaving it. With S the numbers in one state (b·d·n for Mamba-1, b·h·p·n for SSD) and |P| in
one decay (b·d·n, or b·h for SSD's scalar per head):

    ring       forward: rank r receives H_r from r−1, sends H_{r+1} = P_r H_r + h_r to r+1.
               R−1 messages of S numbers, one after another: latency (R−1)(α + S/β).
               backward: the same chain reversed, Ĝ_{r+1} from r+1, Ĝ_r = g_r + P_r Ĝ_{r+1} to r−1.
    allgather  forward: one all-gather of (P_r, h_r); every rank ⊗-scans the R summaries itself.
               each rank receives (R−1)(|P| + S) numbers; latency ~log₂R·α (tree) + (R−1)(|P|+S)/β.
               backward: one all-gather of g_r (the P_r are kept from the forward): (R−1)·S.
    logscan    chapter 04's Hillis–Steele scan with ranks as the elements and point-to-point
               sends as the tree's edges (what ``MPI_Exscan`` does): in round k every rank sends
               the ⊗ of the 2^k summaries it has gathered to the rank 2^k after it and combines
               what the rank 2^k before it sent. ⌈log₂R⌉ rounds of one summary (|P| + S numbers)
               each; a rank holds three summaries (its gathered ⊗, its exclusive ⊗, the one
               received), whatever R. backward: the same rounds from the last rank down, on the
               elements (P_r, g_r).

Both are wrapped as one ``torch.autograd.Function``, so autograd runs the backward collective;
rank 0 has no predecessor (its H_0 is zero here: the sequence's own initial state enters rank 0's
scan directly).
"""

import torch

from mambalearn import ops
from mambalearn.parallel import wire
from mambalearn.parallel.summary import rank_scan, sum_to


class SummaryScan(torch.autograd.Function):
    """``SummaryScan.apply(P, h, comm)`` → H, the state entering this rank (zeros on rank 0).

    Shapes: P broadcastable to h; h (..., n) float32; H like h.
    """

    @staticmethod
    def forward(ctx, P, h, comm):
        if comm.algorithm == "ring":
            H = _ring_forward(comm, P, h)
            ctx.save_for_backward(P, H)
        elif comm.algorithm == "logscan":
            H = exscan(comm, P, h)  # (..., n): the h of s_0 ⊗ ⋯ ⊗ s_{r−1}
            ctx.save_for_backward(P, H)
        else:  # all-gather the summaries, then ⊗-scan them locally (rank_scan)
            Ps, hs = _gather_pair(comm, P, h)  # (R, ...) each
            H = rank_scan(Ps, hs)[0][comm.rank]  # (..., n)
            ctx.save_for_backward(Ps, H)
        ctx.comm, ctx.P_shape = comm, P.shape
        return H

    @staticmethod
    def backward(ctx, grad_H):
        comm = ctx.comm
        P, H = ctx.saved_tensors
        grad_H = torch.zeros_like(H) if grad_H is None else grad_H
        if comm.rank == 0:
            grad_H = torch.zeros_like(grad_H)  # rank 0 does not use its H_0 (always zero)
        if comm.algorithm == "ring":
            G_next = _ring_backward(comm, P, grad_H)
            P_own = P
        elif comm.algorithm == "logscan":  # Ĝ_{r+1}: the elements (P_j, g_j) of ranks j > r
            G_next = exscan(comm, P, grad_H, reverse=True)
            P_own = P
        else:
            gs = wire.all_gather(comm, grad_H)  # (R, ..., n): every rank's g
            G_next = _suffix(P, gs, comm.rank)
            P_own = P[comm.rank]
        grad_P = sum_to(G_next * H, ctx.P_shape)  # P_r multiplies H_r inside H_{r+1}
        return grad_P.to(P_own.dtype), G_next, None


class Tie(torch.autograd.Function):
    """``Tie.apply(out, H)`` = out, with H made part of out's graph (its gradient: zeros).

    Rank 0 does not use its H, yet its backward must take part in the exchange's collective (its
    summary's gradient comes from the later ranks); tying H to rank 0's output makes autograd run
    ``SummaryScan.backward`` there too.
    """

    @staticmethod
    def forward(ctx, out, H):
        ctx.H_like = (H.shape, H.dtype, H.device)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        shape, dtype, device = ctx.H_like
        return grad, torch.zeros(shape, dtype=dtype, device=device)


def _ring_forward(comm, P, h):
    """Receive H_r from rank r−1 (zeros on rank 0), pass H_{r+1} = P_r H_r + h_r to rank r+1."""
    H = torch.zeros_like(h) if comm.rank == 0 else wire.recv(comm, h, comm.rank - 1)
    if comm.rank < comm.world - 1:
        wire.send(comm, ops.apply((P, h), H), comm.rank + 1)  # P_r H_r + h_r = H_{r+1}
    return H


def _ring_backward(comm, P, grad_H):
    """Receive Ĝ_{r+1} from rank r+1 (zeros on the last), pass Ĝ_r = g_r + P_r Ĝ_{r+1} to r−1."""
    last = comm.rank == comm.world - 1
    G_next = torch.zeros_like(grad_H) if last else wire.recv(comm, grad_H, comm.rank + 1)
    if comm.rank > 0:
        wire.send(comm, ops.apply((P, grad_H), G_next), comm.rank - 1)  # Ĝ_r = g_r + P_r Ĝ_{r+1}
    return G_next


def exscan(comm, P, x, reverse=False):
    """The u of (P_0, x_0) ⊗ ⋯ ⊗ (P_{r−1}, x_{r−1}) on rank r (zeros on rank 0), by Hillis–Steele
    over point-to-point sends in ⌈log₂R⌉ rounds; ``reverse``: the ranks after r, last one first.

    Shapes: P broadcastable to x (..., n) (the same on every rank) → like x. Applied to a zero
    state the exclusive ⊗ is its u part: the state entering rank r (forward), or Ĝ_{r+1}, the
    gradient leaving it (backward, where the later ranks are the earlier steps).
    """
    R = comm.world
    pos = R - 1 - comm.rank if reverse else comm.rank  # this rank's place in the scan's order
    rank_at = lambda i: None if i is None else (R - 1 - i if reverse else i)
    k_P = P.numel()
    incl, excl, step = (P, x), None, 1  # incl: places pos−step+1 … pos; excl: … pos−1
    while step < R:
        to = pos + step if pos + step < R else None
        frm = pos - step if pos - step >= 0 else None
        flat = torch.cat([incl[0].expand_as(P).reshape(-1).to(x.dtype), incl[1].reshape(-1)])
        got = wire.send_recv(comm, flat, rank_at(to), rank_at(frm))  # (|P| + S,) or None
        if got is not None:  # the ⊗ of the `step` places before incl's: earlier, so on the left
            left = (got[:k_P].view(P.shape), got[k_P:].view(x.shape))
            excl = left if excl is None else ops.combine(left, excl)
            incl = ops.combine(left, incl)
        step *= 2
    return torch.zeros_like(x) if excl is None else excl[1]


def _gather_pair(comm, P, h):
    """One all-gather of both parts of the summary, packed into one flat buffer."""
    flat = torch.cat([P.reshape(-1).to(h.dtype), h.reshape(-1)])  # (|P| + S,)
    both = wire.all_gather(comm, flat)  # (R, |P| + S)
    k = P.numel()
    return both[:, :k].reshape(-1, *P.shape), both[:, k:].reshape(-1, *h.shape)


def _suffix(Ps, gs, rank):
    """Ĝ_{rank+1} = Σ_{j>rank} (P_{rank+1} ⋯ P_{j−1}) g_j: the ⊗-scan of (P_j, g_j) from the end.

    Reversed, the elements are in time order for ``rank_scan``: the state entering position
    R−1−rank of the reversed sequence is exactly the total gradient leaving ``rank``.
    """
    R = gs.shape[0]
    if rank == R - 1:
        return torch.zeros_like(gs[0])
    G, _ = rank_scan(Ps.flip(0), gs.flip(0))  # (R, ...): G[i] after elements R−1 … R−i
    return G[R - 1 - rank]
