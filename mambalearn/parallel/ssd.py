"""Mamba-2's SSD with the sequence split over ranks (context parallelism).

Chapter 10's recurrence per (batch, head): h_t = exp(Δ_t A) h_t−1 + Δ_t x_t B_tᵀ, y_t = h_t C_t.
A is one scalar per head, so a shard's summary is (P_r, h_r) with P_r = exp(A Σ_{t∈r} Δ_t) one
number per (batch, head) and h_r a (p, n) state — the decay is tiny next to the state:

    ring, allgather,  rank 0 scans from the sequence's initial state, rank r ≥ 1 from zero for
    logscan           its final state; the summaries are ⊗-scanned across ranks (R−1 hops of
                      b·h·p·n numbers, one all-gather of b·h·(1 + p·n) per rank, or ⌈log₂R⌉
                      rounds of b·h·(1 + p·n)); rank r ≥ 1 scans again from H_r
                      (``initial_states``, which the SSD kernels take).
    alltoall          re-shard tokens → heads (needs R | h), scan the whole sequence, re-shard
                      back; B and C (shared by the heads of a group) are all-gathered over time.

Backends: ``mamba_chunk_scan_combined``'s signature, by name from ``model.BACKENDS["mamba2"]``
("chunked" = the PyTorch oracle, "triton" = chapter 10's kernels) or as a function.
"""

import torch

from mambalearn.parallel import wire
from mambalearn.parallel.exchange import SummaryScan, Tie
from mambalearn.parallel.reshard import GatherTime, Reshard, from_root, select_groups
from mambalearn.parallel.summary import ssd_decay
from mambalearn.utils import check_chunk_size


def resolve_ssd(backend, device):
    """An SSD scan with ``mamba_chunk_scan_combined``'s signature (None: Triton on a GPU, the
    chunked PyTorch oracle on a CPU)."""
    if callable(backend):
        return backend
    name = backend or ("triton" if device.type == "cuda" else "chunked")
    if name == "sequential":
        raise ValueError("backend 'sequential' has ssd_sequential's signature, not "
                         "mamba_chunk_scan_combined's; use 'chunked' or 'triton'")
    from mambalearn.model import resolve

    return resolve(name, "mamba2")


def scan_from(fn, x, dt, A, B, C, chunk_size, D, z, dt_bias, softplus, dt_limit, h0):
    """``fn`` from state h0 (None: zeros) → (out (b, l, h, p), final state (b, h, p, n))."""
    out, final = fn(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=h0,
                    dt_softplus=softplus, dt_limit=dt_limit, return_final_states=True)
    needs = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, dt, A, B, C, dt_bias, h0))
    if needs and not final.requires_grad:
        raise TypeError(f"backend {getattr(fn, '__name__', fn)!r} returns final states without "
                        f"a gradient; context parallelism differentiates through them")
    return out, final


def _local_error(rank, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, dt_limit):
    from mambalearn.mamba2 import reference as ssd

    def check():
        b, l, h, p, g, n = ssd.check_inputs(x, dt, A, B, C)
        ssd.check_extras(b, l, h, p, n, D, z, dt_bias, initial_states, dt_limit=dt_limit)
        check_chunk_size(chunk_size)

    err = wire.capture(check)
    if err is None and initial_states is not None and rank != 0:
        err = ("initial_states is the state before the sequence's first token: pass it on "
               "rank 0 only (None on the other ranks)")
    return err


def _meta(x, dt, A, B, C, chunk_size, D, z, dt_bias, softplus, limit, initial_states, last,
          offset, backend):
    """What this rank says about its arguments (``wire.start``), as ``selective._meta``."""
    return dict(l=x.shape[1], b=x.shape[0], h=x.shape[2], p=x.shape[3], g=B.shape[2],
                n=B.shape[3], x=wire.layout(x, 1), dt=wire.layout(dt, 1), z=wire.layout(z, 1),
                B=wire.layout(B, 1), C=wire.layout(C, 1), A=wire.digest(A), D=wire.digest(D),
                dt_bias=wire.digest(dt_bias), chunk=chunk_size, softplus=bool(softplus),
                limit=tuple(float(v) for v in limit), last=bool(last),
                init=initial_states is not None, offset=offset,
                backend=getattr(backend, "__name__", str(backend)),
                grads=wire.requires_grad(torch.is_grad_enabled(), x, dt, A, B, C, D, z, dt_bias))


SAME = ("b", "h", "p", "g", "n", "x", "dt", "z", "B", "C", "A", "D", "dt_bias", "chunk",
        "softplus", "limit", "last", "backend", "grads")


def mamba_chunk_scan_combined_cp(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                 initial_states=None, dt_softplus=False,
                                 dt_limit=(0.0, float("inf")), return_final_states=False,
                                 group=None, algorithm="allgather", backend=None, offset=None):
    """out = SSD(x, Δ, A, B, C) + D x, ·silu(z), Δ = softplus(dt + dt_bias): split over ranks.

    Shapes (this rank's shard of l_r tokens; ``mamba_chunk_scan_combined``'s layouts):
        x, z:            (b, l_r, h, p);   dt: (b, l_r, h);   B, C: (b, l_r, g, n)
        A, dt_bias:      (h,);   D: (h,) or (h, p)          — the same on every rank
        initial_states:  (b, h, p, n), the state before the sequence: on rank 0 only
        returns out (b, l_r, h, p), or (out, final) with final (b, h, p, n) the state after
        this rank's last token (on the last rank: the whole sequence's final state).

    group, algorithm ("ring" | "allgather" | "logscan" | "alltoall"), offset: as
    ``selective_scan_cp``.
    Gradients flow to every tensor; A, D, dt_bias get this rank's part (all-reduce them).
    Bad input raises the same ValueError on every rank (as ``selective_scan_cp``; A, D and
    dt_bias must be equal everywhere).
    """
    rank = wire.comm_for(group, algorithm).rank
    err = _local_error(rank, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, dt_limit)
    meta = {} if err else _meta(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, dt_limit,
                                initial_states, return_final_states, offset, backend)
    comm, metas = wire.start(group, algorithm, meta, err, same=SAME)
    wire.check_split(metas)
    fn = resolve_ssd(backend, x.device)  # after agree: the same name on every rank
    if initial_states is not None:  # the state's dtype, whatever it came in (rank 0 sends it)
        initial_states = initial_states.to(_state_dtype(x))
    args = (chunk_size, D, z, dt_bias, dt_softplus, tuple(dt_limit))
    if algorithm == "alltoall":
        out, final = _alltoall(comm, metas, fn, x, dt, A, B, C, *args, initial_states,
                               return_final_states)
    else:
        out, final = _summaries(comm, fn, x, dt, A, B, C, *args, initial_states)
    return (out, final) if return_final_states else out


def _summaries(comm, fn, x, dt, A, B, C, chunk_size, D, z, dt_bias, softplus, limit, h0):
    """Ring, all-gather or log-depth scan: final-state scan, cross-rank ⊗-scan, fix-up from H."""
    if comm.rank == 0:
        out, h = scan_from(fn, x, dt, A, B, C, chunk_size, D, z, dt_bias, softplus, limit, h0)
    else:  # from zero, for the final state only
        _, h = scan_from(fn, x, dt, A, B, C, chunk_size, None, None, dt_bias, softplus, limit,
                         None)
    P = ssd_decay(dt, A, dt_bias, softplus, limit).to(h.dtype)  # (b, h, 1, 1)
    H = SummaryScan.apply(P, h, comm)  # (b, h, p, n): the state entering this rank
    if comm.rank == 0:
        return Tie.apply(out, H), h
    return scan_from(fn, x, dt, A, B, C, chunk_size, D, z, dt_bias, softplus, limit, H)


def _alltoall(comm, metas, fn, x, dt, A, B, C, chunk_size, D, z, dt_bias, softplus, limit, h0,
              return_final):
    """Re-shard to h/R heads × all tokens, scan, re-shard back."""
    R, nh = comm.world, metas[0]["h"]
    if nh % R:
        raise ValueError(f"algorithm 'alltoall' splits the h = {nh} heads over {R} ranks: {R} "
                         f"must divide h (use 'allgather' or 'ring')")
    lengths, hc = [m["l"] for m in metas], nh // R
    hs = slice(comm.rank * hc, (comm.rank + 1) * hc)  # this rank's heads
    tokens = [X for X in (x, dt, z) if X is not None]
    moved = iter(Reshard.apply(comm, [(lengths, 1, 2)] * len(tokens), True, *tokens))
    x_c, dt_c = next(moved), next(moved)  # (b, L, h/R, p), (b, L, h/R)
    z_c = None if z is None else next(moved)
    B_c, C_c = (select_groups(X, 2, hs.start, hc, nh // B.shape[2])  # (b, L, g', n)
                for X in GatherTime.apply(comm, lengths, [1, 1], B, C))
    part = lambda X: None if X is None else X[hs]
    state = None
    if metas[0]["init"]:
        like = x_c.new_empty(x.shape[0], hc, x.shape[3], B.shape[3], dtype=_state_dtype(x))
        state = from_root(comm, h0, like, 1)  # (b, h/R, p, n)
    pieces, outs, finals, t = (lengths if return_final else [sum(lengths)]), [], [], 0
    for length in pieces:  # shard by shard when every shard's final state is wanted
        cut = lambda X, s=slice(t, t + length): None if X is None else X[:, s]
        out_k, state = scan_from(fn, cut(x_c), cut(dt_c), A[hs], cut(B_c), cut(C_c), chunk_size,
                                 part(D), cut(z_c), part(dt_bias), softplus, limit, state)
        outs.append(out_k)
        finals.append(state)
        t += length
    back, specs = [torch.cat(outs, 1)], [(lengths, 1, 2)]  # (b, L, h/R, p)
    if return_final:
        back.append(torch.stack(finals, 1))  # (b, R, h/R, p, n)
        specs.append(([1] * R, 1, 2))
    back = Reshard.apply(comm, specs, False, *back)
    return back[0], (back[1][:, 0] if return_final else None)  # (b, l_r, h, p), (b, h, p, n)


def _state_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32
