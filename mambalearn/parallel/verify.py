"""Does the context-parallel result equal one process's? Cases, runs and comparisons.

A *case* is a dict naming the model ("mamba1" or "ssd"), the sizes, each rank's shard length,
the algorithm and the backend. :func:`make_inputs` draws the whole sequence's inputs (from the
case's seed, so every rank draws the same), :func:`run_rank` runs one rank's shard forward and
backward (called inside ``spawn``), :func:`reference` runs the whole sequence in one process, and
:func:`compare` checks every output and every gradient, shard by shard. Used by the tests, the
chapter 14 notebook and the GPU scripts.

The loss differentiated is ⟨out, g_out⟩ + Σ_r ⟨last_r, g_r⟩: every output and every rank's last
state (the state after its shard) get a random cotangent.
"""

import torch
import torch.distributed as dist

from mambalearn.testing import assert_close

TOKENS = {"mamba1": ("u", "delta", "z", "B", "C"), "ssd": ("x", "dt", "z", "B", "C")}
PARAMS = {"mamba1": ("A", "D", "delta_bias"), "ssd": ("A", "D", "dt_bias")}
INIT = {"mamba1": "initial_state", "ssd": "initial_states"}


def case(model="mamba1", lengths=(3, 4), algorithm="allgather", backend="chunked", b=2, d=12,
         n=3, h=12, p=2, g=1, layout="shared", chunk_size=4, dtype=torch.float64, init=True,
         seed=0, device="cpu"):
    """A case as a dict (the defaults are tiny CPU sizes)."""
    return dict(model=model, lengths=tuple(lengths), algorithm=algorithm, backend=backend, b=b,
                d=d, n=n, h=h, p=p, g=g, layout=layout, chunk_size=chunk_size, dtype=dtype,
                init=init, seed=seed, device=str(device))


def _tdim(c):
    """The time axis of a token tensor: −1 for Mamba-1's (…, l), 1 for SSD's (b, l, …)."""
    return -1 if c["model"] == "mamba1" else 1


def make_inputs(c):
    """The whole sequence's inputs (float64 draws cast to the case's dtype; A, D, bias float32
    unless the case is float64, as the kernels want them)."""
    gen = torch.Generator().manual_seed(c["seed"])
    L, b, dev = sum(c["lengths"]), c["b"], c["device"]
    r = lambda *s, scale=1.0: torch.randn(*s, generator=gen, dtype=torch.float64) * scale
    wide = torch.float64 if c["dtype"] == torch.float64 else torch.float32
    if c["model"] == "mamba1":
        d, n = c["d"], c["n"]
        bc = {"shared": (b, n, L), "grouped": (b, c["g"], n, L), "fixed": (d, n)}[c["layout"]]
        x = dict(u=r(b, d, L), delta=r(b, d, L, scale=0.5), z=r(b, d, L), B=r(*bc), C=r(*bc),
                 A=-torch.exp(r(d, n, scale=0.3)), D=r(d), delta_bias=r(d, scale=0.1),
                 initial_state=r(b, d, n))
        keep = {"A", "D", "delta_bias", "initial_state"} | ({"B", "C"} if bc == (d, n) else set())
    else:
        hh, p, g, n = c["h"], c["p"], c["g"], c["n"]
        x = dict(x=r(b, L, hh, p), dt=r(b, L, hh, scale=0.5), z=r(b, L, hh, p),
                 B=r(b, L, g, n), C=r(b, L, g, n), A=-torch.exp(r(hh, scale=0.3)), D=r(hh),
                 dt_bias=r(hh, scale=0.1), initial_states=r(b, hh, p, n))
        keep = {"A", "D", "dt_bias", "initial_states"}
    if not c["init"]:
        x[INIT[c["model"]]] = None
    return {k: None if v is None else v.to(dev, wide if k in keep else c["dtype"])
            for k, v in x.items()}


def rank_slice(c, rank):
    """The steps of the sequence that rank ``rank`` holds (case ``c``'s ``lengths``)."""
    lo = sum(c["lengths"][:rank])
    return slice(lo, lo + c["lengths"][rank])


def cotangents(c, out_shape, state_shape):
    """The loss's random weights: g_out for the whole output, one g for every rank's last state."""
    gen = torch.Generator().manual_seed(c["seed"] + 1)
    g_out = torch.randn(out_shape, generator=gen, dtype=torch.float64)
    g_last = torch.randn(len(c["lengths"]), *state_shape, generator=gen, dtype=torch.float64)
    return g_out.to(c["device"]), g_last.to(c["device"])


def _state_shape(c):
    if c["model"] == "mamba1":
        return (c["b"], c["d"], c["n"])
    return (c["b"], c["h"], c["p"], c["n"])


def _call(c, fn, x, **kw):
    if c["model"] == "mamba1":
        return fn(**x, delta_softplus=True, return_last_state=True, **kw)
    return fn(**x, chunk_size=c["chunk_size"], dt_softplus=True, return_final_states=True, **kw)


def run_rank(rank, c):
    """This rank's part of case ``c``: its shard forward and backward, parameter gradients
    all-reduced. Returns {"out", "last", "grads"} (detached, on the CPU)."""
    from mambalearn.parallel import mamba_chunk_scan_combined_cp, selective_scan_cp

    x, s, td = make_inputs(c), rank_slice(c, rank), _tdim(c)
    tokens = TOKENS[c["model"]]
    mine = {}
    for k, v in x.items():
        if v is not None and k in tokens and v.ndim > 2:
            v = v[..., s] if td == -1 else v[:, s]
        if k == INIT[c["model"]] and rank != 0:
            v = None
        mine[k] = None if v is None else v.detach().clone().requires_grad_()
    fn = selective_scan_cp if c["model"] == "mamba1" else mamba_chunk_scan_combined_cp
    out, last = _call(c, fn, mine, algorithm=c["algorithm"], backend=c["backend"])
    g_out, g_last = cotangents(c, _full_out_shape(c, out), _state_shape(c))
    g_out = g_out[..., s] if td == -1 else g_out[:, s]
    loss = (out * g_out.to(out.dtype)).sum() + (last * g_last[rank].to(last.dtype)).sum()
    loss.backward()
    grads = {k: v.grad for k, v in mine.items() if v is not None}
    for k in PARAMS[c["model"]] + (("B", "C") if c["layout"] == "fixed" else ()):
        if k in grads and grads[k].ndim <= 2:
            dist.all_reduce(grads[k])  # every rank holds its part of a shared parameter's grad
    return dict(out=out.detach().cpu(), last=last.detach().cpu(),
                grads={k: v.detach().cpu() for k, v in grads.items()})


def run_cases(rank, cases):
    """:func:`run_rank` for every case, in order (one ``spawn`` for many cases)."""
    return [run_rank(rank, c) for c in cases]


def _full_out_shape(c, out_shard):
    L = sum(c["lengths"])
    return (*out_shard.shape[:-1], L) if c["model"] == "mamba1" else (
        out_shard.shape[0], L, *out_shard.shape[2:])


def reference(c, fn=None):
    """The whole sequence in one process with ``fn`` (default: the float64 oracle of the model).

    Returns {"out" (whole), "lasts" (R, state), "grads"} with the same loss as :func:`run_rank`;
    the last state of rank r is the scan's last state on the prefix ending with shard r.
    """
    from mambalearn.mamba2.reference import mamba_chunk_scan_ref
    from mambalearn.scan.sequential import selective_scan_sequential

    fn = fn or (selective_scan_sequential if c["model"] == "mamba1" else mamba_chunk_scan_ref)
    x = {k: None if v is None else v.detach().clone().requires_grad_()
         for k, v in make_inputs(c).items()}
    out, _ = _call(c, fn, x)
    lasts, td = [], _tdim(c)
    for r in range(len(c["lengths"])):  # the state after shard r: the prefix's last state
        end = rank_slice(c, r).stop
        pre = {k: (v[..., :end] if td == -1 else v[:, :end]) if k in TOKENS[c["model"]] and
               v is not None and v.ndim > 2 else v for k, v in x.items()}
        lasts.append(_call(c, fn, pre)[1])
    lasts = torch.stack(lasts)
    g_out, g_last = cotangents(c, out.shape, _state_shape(c))
    loss = (out * g_out.to(out.dtype)).sum() + (lasts * g_last.to(lasts.dtype)).sum()
    loss.backward()
    return dict(out=out.detach().cpu(), lasts=lasts.detach().cpu(),
                grads={k: v.grad.detach().cpu() for k, v in x.items() if v is not None})


def compare(c, results, want, dtype=None, what="", norm=False):
    """Assert that the ranks' ``results`` (from :func:`run_rank`) assemble to ``want``.

    ``norm=True`` compares whole tensors by relative error (large bf16 runs: see
    ``testing.assert_close``)."""
    td = _tdim(c)
    dtype = dtype or c["dtype"]
    tag = f"{what}{c['model']} {c['algorithm']} lengths {list(c['lengths'])}"
    cat = lambda parts: torch.cat(parts, dim=td)
    assert_close(cat([r["out"] for r in results]), want["out"], dtype=dtype, norm=norm,
                 msg=f"{tag}: output")
    assert_close(torch.stack([r["last"] for r in results]), want["lasts"], dtype=dtype,
                 norm=norm, msg=f"{tag}: last states")
    for k, g in want["grads"].items():
        if k in TOKENS[c["model"]] and g.ndim > 2:  # a shard on every rank
            got = cat([r["grads"][k] for r in results])
        else:  # the parameters (all-reduced) and the initial state (rank 0's)
            got = results[0]["grads"][k]
        assert_close(got, g, dtype=dtype, grad=True, norm=norm, msg=f"{tag}: gradient of {k}")
