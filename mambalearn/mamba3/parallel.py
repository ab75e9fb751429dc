"""Mamba-3 with the sequence split over ranks: chapter 14's context parallelism, two more carries.

A Mamba-3 head is chapter 14's SSD case (one decay per head, a (p, n) state) plus two things that
reach across a shard boundary besides the state:

    the angle   θ_t = θ_{t−1} + Δ_t ω_t runs through the whole sequence: rank r's rotations start
                from θ_r = θ_{−1} + Φ_0 + ⋯ + Φ_{r−1}, Φ_j = Σ_{t∈j} Δ_t π tanh(Angles_t) its
                shard's total turn — an exclusive scan of sums (⊗ with P = 1), b·h·na numbers;
    the carry   the trapezoid's β_t v_{t−1} k_{t−1}ᵀ reads the *previous* token, so rank r's first
                step needs rank r−1's last k (rotated by its last angle) and v: a halo of one
                token. It takes the place of chapter 14's conv halo of k−1 tokens (no conv here).

Given θ_r and the carry, the state is linear as before, and the five steps are:

    1. angles    θ_r by ``exchange.SummaryScan`` on (1, Φ_r) (rank 0: (1, θ_{−1} + Φ_0))
    2. halo      rank r−1's (R(θ_r)(K_last + K_bias), V_last), one ``batch_isend_irecv``
    3. summary   rank r ≥ 1 scans its shard from (θ_r, 0, k_prev, v_prev): its last state h_r
    4. states    H_r by ``SummaryScan`` on (P_r, h_r), P_r = e^{Σ_{t∈r} ADT_t} (ring, all-gather or
                 log-depth scan: chapter 14's ``algorithm``)
    5. fix-up    rank r ≥ 1 scans again from (θ_r, H_r, k_prev, v_prev): Input_States, the four
                 states mamba_ssm's kernels take; rank 0 scanned once, from the sequence's own.

"alltoall" re-shards tokens → heads instead (R | h; Q and K all-gathered over time) and scans the
whole sequence per head. Every collective runs in the same order on every rank, forward and
backward (rank 0 ties its unused halo and states into its graph, as ``exchange.Tie`` explains).
:func:`mamba3_mixer_cp` runs chapter 13's Mamba-3 block on a shard (``ContextParallelLM``).
"""

import inspect
import math

import torch

from mambalearn import model as M
from mambalearn.mamba3 import mixer as _mixer  # noqa: F401  (registers the backends by name)
from mambalearn.mamba3.reference import (
    angle_rates,
    check_inputs,
    compute_dtype,
    per_head,
    rotate_pairs,
)
from mambalearn.parallel import wire
from mambalearn.parallel.block import Halo, register_mixer
from mambalearn.parallel.exchange import SummaryScan, Tie
from mambalearn.parallel.reshard import GatherTime, Reshard, from_root, select_groups

TWO_PI = 2 * math.pi
TIME = {"Q": 1, "K": 1, "V": 1, "Z": 1, "Angles": 1, "ADT": 2, "DT": 2, "Trap": 2}  # time dims
SAME = ("b", "h", "p", "g", "n", "na", "dtype", "D", "Z", "last", "backend", "chunk", "grads")


def resolve_mamba3(backend, device):
    """A scan with ``mamba3_siso_combined``'s signature: ``backend`` if callable, else by name
    (None: "triton" on a GPU, "chunked" on a CPU)."""
    if callable(backend):
        return backend
    return M.resolve(backend or ("triton" if device.type == "cuda" else "chunked"), "mamba3")


def scan(fn, x, states, chunk_size, **over):
    """``fn`` on the inputs ``x`` (a dict, with ``over`` replacing some) from ``states`` →
    (out, angle, ssm, k, v)."""
    kw = {**x, **over, "Input_States": states, "return_final_states": True}
    if "chunk_size" in inspect.signature(fn).parameters:
        kw["chunk_size"] = chunk_size
    return fn(**kw)


NAMES = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "Angles", "D", "Z")


def _meta(x, states, chunk_size, last, backend):
    """This rank's description of its inputs (after ``check_inputs`` passed), for ``agree``."""
    (b, l, h, p), (g, n), na = x["V"].shape, x["Q"].shape[2:], x["Angles"].shape[3]
    return dict(l=l, b=b, h=h, p=p, g=g, n=n, na=na, dtype=str(x["V"].dtype),
                D=x["D"] is not None, Z=x["Z"] is not None, init=states is not None,
                last=bool(last), chunk=int(chunk_size),
                backend=getattr(backend, "__name__", str(backend)),
                grads=wire.requires_grad(torch.is_grad_enabled(), *x.values()))


def mamba3_siso_combined_cp(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None,
                            Input_States=None, chunk_size=64, return_final_states=False,
                            group=None, algorithm="allgather", backend=None):
    """Mamba-3 SISO (``mambalearn.mamba3.reference``'s formula) with the tokens split over ranks.

    Shapes (this rank's shard of l_r tokens; ``mamba3_siso_combined``'s layouts):
        Q, K (b, l_r, g, n);  V, Z (b, l_r, h, p);  ADT, DT, Trap (b, h, l_r);
        Angles (b, l_r, h, na);  Q_bias, K_bias (h, n), D (h,) — the same on every rank
        Input_States: (angle, ssm, k, v) before the sequence, on rank 0 only (None elsewhere)
        returns out (b, l_r, h, p), or (out, angle, ssm, k, v): the states after this rank's
        last token (on the last rank: the whole sequence's).

    group, algorithm ("ring" | "allgather" | "logscan" | "alltoall"): as ``selective_scan_cp``;
    backend: a name of ``model.BACKENDS["mamba3"]`` or a function with that signature. Gradients
    flow to every tensor; Q_bias, K_bias and D get this rank's part (all-reduce them).
    """
    comm = wire.comm_for(group, algorithm)
    x = dict(zip(NAMES, (Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z), strict=True))
    meta, err = {}, wire.capture(check_inputs, *x.values(), Input_States)
    if err is None:
        meta = _meta(x, Input_States, chunk_size, return_final_states, backend)
        if Input_States is not None and comm.rank != 0:
            err = ("Input_States is the state before the sequence's first token: pass it on "
                   "rank 0 only (None on the other ranks)")
    metas = wire.agree(comm, meta, err, same=SAME)
    wire.check_split(metas)
    fn = resolve_mamba3(backend, V.device)
    if algorithm == "alltoall":
        out = _alltoall(comm, metas, fn, x, Input_States, chunk_size, return_final_states)
    else:
        out = _summaries(comm, fn, x, Input_States, chunk_size)
    return out if return_final_states else out[0]


def _summaries(comm, fn, x, states, chunk_size):
    """Steps 1–5 of the module docstring."""
    f = compute_dtype(x["Q"], x["V"], x["DT"], x["Angles"])
    b, h = x["V"].shape[0], x["V"].shape[2]
    # 1. the angle entering this rank: an exclusive scan of the shards' turns
    turn = angle_rates(x["Angles"].to(f), x["DT"].to(f)).sum(1)  # (b, h, na): Φ_r
    theta0 = torch.zeros_like(turn) if states is None else states[0].to(f)  # θ_{−1}
    own = theta0 + turn if comm.rank == 0 else turn
    theta = SummaryScan.apply(turn.new_ones(1, 1, 1), own, comm)  # (b, h, na), 0 on rank 0
    theta = theta + theta0 if comm.rank == 0 else theta  # θ_r
    # 2. the halo: my last k, rotated by my last angle, and v go to rank r + 1
    k_last = rotate_pairs(per_head(x["K"][:, -1:].to(f), h)[:, 0] + x["K_bias"].to(f),
                          torch.remainder(theta + turn, TWO_PI))  # (b, h, n)
    mine = torch.cat([k_last.flatten(1), x["V"][:, -1].to(f).flatten(1)], 1)[..., None]
    got = Halo.apply(mine, comm, 1)[..., 0]  # (b, h·(n + p)): rank r−1's
    k_prev, v_prev = got.split([k_last[0].numel(), x["V"][0, 0].numel()], 1)
    k_prev, v_prev = k_prev.view_as(k_last), v_prev.view(b, h, -1)  # (b, h, n), (b, h, p)
    P = torch.exp(x["ADT"].to(f).sum(-1))[..., None, None]  # (b, h, 1, 1): e^{Σ ADT}
    if comm.rank == 0:  # its entering states are known: one scan, its last state the summary
        out, *finals = scan(fn, x, states, chunk_size)
        h_r = Tie.apply(finals[1], got)  # the unused halo joins the graph before the states
        return (Tie.apply(out, SummaryScan.apply(P, h_r, comm)), *finals)
    angle = torch.remainder(theta, TWO_PI)
    # 3. the summary: this shard from zero state, the carry's β term included
    zero = torch.zeros(b, h, x["V"].shape[-1], x["Q"].shape[-1], dtype=f, device=x["V"].device)
    h_r = scan(fn, x, (angle, zero, k_prev, v_prev), chunk_size, D=None, Z=None)[2]
    # 4. the state entering this rank, 5. the fix-up scan from all four states
    H = SummaryScan.apply(P, h_r.to(f), comm)  # (b, h, p, n)
    return scan(fn, x, (angle, H, k_prev, v_prev), chunk_size)


def _alltoall(comm, metas, fn, x, states, chunk_size, return_final):
    """Re-shard to h/R heads × all tokens, scan, re-shard back (module docstring)."""
    R, m = comm.world, metas[0]
    if m["h"] % R:
        raise ValueError(f"algorithm 'alltoall' splits the h = {m['h']} heads over {R} ranks: "
                         f"{R} must divide h (use 'allgather', 'logscan' or 'ring')")
    lengths, hc = [mt["l"] for mt in metas], m["h"] // R
    hs = slice(comm.rank * hc, (comm.rank + 1) * hc)  # this rank's heads
    names = [k for k in ("V", "Z", "Angles", "ADT", "DT", "Trap") if x[k] is not None]
    specs = [(lengths, TIME[k], 3 - TIME[k]) for k in names]  # (lengths, time dim, head dim)
    moved = dict(zip(names, Reshard.apply(comm, specs, True, *(x[k] for k in names)),
                     strict=True))
    per_group = m["h"] // m["g"]
    for k, X in zip(("Q", "K"), GatherTime.apply(comm, lengths, [1, 1], x["Q"], x["K"]),
                    strict=True):
        moved[k] = select_groups(X, 2, hs.start, hc, per_group)  # (b, L, g', n)
    y = {**x, **moved, **{k: None if x[k] is None else x[k][hs] for k in ("Q_bias", "K_bias",
                                                                         "D")}}
    st, wide = None, compute_dtype(x["V"])  # float32 states (float64 for float64 inputs)
    if m["init"]:  # rank 0's four states, its heads to each rank (one all-to-all each)
        like = [y["V"].new_empty(m["b"], hc, s, dtype=wide)
                for s in (m["na"], m["p"] * m["n"], m["n"], m["p"])]
        flat = None if states is None else [s.flatten(2).to(wide) for s in states]
        st = [from_root(comm, None if flat is None else flat[i], like[i], 1) for i in range(4)]
        st = (st[0], st[1].unflatten(-1, (m["p"], m["n"])), st[2], st[3])
    pieces, outs, ends, t = (lengths if return_final else [sum(lengths)]), [], [], 0
    for length in pieces:  # shard by shard when every shard's final states are wanted
        cut = {k: None if y[k] is None else y[k].narrow(TIME[k], t, length) if k in TIME
               else y[k] for k in y}
        out_k, *st = scan(fn, cut, st, chunk_size)
        dtypes = [s.dtype for s in st]  # the backend's, restored below
        outs.append(out_k)
        ends.append(torch.cat([s.flatten(2).to(wide) for s in st], -1))  # (b, h/R, F)
        t += length
    back, specs = [torch.cat(outs, 1)], [(lengths, 1, 2)]  # (b, L, h/R, p)
    if return_final:  # rank k gets the states at the end of shard k, all heads
        back.append(torch.stack(ends, 1))  # (b, R, h/R, F)
        specs.append(([1] * R, 1, 2))
    back = Reshard.apply(comm, specs, False, *back)
    if not return_final:
        return (back[0],)
    angle, ssm, k, v = back[1][:, 0].split([m["na"], m["p"] * m["n"], m["n"], m["p"]], -1)
    ssm = ssm.unflatten(-1, (m["p"], m["n"]))  # (b, h, p, n)
    return (back[0], *(s.to(dt) for s, dt in zip((angle, ssm, k, v), dtypes, strict=True)))


def mamba3_mixer_cp(block, hidden, group=None, algorithm="allgather", backend=None):
    """``Mamba3Mixer.forward`` on a token shard (no cache, mask): everything per token but the
    scan, which is :func:`mamba3_siso_combined_cp` — no conv, so no conv halo.  (b, l_r, ·)"""
    y = mamba3_siso_combined_cp(**block.scan_inputs(block.in_proj(hidden)),
                                chunk_size=block.cfg.chunk_size, group=group,
                                algorithm=algorithm, backend=backend or block.cfg.backend)
    return block.out_proj(y.flatten(2))  # (b, l_r, d_model)


register_mixer("mamba3", mamba3_mixer_cp)
