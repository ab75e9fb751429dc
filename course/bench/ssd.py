"""Bench topic ``ssd``: Mamba-2 SSD forward and forward+backward, ours against mamba_ssm and FLA.

Backends (chapters 10–11):
    mamba_ssm               ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined``
                            (pure Triton), imported from its source tree through stub
                            packages when available
    fla chunk_simple_gla    flash-linear-attention's chunked linear attention with a scalar decay:
                            the same recurrence (q = C, k = B, v = Δx, g = ΔA), without D;
                            timed when ``fla`` imports (inputs prepared outside the timing)
    ours unfused            ``mamba_chunk_scan_combined(..., fused=False)``: chapter 10's
    ours fused              ``mamba_chunk_scan_combined(..., fused=True)``: chapter 11's kernels
    ours fused qQ …         ``ssd_fused_forward`` at chunk Q (instead of the row's): two
                            launches, or one (fp32 / fp16 passed states)
Forward+backward rows time ``out = f(...)`` and ``torch.autograd.grad(out, [x, dt, A, B, C, D,
dt_bias], dout)`` and record the peak memory beyond the inputs (``peak_gb``), for mamba_ssm, ours
(Triton backward, ``mambalearn.mamba2.backward``) and, at the first shape only (it is slow),
ours with the PyTorch-recompute oracle backward (``backward="reference"``). Their ``rel_err`` is the
largest relative error of the seven gradients against that oracle's.
``backward_steps`` times each step of our backward alone (where the time goes).

    python -m course.bench.ssd             all rows (also: python -m mambalearn bench ssd)
    python -m course.bench.ssd --backward  first shape: fwd+bwd rows and the backward's steps
    python -m course.bench.ssd --backward --sweep   … and launch settings of those steps

Shapes (GPU, Mamba-2 2.7B heads): b4 l4096, b1 l16384, b16 l1024, all h80 p64 n128 g1,
bf16 x/B/C, fp32 dt/A/D/dt_bias, softplus, chunk 256. On a CPU: one tiny fp32 shape through
Triton's interpreter (interpreter speed, not kernel speed).

Each row: ``ms``, ``ratio`` (to mamba_ssm in the same run), ``ratio_fla`` (to FLA, forward rows),
``floor_pct`` (``mambalearn.roofline.floor(roofline.ssd_cost(...))``: the larger of the byte floor
and the bf16 matmul floor of the reference H200, forward rows only).

Where ``mamba_ssm`` comes from: the ``mamba_ssm`` package directory named by the environment
variable ``MAMBA_SSM_PATH``, else ``.mamba_ref/mamba_ssm-2.3.2.post1/mamba_ssm`` in the repository.
"""

import os

import torch

from course.bench import _reference, peak_gb, show, time_ms
from mambalearn import roofline
from mambalearn.testing import rel_error

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GPU_SHAPES = [(4, 4096), (1, 16384), (16, 1024)]  # (b, l) with h80 p64 n128 g1
HEADS = dict(h=80, p=64, g=1, n=128)


def load_mamba_ssm_ssd(path=None):
    """``mamba_ssm``'s ``mamba_chunk_scan_combined`` from its source tree, or None (reason
    printed)."""
    return _reference.load("ops.triton.ssd_combined", "mamba_chunk_scan_combined", path)


def make_inputs(b, l, h, p, g, n, dtype=torch.bfloat16, device="cuda", seed=0):
    """Random SSD inputs in mamba_ssm's layouts: (x, dt, A, B, C), dict(D, dt_bias, dt_softplus)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, device=device)
    u = lambda *s: torch.rand(*s, generator=gen, device=device)
    x, B, C = r(b, l, h, p).to(dtype), r(b, l, g, n).to(dtype), r(b, l, g, n).to(dtype)
    dt, A = r(b, l, h) - 2.0, -u(h) * 8 - 1.0
    return (x, dt, A, B, C), dict(D=r(h), dt_bias=u(h) - 2.0, dt_softplus=True)


def shape_name(b, l, h, p, g, n, q, dtype):
    return f"b{b} l{l} h{h} p{p} n{n} g{g} q{q} {str(dtype)[6:]}"


def forward_fns(theirs, q, fused_chunks=(256, 128)):
    """{backend: f(x, dt, A, B, C, **kw) -> out} for the forward rows."""
    from mambalearn.mamba2 import mamba_chunk_scan_combined as ours
    from mambalearn.mamba2.fused.forward import ssd_fused_forward

    fns = {}
    if theirs is not None:
        fns["mamba_ssm fwd"] = lambda *a, **kw: theirs(*a, q, **kw)
    fns["ours unfused fwd"] = lambda *a, **kw: ours(*a, q, fused=False, **kw)
    fns["ours fused fwd"] = lambda *a, **kw: ours(*a, q, fused=True, **kw)
    for qf in fused_chunks:  # at this chunk instead of q
        fns[f"ours fused fwd q{qf}"] = lambda *a, qf=qf, **kw: ssd_fused_forward(*a, qf, **kw)[0]
        for sd in (torch.float32, torch.float16):
            fns[f"ours fused fwd q{qf} one launch {str(sd)[6:]} state"] = (
                lambda *a, qf=qf, sd=sd, **kw: ssd_fused_forward(*a, qf, launches=1,
                                                                 state_dtype=sd, **kw)[0])
    return fns


def load_fla():
    """flash-linear-attention's ``chunk_simple_gla``, or None (with the reason printed)."""
    try:
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as e:  # noqa: BLE001 - an optional peer
        print(f"fla not available: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return None
    return chunk_simple_gla


def fla_inputs(x, dt, A, B, C, dt_bias=None, dt_softplus=True, **_):
    """(q, k, v, g) for ``chunk_simple_gla``: the SSD recurrence as linear attention with a scalar
    decay per step, q = C, k = B (a copy per head: FLA has no groups), v = Δ x, g = Δ A."""
    b, l, h, p = x.shape
    delta = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    delta = torch.nn.functional.softplus(delta) if dt_softplus else delta  # (b, l, h)
    q = C.repeat_interleave(h // C.shape[2], dim=2).contiguous()  # (b, l, h, n)
    k = B.repeat_interleave(h // B.shape[2], dim=2).contiguous()
    v = (delta[..., None] * x.float()).to(x.dtype)  # (b, l, h, p)
    return q, k, v, delta * A.float()


def fla_fn(fla, args, kw):
    """A closure running FLA's forward on prepared inputs (no autograd graph)."""
    q, k, v, g = fla_inputs(*args, **kw)

    def go():
        with torch.no_grad():
            return fla(q, k, v, g=g, scale=1.0)[0]
    return go


def fwd_bwd(fn, args, kw, dout):
    """A closure timing one forward and the gradients of x, dt, A, B, C, D, dt_bias."""
    leaves = [t.detach().clone().requires_grad_() for t in args]
    D, bias = (kw[k].detach().clone().requires_grad_() for k in ("D", "dt_bias"))
    rest = {k: v for k, v in kw.items() if k not in ("D", "dt_bias")}

    def go():
        out = fn(*leaves, D=D, dt_bias=bias, **rest)
        return torch.autograd.grad(out, leaves + [D, bias], dout)
    return go


GRAD_NAMES = ("x", "dt", "A", "B", "C", "D", "dt_bias")  # the order ``fwd_bwd`` returns them in


def rel_err(a, b):
    """‖a − b‖ / ‖b‖; for tuples of tensors (gradients) the largest of them."""
    if isinstance(b, (tuple, list)):
        return max(rel_err(x, y) for x, y in zip(a, b, strict=True))
    return rel_error(a, b)


def _measure(fn, want=None, warmup=25, rep=100, keep=None):
    """dict(ms, peak_gb, rel_err) of ``fn()``; a crash (e.g. out of memory) is recorded, not raised.
    ``keep``: a list that receives the first result (the oracle's gradients)."""
    try:
        got = fn() if want is not None or keep is not None else None
        if keep is not None:
            keep.append(got)
        err = None if want is None else rel_err(got, want)
        each = ({k: rel_err(a, b) for k, a, b in zip(GRAD_NAMES, got, want, strict=True)}
                if isinstance(want, (tuple, list)) else None)  # per gradient
        del got
        row = dict(ms=time_ms(fn, warmup=warmup, rep=rep, cpu_calls=1), peak_gb=peak_gb(fn),
                   rel_err=err)
        return row if each is None else dict(row, grad_rel_err=each)
    except Exception as e:  # noqa: BLE001 - one failing backend must not end the whole bench
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return dict(ms=None, peak_gb=None, error=f"{type(e).__name__}: {str(e)[:200]}")


def _row(backend, shape, m, ref_ms, floor_ms, fla_ms=None):
    ms = m.pop("ms")
    row = dict(topic="ssd", backend=backend, shape=shape, ms=ms,
               ratio=None if ms is None or ref_ms is None else ms / ref_ms,
               ratio_fla=None if ms is None or fla_ms is None else ms / fla_ms,
               floor_pct=None if ms is None or floor_ms is None else 100 * floor_ms / ms, **m)
    show(row)
    return row


def run(gpu, shapes=None, chunk=None, fused_chunks=None, dtype=None, device=None, forward=True,
        backward=True):
    """Rows for every backend at every shape; each forward is checked against the oracle (rel_err),
    each fwd+bwd at the first shape against the oracle backward's gradients.

    Defaults: GPU — the three shapes of the module doc, bf16, chunk 256, no extra fused chunks;
    CPU — b1 l40 h2 p8 n8, fp32, chunk 16. Any of them can be overridden (tests do).
    ``forward=False`` leaves out the forward rows, ``backward=False`` the fwd+bwd rows.
    """

    dev = device or ("cuda" if gpu else "cpu")
    theirs = load_mamba_ssm_ssd() if gpu else None
    fla = load_fla() if gpu else None
    if gpu:
        shapes = shapes or [dict(b=b, l=l, **HEADS) for b, l in GPU_SHAPES]
        dtype, q, fc = dtype or torch.bfloat16, chunk or 256, fused_chunks or ()
    else:
        shapes = shapes or [dict(b=1, l=40, h=2, p=8, g=1, n=8)]
        dtype, q, fc = dtype or torch.float32, chunk or 16, fused_chunks or (16,)
    rows = []
    for i, s in enumerate(shapes):
        args, kw = make_inputs(**s, dtype=dtype, device=dev)
        name = shape_name(**s, q=q, dtype=dtype)
        fl = roofline.floor(roofline.ssd_cost(s["b"], s["l"], s["h"], s["p"], s["n"], q, s["g"],
                                              in_bytes=torch.finfo(dtype).bits // 8))["floor_ms"]
        if forward:
            rows += _forward_rows(args, kw, q, fc, name, theirs, fla, fl if gpu else None)
        if backward:
            rows += _fwd_bwd_rows(args, kw, q, name, theirs, oracle=i == 0)
        del args, kw
        if gpu:
            torch.cuda.empty_cache()
    return rows


def _forward_rows(args, kw, q, fused_chunks, name, theirs, fla, floor_ms):
    """Forward rows at one shape: FLA first (if there), then mamba_ssm, then ours; each checked
    against the float32 oracle on the same (rounded) inputs (FLA against it without D)."""
    from mambalearn.mamba2 import reference as ssd

    rows, ref_ms, fla_ms = [], None, None
    if fla is not None:
        want = ssd.mamba_chunk_scan_ref(args[0].float(), *args[1:], q,
                                        **{k: v for k, v in kw.items() if k != "D"})
        m = _measure(fla_fn(fla, args, kw), want=want)
        fla_ms = m["ms"]
        rows.append(_row("fla chunk_simple_gla fwd (no D)", name, m, None, floor_ms))
    want = ssd.mamba_chunk_scan_ref(args[0].float(), *args[1:], q, **kw)
    for backend, fn in forward_fns(theirs, q, fused_chunks).items():
        m = _measure(lambda fn=fn: fn(*args, **kw), want=want)
        ref_ms = m["ms"] if backend.startswith("mamba_ssm") else ref_ms
        rows.append(_row(backend, name, m, ref_ms, floor_ms, fla_ms))
    if rows and rows[0]["backend"].startswith("fla") and ref_ms and fla_ms:
        rows[0]["ratio"] = fla_ms / ref_ms
    return rows


def _fwd_bwd_rows(args, kw, q, name, theirs, oracle):
    """fwd+bwd rows: the oracle backward first (only if ``oracle``: it is slow; its gradients are
    the reference of rel_err), then mamba_ssm, then ours."""
    from mambalearn.mamba2 import mamba_chunk_scan_combined as ours

    dout = torch.randn_like(args[0])
    rows, keep, ref_ms = [], [], None
    if oracle:
        m = _measure(fwd_bwd(lambda *a, **k: ours(*a, q, backward="reference", **k), args, kw,
                             dout), warmup=1, rep=3, keep=keep)
        rows.append(_row("ours fwd+bwd (bwd: PyTorch recompute)", name, m, None, None))
    want = keep[0] if keep else None
    bwd = {"ours fwd+bwd": lambda *a, **k: ours(*a, q, **k)}
    if theirs is not None:
        bwd = {"mamba_ssm fwd+bwd": lambda *a, **k: theirs(*a, q, **k), **bwd}
    for backend, fn in bwd.items():
        m = _measure(fwd_bwd(fn, args, kw, dout), want=want, warmup=3, rep=30)
        ref_ms = m["ms"] if backend.startswith("mamba_ssm") else ref_ms
        rows.append(_row(backend, name, m, ref_ms, None))
    return rows


# launch settings tried by ``backward_steps(sweep=True)``: (the kernel's field of
# ``config.Backward``, its ``config.Launch``es), besides the default (why each is there:
# bench/NOTES_ssd.md)
def _sweep():
    from mambalearn.mamba2.config import Launch as L

    return {
        "2 dstates": ("dstates", [L(4, 3, 128), L(4, 3, 64), L(8, 2, 64)]),
        "4 dCB": ("dcb", [L(4, 2), L(4, 3), L(8, 3), L(8, 2, maxnreg=128), L(4, 2, maxnreg=128)]),
        "5 dC": ("dC", [L(4, 2, 64), L(8, 2, 128), L(8, 3, 64)]),
        "6 dB": ("dB", [L(4, 2, 64), L(8, 2, 128), L(8, 3, 64)]),
        "7 dx": ("dx", [L(8, 2, 64, maxnreg=80), L(4, 2, 64), L(8, 2, 128), L(8, 3, 64)]),
    }


def backward_steps(gpu, shape=None, chunk=None, device=None, sweep=False):
    """Rows timing each step of our Triton backward alone (``backward``'s module doc), then the
    whole of it; inputs as ``run``'s first shape (D, dt_bias, softplus; no z, no initial states).
    Step 0 is timed three ways (chapter 10's stages; chapter 11's chunk-states kernel with
    pointer loads, the backward's default, and with tensor descriptors).
    ``sweep=True`` also times the launches of ``_sweep()`` and 1, 2, 4 head splits in steps
    4–6 (rows "sweep …"), each handed to the launcher as a ``config.Backward``."""
    import dataclasses

    from course.bench import time_ms
    from mambalearn.mamba2 import backward as SB
    from mambalearn.mamba2 import chunk as T
    from mambalearn.mamba2.backward_config import blocks
    from mambalearn.mamba2.config import default_config
    from mambalearn.mamba2.fused.states import chunk_states

    dev = device or ("cuda" if gpu else "cpu")
    s = shape or (dict(b=4, l=4096, **HEADS) if gpu else dict(b=1, l=40, h=2, p=8, g=1, n=8))
    q, dtype = chunk or (256 if gpu else 16), torch.bfloat16 if gpu else torch.float32
    (x, dt, A, B, C), kw = make_inputs(**s, dtype=dtype, device=dev)
    D, bias, l = kw["D"], kw["dt_bias"], s["l"]
    cfg = default_config((s["b"], l, s["h"], s["p"], s["g"], s["n"], q), dev)
    bwd, st = cfg.backward, cfg.stages
    dy = torch.randn_like(x)
    dt_c, dA_cs = T.chunk_cumsum(dt, A, q, bias, True, heads=st.cumsum_heads)
    S = T.chunk_state(x, B, dt_c, dA_cs, None, st)
    H, final = T.state_passing(S, dA_cs, None, None, l, out_dtype=x.dtype, cfg=st)
    CB = T.bmm_chunk(C, B, q, st)
    dS = SB.dstates(dy, C, dA_cs, cfg=bwd)
    nblk = -(-q // blocks(q, bwd))
    ddA = torch.zeros(*dA_cs.shape, nblk + -(-s["n"] // 16), device=dev)  # slots for any BLOCK_N
    dCB = SB.dcb(dy, x, CB, dt_c, dA_cs, ddA, cfg=bwd)
    _, ddt_x, _ = SB.dx_backward(x, dy, B, CB, dS, dt_c, dA_cs, D, cfg=bwd)
    dlast = torch.zeros(dA_cs.shape[:3], device=dev)
    tma = dataclasses.replace(bwd.states, tma=True)
    steps = {  # name: f(c) -> anything; c is a config.Backward
        "0 recompute chunk cumsum": lambda c: T.chunk_cumsum(dt, A, q, bias, True,
                                                             heads=st.cumsum_heads),
        "0 recompute chunk state": lambda c: T.chunk_state(x, B, dt_c, dA_cs, None, st),
        "0 recompute state passing": lambda c: T.state_passing(S, dA_cs, None, None, l,
                                                               out_dtype=x.dtype, cfg=st),
        "0 recompute chunk states (ch 11, both)": lambda c: chunk_states(x, B, dt_c, dA_cs,
                                                                         config=bwd.states),
        "0 recompute chunk states (ch 11, TMA)": lambda c: chunk_states(x, B, dt_c, dA_cs,
                                                                        config=tma),
        "0 recompute bmm CB": lambda c: T.bmm_chunk(C, B, q, st),
        "2 dstates": lambda c: SB.dstates(dy, C, dA_cs, cfg=c),
        "3 state passing bwd": lambda c: SB.state_passing_backward(dS, H, final, dA_cs, l=l,
                                                                   cfg=c),
        "4 dCB": lambda c: SB.dcb(dy, x, CB, dt_c, dA_cs, ddA, cfg=c),
        "5 dC": lambda c: SB.dC_backward(dy, H, C, B, dCB, dA_cs, ddA, nblk, cfg=c),
        "6 dB": lambda c: SB.dB_backward(x, dS, C, dCB, dt_c, dA_cs, cfg=c),
        "7 dx": lambda c: SB.dx_backward(x, dy, B, CB, dS, dt_c, dA_cs, D, cfg=c),
        "8 chunk cumsum bwd": lambda c: SB.chunk_cumsum_backward(ddA.sum(-1), ddt_x, dlast,
                                                                 dt_c, dt, A, bias, True, cfg=c),
    }
    for rec in ("states", "stages"):
        c_rec = cfg.replace(backward=dict(recompute=rec))
        steps[f"all (ssd_backward, recompute={rec})"] = (
            lambda c, c_rec=c_rec: SB.ssd_backward(dy, None, x, dt, A, B, C, q, D=D, dt_bias=bias,
                                                   dt_softplus=True, config=c_rec))
    name = shape_name(**s, q=q, dtype=dtype)
    rows = []

    def timed(backend, fn):
        row = dict(topic="ssd", backend=backend, shape=name)
        try:
            row["ms"] = time_ms(fn, rep=50)
        except Exception as e:  # noqa: BLE001 - a failing variant must not end the sweep
            row.update(ms=None, error=f"{type(e).__name__}: {str(e)[:200]}")
        show(row)
        rows.append(row)

    for step, fn in steps.items():
        timed(f"bwd step {step}", lambda fn=fn: fn(bwd))
    if sweep:
        for step, (kernel, launches) in _sweep().items():
            for launch in launches:
                c = dataclasses.replace(bwd, **{kernel: launch})
                timed(f"sweep {step} {launch}", lambda c=c, fn=steps[step]: fn(c))
        for k in (k for k in (1, 2, 4) if (s["h"] // s["g"]) % k == 0):
            def trio(k=k):
                dCB_k = SB.dcb(dy, x, CB, dt_c, dA_cs, ddA, nsplit=k, cfg=bwd)
                SB.dC_backward(dy, H, C, B, dCB_k, dA_cs, ddA, nblk, cfg=bwd)
                SB.dB_backward(x, dS, C, dCB_k, dt_c, dA_cs, cfg=bwd)
            timed(f"sweep steps 4-6 nsplit={k}", trio)
    return rows


def precision(gpu, chunks=(128, 256), tols=(0.0, 1e-3, 1e-2), shape=None):
    """Share of output elements with |fused − unfused| ≤ tol·(1 + |unfused|), and the relative
    norm difference, per fused design (two launches; one launch with a float32 / float16 state)
    and chunk; the unfused kernel runs at the same chunk size.

    Returns {"two launches q256": {"tol 0": share, …, "rel": ‖fused − unfused‖ / ‖unfused‖}, …}.
    """
    from mambalearn.mamba2 import mamba_chunk_scan_combined as ours
    from mambalearn.mamba2.fused.forward import ssd_fused_forward

    dev = "cuda" if gpu else "cpu"
    s = shape or (dict(b=4, l=4096, **HEADS) if gpu else dict(b=1, l=128, h=2, p=16, g=1, n=16))
    dtype = torch.bfloat16 if gpu else torch.float32  # the interpreter's tl.dot mishandles bf16
    chunks = chunks if gpu else (32, 64)
    chunks = tuple(chunks) + ((64,) if gpu else ())
    args, kw = make_inputs(**s, dtype=dtype, device=dev)
    designs = {"two launches": dict(), "one launch float32 state": dict(launches=1),
               "one launch float16 state": dict(launches=1, state_dtype=torch.float16)}
    table = {}
    for q in chunks:
        ref = ours(*args, q, fused=False, **kw).float()
        for label, opts in designs.items():  # at the same chunk as the unfused kernel
            got = ssd_fused_forward(*args, q, **opts, **kw)[0].float()
            d = (got - ref).abs()
            table[f"{label} q{q}"] = {f"tol {t:g}": (d <= t * (1 + ref.abs())).float().mean().item()
                                      for t in tols}
            table[f"{label} q{q}"]["rel"] = rel_error(got, ref)
    return table


if __name__ == "__main__":
    import sys

    from course.bench import table

    gpu = torch.cuda.is_available()
    if "--backward" in sys.argv:  # the first shape only: fwd+bwd rows, then the backward's steps
        rows = run(gpu, shapes=[dict(b=4, l=4096, **HEADS)] if gpu else None, forward=False)
        rows += backward_steps(gpu, sweep="--sweep" in sys.argv)
    else:
        rows = run(gpu)
    print(table(rows))
