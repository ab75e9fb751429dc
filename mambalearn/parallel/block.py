"""The chapter 13 model, context parallel: the conv halo, the two mixers, the LM, its training.

Everything in a Mamba block is per token except two things: the scan (``selective_scan_cp`` /
``mamba_chunk_scan_combined_cp``) and the causal depthwise conv1d, whose output at token t reads
the k inputs t−k+1 … t. The first k−1 tokens of rank r's shard therefore need the last k−1 conv
inputs of rank r−1: the *halo*, b·d·(k−1) numbers sent from each rank to the next (and, in the
backward, their gradients sent back). The projections, norms, embedding and head are local.

Parameters are the same on every rank; each rank's backward gives its part of their gradient,
so training sums the gradients over ranks (one all-reduce) before every optimizer step — the
loss is the global one: each rank's token losses divided by the global count of scored tokens.

    conv_halo          the last k−1 conv inputs of the previous rank (autograd Function inside)
    ContextParallelLM  a ``model.MambaLM``'s own modules run on a token shard (no copy of weights);
                       its blocks' mixers by name (``MIXERS``, ``register_mixer``)
    all_reduce_grads   sum the parameter gradients over the ranks (one flat all-reduce)
    train_cp           ``train.train`` with each rank holding a shard of every sequence
"""

import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from mambalearn import inference
from mambalearn.parallel import wire
from mambalearn.parallel.selective import selective_scan_cp
from mambalearn.parallel.ssd import mamba_chunk_scan_combined_cp


class Halo(torch.autograd.Function):
    """``Halo.apply(x, comm, w)``: rank r−1's last w columns of x (zeros on rank 0).

    Shapes: x (b, d, l_r) with l_r ≥ w → (b, d, w). All ranks send and receive at once (one
    ``batch_isend_irecv``); the backward sends each halo's gradient back to where it came from.
    """

    @staticmethod
    def forward(ctx, x, comm, w):
        ctx.comm, ctx.w, ctx.x_shape = comm, w, x.shape
        got = wire.exchange_with_neighbours(comm, x[..., -w:], (*x.shape[:-1], w))
        return x.new_zeros(*x.shape[:-1], w) if got is None else got

    @staticmethod
    def backward(ctx, grad):
        got = wire.exchange_backwards(ctx.comm, grad, (*ctx.x_shape[:-1], ctx.w))
        grad_x = grad.new_zeros(ctx.x_shape)
        if got is not None:  # the gradient of my last w inputs, from the next rank's conv
            grad_x[..., -ctx.w:] = got
        return grad_x, None, None


def conv_halo(x, kernel_size, group=None):
    """The k−1 conv inputs before this rank's shard (zeros on rank 0): the causal conv1d halo.

    Shapes: x (b, d, l_r) the conv's input on this rank → (b, d, k−1). Every shard needs
    l_r ≥ k−1 tokens (checked on every rank), so one neighbour always holds the whole halo.
    """
    w = kernel_size - 1
    err = None if x.shape[-1] >= w else (f"shard of {x.shape[-1]} tokens is shorter than the "
                                         f"conv halo of k−1 = {w} tokens")
    comm, metas = wire.start(group, "ring", dict(l=x.shape[-1], x=wire.layout(x, -1),
                                                 k=kernel_size), err, same=("x", "k"))
    wire.check_split(metas)
    return Halo.apply(x, comm, w)  # (b, d, k−1)


def _conv(x, weight, bias, group):
    """Causal depthwise conv of a shard, its window extended by the halo."""
    halo = conv_halo(x, weight.shape[1], group)  # (b, d, k−1)
    out, _ = inference.causal_conv1d(x, weight, bias, F.pad(halo, (1, 0)))  # (b, d, l_r)
    return out


def mamba1_mixer_cp(mixer, hidden, group=None, algorithm="allgather", backend=None):
    """``model.Mamba1Mixer.forward`` on a token shard (no cache, mask or seq_idx).  (b, l_r, ·)"""
    x, z = mixer.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)  # (b, d, l_r) each
    x = F.silu(_conv(x, mixer.conv_weight, mixer.conv_bias, group))  # (b, d, l_r)
    dt, B, C = mixer.dbc(x.transpose(1, 2))  # (b, l_r, d), (b, l_r, n), (b, l_r, n)
    y = selective_scan_cp(x, dt.transpose(1, 2).contiguous(), -torch.exp(mixer.A_log),
                          B.transpose(1, 2), C.transpose(1, 2), mixer.D, z, mixer.dt_proj.bias,
                          True, group=group, algorithm=algorithm,
                          backend=backend or mixer.cfg.backend)  # (b, d, l_r)
    return mixer.out_proj(y.transpose(1, 2))  # (b, l_r, d_model)


def mamba2_mixer_cp(mixer, hidden, group=None, algorithm="allgather", backend=None):
    """``model.Mamba2Mixer.forward`` on a token shard (no cache, mask or seq_idx)."""
    b, l, _ = hidden.shape
    z, xBC, dt = mixer.split_proj(mixer.in_proj(hidden))  # (b, l, d), (b, l, conv_dim), (b, l, h)
    xBC = _conv(xBC.transpose(1, 2), mixer.conv_weight, mixer.conv_bias, group)  # (b, ·, l)
    x, B, C = mixer.split_xbc(F.silu(xBC).transpose(1, 2))  # (b, l, h, p), (b, l, g, n) ×2
    name = backend or (mixer.cfg.backend if mixer.cfg.backend != "sequential" else "chunked")
    y = mamba_chunk_scan_combined_cp(x, dt, -torch.exp(mixer.A_log), B, C, mixer.cfg.chunk_size,
                                     D=mixer.D, dt_bias=mixer.dt_bias, dt_softplus=True,
                                     group=group, algorithm=algorithm, backend=name)
    return mixer.out_proj(mixer.norm(y.reshape(b, l, -1), z))  # (b, l, d_model)


MIXERS = {"mamba1": mamba1_mixer_cp, "mamba2": mamba2_mixer_cp}  # block name -> mixer on a shard


def register_mixer(name, fn):
    """Make ``ContextParallelLM`` run blocks of ``name`` with ``fn(mixer, hidden, group,
    algorithm, backend)``: how a later chapter's block (chapter 15's Mamba-3) joins in."""
    MIXERS[name] = fn


class ContextParallelLM(nn.Module):
    """``model.MambaLM`` run on this rank's shard of the tokens; the wrapped model's own modules
    (no copy: ``self.model`` *is* the model, its parameters are trained in place).

    ``forward(tokens)``: tokens (b, l_r) int, this rank's contiguous shard → logits (b, l_r, vocab)
    equal to the single-process logits of those positions.
    """

    def __init__(self, model, group=None, algorithm="allgather", backend=None):
        super().__init__()
        self.model, self.group, self.algorithm, self.backend = model, group, algorithm, backend
        if model.cfg.block not in MIXERS:
            raise ValueError(f"no context-parallel mixer for block {model.cfg.block!r}; "
                             f"registered: {sorted(MIXERS)} (mambalearn.mamba3.parallel adds "
                             f"'mamba3')")
        self.mixer = MIXERS[model.cfg.block]

    def forward(self, tokens):
        m = self.model
        x = m.embedding(tokens)  # (b, l_r, d_model)
        for layer in m.layers:  # the residual block x + mixer(norm(x)), mixer context parallel
            x = x + self.mixer(layer.mixer, layer.norm(x), self.group, self.algorithm,
                               self.backend)
        return F.linear(m.norm_f(x), m.embedding.weight)  # (b, l_r, vocab), tied


def all_reduce_grads(model, group=None):
    """p.grad ← Σ_ranks p.grad for every parameter, as one flat all-reduce."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if grads:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        for g, v in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            g.copy_(v.view_as(g))


def shard_of(t, dim=1, group=None):
    """This rank's contiguous piece of ``t`` along ``dim`` (as even as ``torch.tensor_split``)."""
    return torch.tensor_split(t, dist.get_world_size(group), dim=dim)[dist.get_rank(group)]


def loss_and_accuracy_cp(cp_model, inputs, targets, group=None):
    """The global cross-entropy (this rank's part of it) and the global accuracy.

    Each rank sums the losses of its scored tokens and divides by the *global* count, so the
    ranks' losses add up to the single-process mean; returns (this rank's loss term, global
    loss (float), global accuracy (float)).
    """
    logits = cp_model(shard_of(inputs, 1, group))  # (b, l_r, vocab)
    mine = shard_of(targets, 1, group)
    answer = mine != -100
    stats = torch.stack([answer.sum().float(),
                         (logits.argmax(-1) == mine)[answer].sum().float()]).detach()
    loss_sum = F.cross_entropy(logits.flatten(0, 1), mine.flatten(), ignore_index=-100,
                               reduction="sum")
    stats = torch.cat([stats, loss_sum.detach()[None]])
    dist.all_reduce(stats, group=group)  # global count, correct, loss sum
    loss = loss_sum / stats[0]
    return loss, (stats[2] / stats[0]).item(), (stats[1] / stats[0]).item()


def train_cp(cp_model, steps=300, batch=32, lr=3e-3, task=None, seed=0, log_every=10):
    """``train.train`` with the sequence split over the ranks: same data, same optimizer, same
    schedule; the gradients are summed over ranks before each step. Returns the same history."""
    from mambalearn.train import selective_copying

    model, group, task = cp_model.model, cp_model.group, dict(task or {})
    g = torch.Generator().manual_seed(seed)  # every rank draws the same batches
    dev = model.embedding.weight.device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    hist = {"step": [], "loss": [], "acc": [], "seconds": 0.0}
    t0 = time.perf_counter()
    for step in range(steps):
        inputs, targets = selective_copying(batch, generator=g, device=dev, **task)
        loss, loss_all, acc = loss_and_accuracy_cp(cp_model, inputs, targets, group)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        all_reduce_grads(model, group)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps - 1:
            hist["step"].append(step)
            hist["loss"].append(loss_all)
            hist["acc"].append(acc)
    hist["seconds"] = time.perf_counter() - t0
    return hist
