"""The Mamba-1 selective scan with the sequence split over ranks (context parallelism).

Rank r holds tokens of its contiguous shard (u, delta, z, B, C: (…, l_r)); A, D, delta_bias are
the same on every rank. Together the ranks compute what one process computes on the whole
sequence, out = (C h + D x)·silu(z), h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t:

    ring, allgather,  1. rank 0 scans its shard from h_{−1}; rank r ≥ 1 scans from zero for its
    logscan           summary (P_r, h_r) only;  2. the summaries are ⊗-scanned across ranks
                      (``exchange.SummaryScan``) into H_r;  3. rank r ≥ 1 scans again from H_r
                      (the fix-up).  Forward: two scans on ranks ≥ 1, one on rank 0.
    alltoall          re-shard tokens → channels (each rank all tokens of d/R channels), scan the
                      whole sequence from h_{−1}, re-shard the output back. Needs R | d.

Backends: any scan with ``selective_scan_sequential``'s signature, by name from
``mambalearn.model.BACKENDS`` or as a function. One with an ``initial_state`` input does the
fix-up by scanning from H; one without (``mamba_ssm.selective_scan_fn``) scans from zero and
the carry is added by linearity (``summary.fix_up``). Gradients must flow through its last state.
"""

import inspect

import torch
import torch.nn.functional as F

from mambalearn.parallel import wire
from mambalearn.parallel.exchange import SummaryScan, Tie
from mambalearn.parallel.reshard import GatherTime, Reshard, from_root, select_groups
from mambalearn.parallel.summary import fix_up, shard_decay
from mambalearn.parallel.wire import requires_grad


def resolve_mamba1(backend, device):
    """A Mamba-1 scan function: ``backend`` itself if callable, else by name (None: Triton on a
    GPU, the chunked PyTorch scan on a CPU)."""
    if callable(backend):
        return backend
    from mambalearn.model import resolve

    return resolve(backend or ("triton" if device.type == "cuda" else "chunked"), "mamba1")


def takes_initial_state(fn):
    return "initial_state" in inspect.signature(fn).parameters


def scan_from(fn, u, delta, A, B, C, D, z, delta_bias, softplus, h0):
    """``fn`` from state h0 (None: zeros) → (out (b, d, l), last (b, d, n)); by linearity if
    ``fn`` has no initial-state input."""
    if h0 is None or takes_initial_state(fn):
        kw = {} if h0 is None else {"initial_state": h0}
        out, last = fn(u, delta, A, B, C, D, z, delta_bias, softplus, return_last_state=True, **kw)
        _check_last(fn, last, u, delta, A, B, C, delta_bias, h0)
        return out, last
    y, last = fn(u, delta, A, B, C, D, None, delta_bias, softplus, return_last_state=True)
    _check_last(fn, last, u, delta, A, B, C, delta_bias)
    return carry_in(y, last, u, delta, A, C, z, delta_bias, softplus, h0)


def carry_in(y, last, u, delta, A, C, z, delta_bias, softplus, H):
    """From a zero-start scan's pre-gate output y and last state to the scan from H, then gate."""
    from mambalearn.scan.sequential import compute_dtype, effective_delta

    dt = effective_delta(delta, delta_bias, softplus, compute_dtype(u, delta, A))  # (b, d, l)
    y, last = fix_up(y, last, dt, A, C, H)  # (b, d, l), (b, d, n)
    return (y if z is None else y * F.silu(z.to(y.dtype))).to(u.dtype), last


def _check_last(fn, last, *inputs):
    needs = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    if needs and not last.requires_grad:
        raise TypeError(f"backend {getattr(fn, '__name__', fn)!r} returns a last state without a "
                        f"gradient; context parallelism differentiates through it (use a backend "
                        f"whose last state is differentiable, e.g. 'chunked' or 'recompute')")


def _local_error(rank, u, delta, A, B, C, D, z, delta_bias, initial_state):
    from mambalearn.scan.sequential import check_inputs

    err = wire.capture(check_inputs, u, delta, A, B, C, D, z, delta_bias, None, initial_state)
    if err is None and initial_state is not None and rank != 0:
        err = ("initial_state is the state before the sequence's first token: pass it on rank 0 "
               "only (None on the other ranks)")
    return err


def _meta(u, delta, A, B, C, D, z, delta_bias, softplus, initial_state, last, offset, backend):
    """What this rank says about its arguments (``wire.start``): every tensor's dtype and shape
    but for its time axis, the values of those that must be equal everywhere, the flags."""
    fixed = lambda X: X.ndim == 2  # (d, n): time-invariant, the same on every rank
    bc = lambda X: wire.digest(X) if fixed(X) else wire.layout(X, -1)
    return dict(l=u.shape[-1], b=u.shape[0], d=u.shape[1], n=A.shape[1],
                u=wire.layout(u, -1), delta=wire.layout(delta, -1), z=wire.layout(z, -1),
                B=bc(B), C=bc(C), A=wire.digest(A), D=wire.digest(D),
                delta_bias=wire.digest(delta_bias), softplus=bool(softplus), last=bool(last),
                init=initial_state is not None, offset=offset,
                backend=getattr(backend, "__name__", str(backend)), grads=requires_grad(
                    torch.is_grad_enabled(), u, delta, A, B, C, D, z, delta_bias))


SAME = ("b", "d", "n", "u", "delta", "z", "B", "C", "A", "D", "delta_bias", "softplus", "last",
        "backend", "grads")


def selective_scan_cp(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False, initial_state=None, group=None,
                      algorithm="allgather", backend=None, offset=None):
    """out = (C h + D x)·silu(z), h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t, split over ranks.

    Shapes (this rank's shard of l_r tokens; ``selective_scan_fn``'s layouts):
        u, delta, z:     (b, d, l_r)
        A:               (d, n);   D, delta_bias: (d,)   — the same on every rank
        B, C:            (b, n, l_r) or (b, g, n, l_r) (this rank's tokens), or (d, n) fixed
        initial_state:   (b, d, n), h_{−1} of the whole sequence: on rank 0 only (None elsewhere)
        returns out (b, d, l_r), or (out, last) with last (b, d, n) float32 the state after this
        rank's last token (on the last rank: the whole sequence's final state).

    group: the process group (None = the default one; ≥ 2 ranks, rank order = sequence order);
    algorithm: "ring", "allgather", "logscan" or "alltoall" (``wire.ALGORITHMS``); backend: a
    name of ``model.BACKENDS["mamba1"]`` or a function (None: "triton" on a GPU, "chunked" on a
    CPU);
    offset: optional index of this shard's first token, checked against the other shards.
    Gradients flow to every tensor; A, D, delta_bias get this rank's part (all-reduce them).
    Bad input raises the same ValueError on every rank — a local error, or ranks that disagree
    on the algorithm, a tensor's dtype or shape, or the values of A, D, delta_bias (or a fixed
    B, C), which must be equal everywhere.
    """
    rank = wire.comm_for(group, algorithm).rank
    err = _local_error(rank, u, delta, A, B, C, D, z, delta_bias, initial_state)
    meta = {} if err else _meta(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state,
                                return_last_state, offset, backend)
    comm, metas = wire.start(group, algorithm, meta, err, same=SAME)
    wire.check_split(metas)
    fn = resolve_mamba1(backend, u.device)  # after agree: the same name on every rank
    if initial_state is not None:  # the state's dtype, whatever it came in (rank 0 sends it)
        initial_state = initial_state.to(_state_dtype(u))
    if algorithm == "alltoall":
        out, last = _alltoall(comm, metas, fn, u, delta, A, B, C, D, z, delta_bias,
                              delta_softplus, initial_state, return_last_state)
    else:
        out, last = _summaries(comm, fn, u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                               initial_state)
    return (out, last) if return_last_state else out


def _summaries(comm, fn, u, delta, A, B, C, D, z, delta_bias, softplus, initial_state):
    """Ring, all-gather or log-depth scan: summary scan, cross-rank ⊗-scan, fix-up."""
    linear = not takes_initial_state(fn)
    if comm.rank == 0:  # its entering state is known: one scan, whose last state is its summary
        out, h = scan_from(fn, u, delta, A, B, C, D, z, delta_bias, softplus, initial_state)
    elif linear:  # one scan from zero; the carry is added by linearity below
        y, h = scan_from(fn, u, delta, A, B, C, D, None, delta_bias, softplus, None)
    else:  # from zero, for the last state only (D and the gate do not change it)
        _, h = scan_from(fn, u, delta, A, B, C, None, None, delta_bias, softplus, None)
    P = shard_decay(delta, A, delta_bias, softplus).to(h.dtype)  # (b, d, n): exp(A Σ Δ)
    H = SummaryScan.apply(P, h, comm)  # (b, d, n): the state entering this rank
    if comm.rank == 0:
        return Tie.apply(out, H), h
    if linear:
        return carry_in(y, h, u, delta, A, C, z, delta_bias, softplus, H)
    return scan_from(fn, u, delta, A, B, C, D, z, delta_bias, softplus, H)  # the fix-up scan


def _alltoall(comm, metas, fn, u, delta, A, B, C, D, z, delta_bias, softplus, initial_state,
              return_last):
    """Re-shard to d/R channels × all tokens, scan, re-shard back."""
    R, d = comm.world, metas[0]["d"]
    if d % R:
        raise ValueError(f"algorithm 'alltoall' splits the d = {d} channels over {R} ranks: "
                         f"{R} must divide d (use 'allgather' or 'ring')")
    lengths, dc = [m["l"] for m in metas], d // R
    cs = slice(comm.rank * dc, (comm.rank + 1) * dc)  # this rank's channels
    tokens = [X for X in (u, delta, z) if X is not None]
    moved = iter(Reshard.apply(comm, [(lengths, 2, 1)] * len(tokens), True, *tokens))
    u_c, delta_c = next(moved), next(moved)  # (b, d/R, L) each
    z_c = None if z is None else next(moved)
    B_c, C_c = _bc_channels(comm, B, C, lengths, cs, d)
    part = lambda X: None if X is None else X[cs]
    h = None
    if metas[0]["init"]:
        like = u_c.new_empty(u.shape[0], dc, A.shape[1], dtype=_state_dtype(u))  # (b, d/R, n)
        h = from_root(comm, initial_state, like, 1)
    # with last states wanted, scan shard by shard so the state at every shard's end exists
    pieces, outs, lasts, t = (lengths if return_last else [sum(lengths)]), [], [], 0
    for length in pieces:
        cut = lambda X, s=slice(t, t + length): None if X is None else (
            X[..., s] if X.ndim >= 3 else X)
        out_k, h = scan_from(fn, cut(u_c), cut(delta_c), A[cs], cut(B_c), cut(C_c), part(D),
                             cut(z_c), part(delta_bias), softplus, h)
        outs.append(out_k)
        lasts.append(h)
        t += length
    back = [torch.cat(outs, -1)]  # (b, d/R, L)
    specs = [(lengths, 2, 1)]
    if return_last:  # rank k gets the state at the end of shard k, all channels
        back.append(torch.stack(lasts, 2))  # (b, d/R, R, n)
        specs.append(([1] * R, 2, 1))
    back = Reshard.apply(comm, specs, False, *back)  # one all-to-all for both
    return back[0], (back[1][:, :, 0] if return_last else None)  # (b, d, l_r), (b, d, n)


def _state_dtype(u):
    return torch.float64 if u.dtype == torch.float64 else torch.float32


def _bc_channels(comm, B, C, lengths, cs, d):
    """B and C for this rank's channels and all tokens: fixed (d, n) is sliced; time-varying
    (b, n, l_r) / (b, g, n, l_r) is all-gathered over time (one all-gather for both) and cut to
    the groups these channels read."""
    varying = [X for X in (B, C) if X.ndim > 2]
    full = iter(GatherTime.apply(comm, lengths, [X.ndim - 1 for X in varying], *varying)
                if varying else ())
    out = []
    for X in (B, C):
        if X.ndim == 2:
            out.append(X[cs])  # (d/R, n)
        elif X.ndim == 3:
            out.append(next(full))  # (b, n, L)
        else:
            out.append(select_groups(next(full), 1, cs.start, cs.stop - cs.start,
                                     d // X.shape[1]))  # (b, g', n, L)
    return out
