"""Does Mamba-3 context parallel equal one process? Cases, runs and comparisons (as
``mambalearn.parallel.verify`` for Mamba-1 and SSD).

A case is a dict: each rank's shard length, the algorithm, the backend and tiny sizes.
:func:`run_rank` runs one rank's shard forward and backward (inside ``parallel.spawn``),
:func:`reference` the whole sequence in one process (the float64 loop by default), and
:func:`compare` checks the output, every rank's four final states (angle, ssm, k, v) and every
gradient, the initial states' included. The loss is ⟨out, g⟩ + Σ_r Σ_states ⟨state_r, g_r⟩.
"""

import torch
import torch.distributed as dist

from mambalearn.mamba3.parallel import TIME
from mambalearn.parallel.verify import rank_slice
from mambalearn.testing import assert_close

STATES = ("angle", "ssm", "k", "v")
SHARED = ("Q_bias", "K_bias", "D")  # the same on every rank: their gradients are all-reduced


def case(lengths=(3, 4), algorithm="allgather", backend="chunked", b=2, h=4, p=3, g=2, n=8,
         na=2, chunk_size=4, dtype=torch.float64, init=True, seed=0, device="cpu"):
    """A case as a dict (tiny CPU sizes by default)."""
    return dict(lengths=tuple(lengths), algorithm=algorithm, backend=backend, b=b, h=h, p=p, g=g,
                n=n, na=na, chunk_size=chunk_size, dtype=dtype, init=init, seed=seed,
                device=str(device))


def make_inputs(c):
    """The whole sequence's inputs and Input_States (float64 draws in the case's dtype; biases, D
    and the states float32 unless the case is float64)."""
    gen = torch.Generator().manual_seed(c["seed"])
    b, L, h, p, g, n, na = (c[k] if k != "L" else sum(c["lengths"]) for k in "b L h p g n na"
                            .split())
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)
    DT = torch.nn.functional.softplus(r(b, h, L)) * 0.5 + 0.05
    x = dict(Q=r(b, L, g, n), K=r(b, L, g, n), V=r(b, L, h, p), Z=r(b, L, h, p),
             ADT=-DT * torch.rand(b, h, L, generator=gen, dtype=torch.float64), DT=DT,
             Trap=r(b, h, L), Q_bias=r(h, n), K_bias=r(h, n), Angles=r(b, L, h, na), D=r(h))
    wide = torch.float64 if c["dtype"] == torch.float64 else torch.float32
    x = {k: v.to(c["device"], wide if k in SHARED else c["dtype"]) for k, v in x.items()}
    states = (2 * torch.pi * torch.rand(b, h, na, generator=gen, dtype=torch.float64),
              r(b, h, p, n), r(b, h, n), r(b, h, p))
    states = tuple(s.to(c["device"], wide) for s in states) if c["init"] else None
    return x, states


def _shard(X, name, s):
    return X.narrow(TIME[name], s.start, s.stop - s.start) if name in TIME else X


def cotangents(c, out_shape, finals):
    """g for the whole output and, per rank, one for each of the four final states."""
    gen = torch.Generator().manual_seed(c["seed"] + 1)
    g_out = torch.randn(out_shape, generator=gen, dtype=torch.float64)
    g_fin = [[torch.randn(f.shape, generator=gen, dtype=torch.float64) for f in finals]
             for _ in c["lengths"]]
    return g_out.to(c["device"]), [[g.to(c["device"]) for g in gs] for gs in g_fin]


def _dot(xs, gs):
    """Σ ⟨x, g⟩ over pairs of tensors."""
    return sum((x * g.to(x.dtype)).sum() for x, g in zip(xs, gs, strict=True))


def run_rank(rank, c):
    """This rank's part of case ``c``: forward, backward, shared gradients all-reduced."""
    from mambalearn.mamba3.parallel import mamba3_siso_combined_cp

    x, states = make_inputs(c)
    s = rank_slice(c, rank)
    mine = {k: _shard(v, k, s).detach().clone().requires_grad_() for k, v in x.items()}
    st = None if states is None or rank else [v.clone().requires_grad_() for v in states]
    out, *finals = mamba3_siso_combined_cp(**mine, Input_States=st, chunk_size=c["chunk_size"],
                                           return_final_states=True, algorithm=c["algorithm"],
                                           backend=c["backend"])
    L = sum(c["lengths"])
    g_out, g_fin = cotangents(c, (out.shape[0], L, *out.shape[2:]), finals)
    (_dot([out], [g_out[:, s]]) + _dot(finals, g_fin[rank])).backward()
    grads = {k: v.grad for k, v in mine.items()}
    for k in SHARED:
        dist.all_reduce(grads[k])
    if st is not None:
        grads.update({f"Input_States {n}": v.grad for n, v in zip(STATES, st, strict=True)})
    cpu = lambda t: t.detach().cpu()
    return dict(out=cpu(out), finals=[cpu(f) for f in finals],
                grads={k: cpu(v) for k, v in grads.items()})


def run_cases(rank, cases):
    """:func:`run_rank` for every case, in order (one ``spawn`` for many cases)."""
    return [run_rank(rank, c) for c in cases]


def reference(c, fn=None):
    """The whole sequence in one process (``fn``: the float64 loop ``mamba3_siso_sequential``),
    with the loss of :func:`run_rank`; rank r's final states are those of the prefix ending with
    shard r."""
    from mambalearn.mamba3.reference import mamba3_siso_sequential

    fn = fn or mamba3_siso_sequential
    x, states = make_inputs(c)
    x = {k: v.detach().clone().requires_grad_() for k, v in x.items()}
    st = None if states is None else [v.clone().requires_grad_() for v in states]
    call = lambda inputs: fn(**inputs, Input_States=st, return_final_states=True)
    out = call(x)[0]
    finals = [call({k: _shard(v, k, slice(0, rank_slice(c, r).stop)) for k, v in x.items()})[1:]
              for r in range(len(c["lengths"]))]
    g_out, g_fin = cotangents(c, out.shape, finals[0])
    (_dot([out], [g_out]) + sum(_dot(f, g) for f, g in zip(finals, g_fin, strict=True))
     ).backward()
    grads = {k: v.grad for k, v in x.items()}
    if st is not None:
        grads.update({f"Input_States {n}": v.grad for n, v in zip(STATES, st, strict=True)})
    return dict(out=out.detach().cpu(), finals=[[f.detach().cpu() for f in fs] for fs in finals],
                grads={k: v.detach().cpu() for k, v in grads.items()})


def compare(c, results, want, dtype=None, what="", norm=False):
    """Assert that the ranks' ``results`` assemble to ``want`` (one process); ``norm=True``
    compares whole tensors by relative error (large bf16 runs: ``testing.assert_close``)."""
    dtype = dtype or c["dtype"]
    tag = f"{what}mamba3 {c['algorithm']} lengths {list(c['lengths'])}"
    assert_close(torch.cat([r["out"] for r in results], 1), want["out"], dtype=dtype, norm=norm,
                 msg=f"{tag}: output")
    for rank, r in enumerate(results):
        for name, got, exp in zip(STATES, r["finals"], want["finals"][rank], strict=True):
            if name == "angle":  # mod 2π: compare where the angles point, not their values
                got, exp = (torch.stack([a.cos(), a.sin()]) for a in (got, exp))
            assert_close(got, exp.to(got.dtype), dtype=dtype, norm=norm,
                         msg=f"{tag}: final {name} of rank {rank}")
    for k, g in want["grads"].items():
        got = (torch.cat([r["grads"][k] for r in results], TIME[k]) if k in TIME
               else results[0]["grads"][k])
        assert_close(got, g, dtype=dtype, grad=True, norm=norm, msg=f"{tag}: gradient of {k}")


