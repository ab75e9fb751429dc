"""Moving a sequence between "each rank a piece of time" and "each rank a piece of the channels".

The all-to-all algorithm re-shards: every rank sends rank k the k-th slice of its channels (or
heads) for its own tokens, and so ends up with *all* tokens of 1/R of the channels. Channels of
Mamba-1 (and heads of SSD) never mix inside the scan, so each rank then scans the whole sequence
alone; a second all-to-all puts the outputs back in token shards. Shards may differ in length:
``all_to_all_single`` takes one split size per peer.

    Reshard     tokens ↔ channels for several tensors in one all-to-all; backward: the inverse
    GatherTime  every rank's piece of time of tensors all channels share (B, C), one all-gather;
                backward: each rank's piece of the gradient summed over ranks (a reduce-scatter,
                done as one all-to-all: gloo has no reduce_scatter)
    FromRoot    rank 0's tensor, channel slice k to rank k (the initial state); backward: the
                slices' gradients back to rank 0

Several tensors travel in one message (one latency α, not one per tensor) and as one autograd
node, so every rank runs the backward collectives in the same order. Per rank and per tensor of
shape (b, d, l_r), an all-to-all sends and receives b·d·l_r·(R−1)/R numbers.
"""

import torch

from mambalearn.parallel import wire


def _shape(x, **dims):
    s = list(x.shape)
    for dim, size in dims.items():
        s[int(dim[1:])] = size
    return torch.Size(s)


def _pieces_out(comm, x, spec, to_channels):
    """What ``x`` sends to each rank, and the shape it receives from each rank."""
    lengths, t, c = spec
    if to_channels:  # rank k gets its channels of my tokens; I get my channels of rank j's tokens
        w = x.shape[c] // comm.world
        send = [x.narrow(c, k * w, w) for k in range(comm.world)]
        return send, [_shape(x, **{f"d{c}": w, f"d{t}": lengths[j]}) for j in range(comm.world)]
    offs = [sum(lengths[:j]) for j in range(comm.world)]  # rank j gets its tokens of my channels
    send = [x.narrow(t, offs[j], lengths[j]) for j in range(comm.world)]
    return send, [_shape(x, **{f"d{t}": lengths[comm.rank]})] * comm.world


def move(comm, xs, specs, to_channels):
    """Re-shard every tensor of ``xs`` (spec = (lengths, tdim, cdim)) in one all-to-all."""
    sends, shapes = zip(*(_pieces_out(comm, x, s, to_channels)
                          for x, s in zip(xs, specs, strict=True)), strict=True)
    chunks = [torch.cat([s[k].reshape(-1) for s in sends]) for k in range(comm.world)]
    sizes = [[sh[j].numel() for sh in shapes] for j in range(comm.world)]
    got = wire.all_to_all(comm, chunks, [sum(s) for s in sizes])  # one flat piece per rank
    parts = [g.split(s) for g, s in zip(got, sizes, strict=True)]  # per rank, per tensor
    out = []
    for i, (_, t, c) in enumerate(specs):
        views = [parts[j][i].view(shapes[i][j]) for j in range(comm.world)]
        out.append(torch.cat(views, dim=t if to_channels else c))
    return out


class Reshard(torch.autograd.Function):
    """``Reshard.apply(comm, specs, to_channels, *xs)`` → the re-sharded tensors (a tuple).

    spec = (lengths of every rank's shard, time dim, channel dim), one per tensor.
    """

    @staticmethod
    def forward(ctx, comm, specs, to_channels, *xs):
        ctx.args = (comm, specs, to_channels)
        return tuple(move(comm, xs, specs, to_channels))

    @staticmethod
    def backward(ctx, *grads):
        comm, specs, to_channels = ctx.args
        back = move(comm, [g.contiguous() for g in grads], specs, not to_channels)
        return (None, None, None, *back)


class GatherTime(torch.autograd.Function):
    """``GatherTime.apply(comm, lengths, tdims, *xs)``: every rank's piece of time, concatenated.

    Each x is padded to the longest shard, all are packed into one flat ``all_gather``, then cut.
    """

    @staticmethod
    def forward(ctx, comm, lengths, tdims, *xs):
        longest = max(lengths)
        padded = [torch.cat([x, x.new_zeros(_shape(x, **{f"d{t}": longest - x.shape[t]}))], t)
                  for x, t in zip(xs, tdims, strict=True)]
        every = wire.all_gather(comm, torch.cat([p.reshape(-1) for p in padded]))  # (R, ·)
        every = every.split([p.numel() for p in padded], dim=1)  # per tensor: (R, ·)
        ctx.args = (comm, lengths, tdims)
        return tuple(torch.cat([e[j].view(p.shape).narrow(t, 0, lengths[j])
                                for j in range(comm.world)], t)
                     for e, p, t in zip(every, padded, tdims, strict=True))

    @staticmethod
    def backward(ctx, *grads):
        comm, lengths, tdims = ctx.args
        specs = [(lengths, t, None) for t in tdims]
        sends, shapes = zip(*(_pieces_out(comm, g.contiguous(), s, False)
                              for g, s in zip(grads, specs, strict=True)), strict=True)
        chunks = [torch.cat([s[j].reshape(-1) for s in sends]) for j in range(comm.world)]
        sizes = [sh[0].numel() for sh in shapes]
        got = wire.all_to_all(comm, chunks, [sum(sizes)] * comm.world)
        parts = [g.split(sizes) for g in got]  # from every rank: its gradient of my piece
        return (None, None, None, *(sum(parts[j][i].view(shapes[i][0]) for j in
                                        range(comm.world)) for i in range(len(grads))))


class FromRoot(torch.autograd.Function):
    """``FromRoot.apply(x, anchor, comm, like, cdim)``: rank 0's x, channel slice k to rank k.

    ``x``: the whole tensor on rank 0 (None elsewhere). ``anchor``: an empty tensor that requires
    grad on every rank, so that every rank has this node in its graph and joins the backward
    all-to-all whether or not its x does. ``like``: a tensor of the slice's shape and dtype.
    """

    @staticmethod
    def forward(ctx, x, anchor, comm, like, cdim):
        w = like.shape[cdim]
        chunks = ([x.narrow(cdim, k * w, w) for k in range(comm.world)] if comm.rank == 0
                  else [like.new_empty(0)] * comm.world)
        got = wire.all_to_all(comm, chunks, [like.numel()] + [0] * (comm.world - 1))[0]
        ctx.args = (comm, cdim)
        return got.view(like.shape)

    @staticmethod
    def backward(ctx, grad):
        comm, cdim = ctx.args
        chunks = [grad.contiguous()] + [grad.new_empty(0)] * (comm.world - 1)
        n = grad.numel() if comm.rank == 0 else 0
        pieces = wire.all_to_all(comm, chunks, [n] * comm.world)
        grad_x = torch.cat([p.view(grad.shape) for p in pieces], cdim) if comm.rank == 0 else None
        return grad_x, grad.new_zeros(0), None, None, None


def from_root(comm, x, like, cdim):
    """:class:`FromRoot` with its anchor (requires grad whenever autograd records)."""
    anchor = like.new_zeros(0).requires_grad_(torch.is_grad_enabled())
    return FromRoot.apply(x, anchor, comm, like, cdim)


def select_groups(X, gdim, start, count, per_group):
    """The B/C groups that channels ``start … start+count−1`` read, as a grouped tensor of its own.

    Channel i reads group i // per_group. The slice is returned with g' groups such that channel
    start+j reads group j // (count / g') of it: whole groups when ``count`` is a multiple of
    ``per_group``; one group when the channels lie in a single group; else one copy per channel.
    """
    if count % per_group == 0:
        return X.narrow(gdim, start // per_group, count // per_group)
    if per_group % count == 0:
        return X.narrow(gdim, start // per_group, 1)
    idx = torch.arange(start, start + count, device=X.device) // per_group
    return X.index_select(gdim, idx)
