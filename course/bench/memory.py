"""Bench topic "memory" (chapters 05–07): what storing states costs, and what recomputing saves.

Rows (fp32, b8 d2048 n16 on a GPU; a tiny shape on a CPU):
  * the copy bandwidth and launch overhead of this machine, and the naive PyTorch scan (Ā and B̄x
    materialized, a loop over l): time, modelled bytes, achieved bandwidth, × the fused floor;
  * fwd+bwd of the selective scan with z, D, delta_bias, softplus: store-everything (autograd
    through ``selective_scan_chunked``), ``torch.utils.checkpoint`` per chunk, and chunked
    recomputation (``selective_scan_recompute``): time and peak memory beyond the inputs, at l2048
    and over a sweep of l (GPU: ``torch.cuda.max_memory_allocated``; CPU: saved-tensor bytes);
  * the chunk-size trade-off: ``chunked_scan`` forward time, and recompute fwd+bwd time and memory,
    against q.

    python -m mambalearn bench memory       (or: python -c "from course.bench import memory;
                                              print(memory.run(True))")
"""

import torch

from course import bench, roofline
from mambalearn.autograd import (
    saved_tensor_bytes,
    selective_scan_checkpointed,
    selective_scan_recompute,
)
from mambalearn.scan.chunked import chunked_scan, selective_scan_chunked
from mambalearn.testing import rel_error

BACKENDS = {
    "store-everything": selective_scan_chunked,
    "checkpoint": selective_scan_checkpointed,
    "recompute": selective_scan_recompute,
}


def _inputs(b, d, l, n, device, g=None):
    """Fresh random fp32 inputs of the Mamba-1 scan (with z, D, delta_bias), leaves with grads."""
    g = g or torch.Generator(device=device).manual_seed(0)
    r = lambda *s: torch.randn(*s, device=device, generator=g)
    x = dict(u=r(b, d, l), delta=r(b, d, l) * 0.5 - 1.0, A=-torch.exp(r(d, n) * 0.5),
             B=r(b, n, l), C=r(b, n, l), D=r(d), z=r(b, d, l), delta_bias=r(d) * 0.1)
    for t in x.values():
        t.requires_grad_(True)
    return x, r(b, d, l)  # inputs, dout


def _fwd_bwd(fn, x, dout, q):
    for t in x.values():
        t.grad = None
    out = fn(**x, delta_softplus=True, chunk_size=q)
    out.backward(dout)


def _row(name, shape, fn, x, dout, q, gpu, **extra):
    """Time and peak memory (GPU) or saved bytes (CPU) of one fwd+bwd."""
    run = lambda: _fwd_bwd(fn, x, dout, q)
    ms = bench.time_ms(run, warmup=1, rep=1) if gpu else bench.time_ms(run)
    peak = bench.peak_gb(run) if gpu else None
    with saved_tensor_bytes(exclude=list(x.values())) as saved:
        fn(**x, delta_softplus=True, chunk_size=q)
    return dict(topic="memory", backend=name, shape=shape, ms=ms, peak_gb=peak,
                saved_gb=saved["bytes"] / 1e9, **extra)


def _agreement(x, dout, q, shape):
    """Correctness at the benchmark shape: recompute vs store-everything, max relative error."""
    grads = []
    for fn in (selective_scan_recompute, selective_scan_chunked):
        _fwd_bwd(fn, x, dout, q)
        grads.append({k: t.grad.clone() for k, t in x.items()})
        for t in x.values():
            t.grad = None
    err = max(rel_error(grads[0][k], grads[1][k]) for k in x)
    return dict(topic="memory", backend="recompute vs store-everything grads", shape=shape,
                ms=None, max_rel_err=err)


def _machine_rows(gpu, b, d, l, n):
    rows, m = [], None
    if gpu:
        m = roofline.this_machine()
        rows.append(dict(topic="memory", backend="copy bandwidth", shape="2 GiB", ms=None,
                         GBps=m.bandwidth / 1e9, launch_us=m.launch_s * 1e6))
    naive = roofline.measure_naive(b, d, l, n, machine=m)
    shape = f"b{b} d{d} n{n} l{l} fp32"
    rows.append(dict(topic="memory", backend="naive scan (05)", shape=shape, ms=naive["ms"],
                     floor_pct=100 / naive["x_floor"], GBps=naive["GBps"],
                     bandwidth_pct=naive["bandwidth_pct"]))
    return rows


def run(gpu):
    """All rows of the topic; on a CPU tiny shapes (the numbers then only show the method)."""
    b, d, n, l = (8, 2048, 16, 2048) if gpu else (1, 8, 4, 64)
    sweep = (512, 1024, 2048, 4096) if gpu else (32, 64, 128)
    q = 32 if gpu else 8
    device = "cuda" if gpu else "cpu"
    rows = bench.Rows()
    for r in _machine_rows(gpu, b, d, l, n):
        rows.append(r)
    for L in sweep:  # peak memory and time of fwd+bwd against l, per backend
        x, dout = _inputs(b, d, L, n, device)
        for name, fn in BACKENDS.items():
            rows.append(_row(name, f"b{b} d{d} n{n} l{L} fp32 q{q}", fn, x, dout, q, gpu))
        del x, dout
    x, dout = _inputs(b, d, l, n, device)
    rows.append(_agreement(x, dout, q, f"b{b} d{d} n{n} l{l} fp32 q{q}"))
    for qq in ((8, 16, 32, 64, 128) if gpu else (4, 8, 16)):  # the recompute chunk size
        rows.append(_row("recompute", f"b{b} d{d} n{n} l{l} fp32 q{qq}", selective_scan_recompute,
                         x, dout, qq, gpu))
    del x, dout
    a = torch.rand(b, d, l, n, device=device) * 0.5 + 0.5  # chunked_scan forward alone, vs q
    u = torch.randn(b, d, l, n, device=device)
    for qq in ((8, 16, 32, 64, 128, 256) if gpu else (4, 8, 16, 64)):
        fwd = lambda qq=qq: chunked_scan(a, u, qq)
        ms = bench.time_ms(fwd, warmup=1, rep=1) if gpu else bench.time_ms(fwd)
        rows.append(dict(topic="memory", backend="chunked_scan fwd (06)",
                         shape=f"b{b} d{d} n{n} l{l} fp32 q{qq}", ms=ms))
    return rows


if __name__ == "__main__":
    import json
    import sys

    rows = run(torch.cuda.is_available())
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)
    print(bench.table(rows))
    extra = ["saved_gb", "GBps", "bandwidth_pct", "launch_us", "max_rel_err"]
    for r in rows:
        print(r["backend"], r["shape"], {k: f"{r[k]:.4g}" for k in extra if r.get(k) is not None})
