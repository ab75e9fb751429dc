"""Device script for chapters 10-11: correctness at real sizes and timings vs mamba_ssm's Triton SSD.

Run on the GPU machine from the repo root (with .mamba_ref carried):
    PYTHONUNBUFFERED=1 python bench/gpu_ssd.py
Writes details to $OUT/ssd.json and prints a short table last.
"""

import json
import os
import sys
import types

import torch

sys.path.insert(0, os.getcwd())
REF = ".mamba_ref/mamba_ssm-2.3.2.post1/mamba_ssm"
for name, sub in [("mamba_ssm", ""), ("mamba_ssm.ops", "/ops"), ("mamba_ssm.ops.triton", "/ops/triton"),
                  ("mamba_ssm.utils", "/utils")]:
    m = types.ModuleType(name)
    m.__path__ = [REF + sub]
    sys.modules[name] = m
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as M  # noqa: E402

from mambalearn import ssd  # noqa: E402
from mambalearn.bench import peak_gb, time_ms  # noqa: E402
from mambalearn.triton.ssd import mamba_chunk_scan_combined as ours  # noqa: E402
from mambalearn.triton.ssd_fused import ssd_fused_forward  # noqa: E402

dev = "cuda"
OUT = os.environ.get("OUT", "/tmp")
rows, details = [], {}
COPY_BW = 4.25e12  # bytes/s read+write, DESIGN.md §6 (H200, 2026-11-29)


def make(b, l, h=80, p=64, g=1, n=128, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(b, l, h, p, device=dev, dtype=dtype)
    dt = torch.randn(b, l, h, device=dev) - 2.0
    A = -torch.rand(h, device=dev) * 8 - 1.0
    B = torch.randn(b, l, g, n, device=dev, dtype=dtype)
    C = torch.randn(b, l, g, n, device=dev, dtype=dtype)
    D = torch.randn(h, device=dev)
    bias = torch.rand(h, device=dev) - 2.0
    return x, dt, A, B, C, dict(D=D, dt_bias=bias, dt_softplus=True)


def floor_ms(b, l, h=80, p=64, g=1, n=128):
    byts = 2 * b * l * h * p * 2 + 2 * b * l * g * n * 2 + b * l * h * 4  # x in, out, B, C, dt
    return byts / COPY_BW * 1e3


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def add(backend, shape, ms, ref_ms=None, floor=None, peak=None):
    rows.append(dict(topic="ssd", backend=backend, shape=shape, ms=ms,
                     ratio=None if ref_ms is None else ms / ref_ms,
                     floor_pct=None if floor is None else 100 * floor / ms, peak_gb=peak))
    print(rows[-1], flush=True)
    json.dump(dict(rows=rows, details=details), open(f"{OUT}/ssd.json", "w"), indent=1)


# 1. correctness at the first shape (fp32 oracle) and the precision table
x, dt, A, B, C, kw = make(4, 4096)
want = ssd.mamba_chunk_scan_ref(x, dt, A, B, C, 256, **kw)  # float32 oracle, output cast to bf16
want32 = ssd.mamba_chunk_scan_ref(x.float(), dt, A, B, C, 256, **kw)
o_m = M(x, dt, A, B, C, 256, **kw)
o_u = ours(x, dt, A, B, C, 256, **kw)
details["rel_err_vs_fp32_oracle"] = {"mamba_ssm": rel(o_m, want32), "ours_unfused": rel(o_u, want32)}
prec = {}
for sd in (torch.float32, torch.float16):
    for q in (128, 256):
        o_f, _ = ssd_fused_forward(x, dt, A, B, C, q, state_dtype=sd, **kw)
        o_uq = ours(x, dt, A, B, C, q, **kw)
        d = (o_f.float() - o_uq.float()).abs()
        key = f"{str(sd).split('.')[-1]} q{q}"
        prec[key] = {f"tol {t:g}": (d <= t * (1 + o_uq.float().abs())).float().mean().item()
                     for t in (0.0, 1e-3, 1e-2)}
        details["rel_err_vs_fp32_oracle"][f"fused {key}"] = rel(o_f, want32)
details["precision_fused_vs_unfused"] = prec
print(json.dumps(details, indent=1), flush=True)

# 2. fused config sweep at the first shape
sweep = {}
for q in (128, 256):
    for bm, bk, bp, nw, ns in [(64, 64, 64, 4, 2), (64, 64, 32, 4, 2), (64, 64, 16, 4, 2),
                               (64, 32, 32, 4, 3), (128, 64, 32, 8, 2)]:
        if bm > q:
            continue
        try:
            f = lambda: ssd_fused_forward(x, dt, A, B, C, q, block_m=bm, block_k=bk, block_p=bp,
                                          num_warps=nw, num_stages=ns, **kw)
            sweep[(q, bm, bk, bp, nw, ns)] = time_ms(f)
        except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
            print("skip", q, bm, bk, bp, nw, ns, type(e).__name__, str(e)[:100])
details["fused_sweep"] = {str(k): v for k, v in sweep.items()}
print("fused sweep", details["fused_sweep"], flush=True)
best = {q: min((k for k in sweep if k[0] == q), key=sweep.get) for q in (128, 256)}

# 3. timings at the three target shapes
for b, l in [(4, 4096), (1, 16384), (16, 1024)]:
    x, dt, A, B, C, kw = make(b, l)
    shape = f"b{b} l{l} h80 p64 n128 g1 q256 bf16"
    fl = floor_ms(b, l)
    t_m = time_ms(lambda: M(x, dt, A, B, C, 256, **kw))
    add("mamba_ssm fwd", shape, t_m, t_m, fl)
    add("ours unfused fwd", shape, time_ms(lambda: ours(x, dt, A, B, C, 256, **kw)), t_m, fl)
    for q in (256, 128):
        _, bm, bk, bp, nw, ns = best[q]
        for sd in (torch.float32, torch.float16):
            f = lambda: ssd_fused_forward(x, dt, A, B, C, q, state_dtype=sd, block_m=bm, block_k=bk,
                                          block_p=bp, num_warps=nw, num_stages=ns, **kw)
            add(f"ours fused fwd q{q} {str(sd).split('.')[-1]} state", shape, time_ms(f), t_m, fl)
    xs = [t.detach().clone().requires_grad_() for t in (x, B, C)]
    dts = dt.clone().requires_grad_()
    dout = torch.randn_like(x)

    def fb(fn):
        def go():
            o = fn(xs[0], dts, A, xs[1], xs[2], 256, **kw)
            torch.autograd.grad(o, [xs[0], dts, xs[1], xs[2]], dout)
        return go
    t_mb = time_ms(fb(M), warmup=5, rep=20)
    add("mamba_ssm fwd+bwd", shape, t_mb, t_mb, None, peak_gb(fb(M)))
    add("ours fwd+bwd (bwd = PyTorch recompute)", shape, time_ms(fb(ours), warmup=1, rep=5), t_mb,
        None, peak_gb(fb(ours)))
    del xs, dts, dout
    torch.cuda.empty_cache()

from mambalearn.bench import table  # noqa: E402

json.dump(dict(rows=rows, details=details), open(f"{OUT}/ssd.json", "w"), indent=1)
print(json.dumps(details["rel_err_vs_fp32_oracle"], indent=1))
print(json.dumps(prec, indent=1))
print(table(rows))
