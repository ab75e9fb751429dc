"""The collectives of chapter 14 (``torch.distributed``) and the checks that keep ranks in step.

Every collective is a ``torch.distributed`` call on the group (gloo or NCCL) and waits at most the
group's timeout (``init_process_group(timeout=...)``; ``parallel.spawn`` sets it). A rank whose
arguments are wrong must not simply raise: the other ranks would wait in the next collective
until the timeout. So every public function first calls :func:`start`, one ``all_gather_object``
of each rank's description of its inputs (the algorithm, every tensor's dtype and shape but for
its shard of time (:func:`layout`), a fingerprint of the values of tensors documented as equal on
every rank (:func:`digest`), flags, and the error its own checks found, if any); then every rank
checks the same list and raises the same ``ValueError``, or none does. Ranks that agree on all of
that send each other buffers of one size and dtype, so no collective can fail on one rank only.
"""

import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

ALGORITHMS = ("ring", "allgather", "logscan", "alltoall")


@dataclass(frozen=True)
class Comm:
    """Where this rank stands: its group, rank and world size in it, the algorithm chosen."""

    group: object
    rank: int
    world: int
    algorithm: str

    def peer(self, r):
        """The global rank of group rank ``r`` (what send/recv address)."""
        return r if self.group is None else dist.get_global_rank(self.group, r)


def comm_for(group, algorithm):
    """Validate the process group (the same verdict on every rank); return this rank's
    :class:`Comm`. The algorithm is checked by :func:`start`, through the all-gather."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("context parallelism needs an initialised process group: call "
                           "torch.distributed.init_process_group first (or mambalearn.parallel."
                           "spawn, which does)")
    world = dist.get_world_size(group)
    if world < 2:
        raise ValueError(f"group has {world} process; context parallelism splits the sequence "
                         f"over ≥ 2 ranks (with one, call the scan itself)")
    return Comm(group, dist.get_rank(group), world, algorithm)


def start(group, algorithm, meta, error=None, same=()):
    """:func:`comm_for` then :func:`agree`, with the algorithm among what every rank must agree
    on (a rank with another, or an unknown one, raises the same error everywhere, at once).
    Returns (comm, every rank's meta)."""
    comm = comm_for(group, algorithm)
    if error is None and algorithm not in ALGORITHMS:
        error = f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}"
    metas = agree(comm, dict(meta, algorithm=algorithm), error, same=("algorithm", *same))
    return comm, metas


def layout(t, time_dim=None):
    """(dtype, shape) of a tensor, its time axis (``time_dim``: each rank's own shard length)
    written "l"; None for None. Ranks must agree on it for every tensor they exchange."""
    if t is None:
        return None
    shape = list(t.shape)
    if time_dim is not None:
        shape[time_dim] = "l"
    return str(t.dtype), tuple(shape)


def digest(t):
    """(dtype, shape, SHA-1 of the bytes) of a tensor that must be *equal* on every rank (A, D,
    the biases): comparing it across ranks costs one small message, not the tensor."""
    if t is None:
        return None
    raw = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)  # (bytes,)
    return str(t.dtype), tuple(t.shape), "values " + hashlib.sha1(raw.numpy()).hexdigest()[:12]


def agree(comm, meta, error=None, same=()):
    """All-gather each rank's ``meta`` dict; raise the same ValueError on every rank if any is bad.

    ``error`` is the message of this rank's own argument check (None if it passed); ``same`` names
    the keys of ``meta`` that must be equal on every rank (the algorithm, b, d, n, flags …).
    Returns the list of every rank's ``meta``, in rank order.
    """
    metas = [None] * comm.world
    dist.all_gather_object(metas, dict(meta, error=error), group=comm.group)
    bad = [f"rank {r}: {m['error']}" for r, m in enumerate(metas) if m["error"]]
    if bad:
        raise ValueError("bad input on " + "; ".join(bad))
    for key in same:
        values = [m[key] for m in metas]
        if any(v != values[0] for v in values):
            raise ValueError(f"the ranks disagree on {key}: " +
                             ", ".join(f"rank {r}: {v}" for r, v in enumerate(values)))
    return metas


def check_split(metas):
    """Every shard non-empty and, where a rank said where its shard starts, contiguous in order.

    Rank r's shard must begin where rank r−1's ended: offset_r = l_0 + ⋯ + l_{r−1}.
    """
    start = 0
    for r, m in enumerate(metas):
        if m["l"] < 1:
            raise ValueError(f"rank {r} holds an empty shard (l = 0); every rank needs ≥ 1 token")
        if m.get("offset") is not None and m["offset"] != start:
            raise ValueError(f"the split is not contiguous: rank {r} says its shard starts at "
                             f"token {m['offset']}, but ranks 0..{r - 1} hold tokens 0..{start - 1}"
                             f" (shards must be consecutive pieces, in rank order)")
        start += m["l"]


def requires_grad(grad_mode, *tensors):
    """Which inputs autograd will differentiate: every rank must build the same backward graph
    (its collectives must match), so this is one of the things :func:`agree` compares."""
    return (bool(grad_mode),) + tuple(t is not None and t.requires_grad for t in tensors)


def capture(check, *args, **kwargs):
    """Run a local argument check; return its error message (None if it passed), for agree."""
    try:
        check(*args, **kwargs)
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


# ---------------------------------------------------------------------------------------------
# point to point and collectives (thin wrappers, so every call names its group)


def send(comm, t, r):
    dist.send(t.contiguous(), comm.peer(r), group=comm.group)


def recv(comm, like, r):
    t = torch.empty_like(like, memory_format=torch.contiguous_format)
    dist.recv(t, comm.peer(r), group=comm.group)
    return t


def send_recv(comm, t, to, frm):
    """Send ``t`` to group rank ``to`` and receive a tensor like ``t`` from ``frm``, both at once
    (one ``batch_isend_irecv``); either may be None. Returns what was received (or None)."""
    ops, got = [], None
    if frm is not None:
        got = torch.empty_like(t, memory_format=torch.contiguous_format)
        ops.append(dist.P2POp(dist.irecv, got, comm.peer(frm), comm.group))
    if to is not None:
        ops.append(dist.P2POp(dist.isend, t.contiguous(), comm.peer(to), comm.group))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return got


def exchange_with_neighbours(comm, t, shape_from_prev):
    """Send ``t`` to rank r+1 and receive a tensor shaped ``shape_from_prev`` from rank r−1.

    One ``batch_isend_irecv``: the sends and receives of all ranks proceed together (no chain).
    Rank 0 receives nothing (returns None); the last rank sends nothing.
    """
    ops, got = [], None
    if comm.rank > 0:
        got = t.new_empty(shape_from_prev)
        ops.append(dist.P2POp(dist.irecv, got, comm.peer(comm.rank - 1), comm.group))
    if comm.rank < comm.world - 1:
        ops.append(dist.P2POp(dist.isend, t.contiguous(), comm.peer(comm.rank + 1), comm.group))
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return got


def exchange_backwards(comm, t, shape_from_next):
    """The reverse of :func:`exchange_with_neighbours`: send to r−1, receive from r+1."""
    ops, got = [], None
    if comm.rank < comm.world - 1:
        got = t.new_empty(shape_from_next)
        ops.append(dist.P2POp(dist.irecv, got, comm.peer(comm.rank + 1), comm.group))
    if comm.rank > 0:
        ops.append(dist.P2POp(dist.isend, t.contiguous(), comm.peer(comm.rank - 1), comm.group))
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return got


def all_gather(comm, t):
    """Every rank's ``t`` (same shape on all), stacked in rank order.  (R, ...)"""
    out = [torch.empty_like(t, memory_format=torch.contiguous_format) for _ in range(comm.world)]
    dist.all_gather(out, t.contiguous(), group=comm.group)
    return torch.stack(out)


def all_to_all(comm, chunks, out_numels):
    """Send ``chunks[k]`` (flat) to rank k; receive ``out_numels[k]`` numbers from rank k.

    One ``all_to_all_single`` with (possibly unequal) split sizes; returns the received pieces.
    """
    send_buf = torch.cat([c.reshape(-1) for c in chunks])
    recv_buf = send_buf.new_empty(sum(out_numels))
    dist.all_to_all_single(recv_buf, send_buf, output_split_sizes=list(out_numels),
                           input_split_sizes=[c.numel() for c in chunks], group=comm.group)
    return list(recv_buf.split(list(out_numels)))
