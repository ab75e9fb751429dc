"""Mamba-1 launch experiments on the GPU, each checked against the default kernels, in one call.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.experiments [--set NAME] [--limit S] [--out DIR]
    python3 -m bench.gpu.experiments --cpu-smoke   # the control flow, interpreted, tiny

Every row of ``EXPERIMENTS``: forward and forward+backward median ms, peak GB of fwd+bwd, and the
largest relative error of out and of the eight gradients against the default kernels on the same
inputs (a broken variant shows here, not as a fast row). ``chunk`` replaces
the default config's chunk (the steps between stored states, shared by forward and backward)
for that row. mamba_ssm's CUDA kernel is timed at each shape in the same process when its built
extension is in .mamba_ref/build. A short table is printed last; the rows are recorded in
DIR/<device>_selective_scan_experiments_<date>.json (``bench.gpu.record``, default DIR: $OUT).
"""

import argparse
import dataclasses
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)

from bench.gpu.record import record  # noqa: E402
from mambalearn.mamba1.config import Backward, Forward  # noqa: E402

SO = lambda **k: Backward("state-outer", **{"num_warps": 1, **k})  # the state-outer backward
RUN_LOOP = Backward("sub-block", block_d=32, block_l=8, num_warps=1, even=False)  # n64, 11-29
F64 = lambda **k: Forward(unroll=False, **k)  # the scan forward's run-time state loop, no masks
REC = lambda **k: Forward(layout="recurrent", **{"block_l": 8, "num_warps": 1, **k})
EXPERIMENTS = {  # name -> rows: label, n, forward (None: default), backward, chunk[, l]
    "first": [  # 2026-11-30 session 2, call 1 (the defaults then: bwd 2x64w1, n64 run-time loop)
        ("default", 16, None, None, None),
        ("bwd so 1x64w1", 16, None, SO(block_d=1), None),
        ("bwd so 2x64w1 r96", 16, None, SO(block_d=2, maxnreg=96), None),
        ("bwd so 4x64w2", 16, None, SO(block_d=4, num_warps=2), None),
        ("default", 64, None, RUN_LOOP, None),
        ("bwd so 1x128w1", 64, None, SO(block_d=1), None),
        ("bwd so 2x128w1", 64, None, SO(block_d=2), None),
        ("chunk 64, bwd so 2x64w1", 64, None, SO(block_d=2), 64),
        ("chunk 64, bwd so 1x64w1", 64, None, SO(block_d=1), 64),
    ],
    "registers": [  # call 2: registers per thread against occupancy, n64 forward tiles
        ("default (bwd r96)", 16, None, None, None),
        ("bwd so 2x64w1 r80", 16, None, SO(block_d=2, maxnreg=80), None),
        ("bwd so 2x64w1 r72", 16, None, SO(block_d=2, maxnreg=72), None),
        ("bwd so 2x64w1 r64", 16, None, SO(block_d=2, maxnreg=64), None),
        ("bwd so 2x64w1 r112", 16, None, SO(block_d=2, maxnreg=112), None),
        ("default (bwd so 1x128w1)", 64, None, None, None),
        ("bwd so 1x128w1 r80", 64, None, SO(block_d=1, maxnreg=80), None),
        ("bwd so 1x128w1 r64", 64, None, SO(block_d=1, maxnreg=64), None),
        ("fwd 64x16w2", 64, F64(block_d=64, block_l=16, num_warps=2), None, None),
        ("fwd 32x16w1", 64, F64(block_d=32, block_l=16, num_warps=1), None, None),
        ("fwd 64x32w8", 64, F64(block_d=64, block_l=32, num_warps=8), None, None),
        ("fwd 128x32w8", 64, F64(block_d=128, block_l=32, num_warps=8), None, None),
        ("fwd 64x32w4 r128", 64, F64(block_d=64, block_l=32, num_warps=4, maxnreg=128),
         None, None),
    ],
    "defaults": [  # the defaults, with l8192 (6th entry: l)
        ("default", 16, None, None, None),
        ("default", 64, None, None, None),
        ("default", 16, None, None, None, 8192),
    ],
    "n64fwd": [  # call 5: the n64 scan forward with state n + 1's loads issued during state n
        ("scan fwd, prefetch 64x32w8", 64, F64(block_d=64, block_l=32, num_warps=8), None,
         None),
        ("fwd 64x32w8 unroll 2", 64, F64(block_d=64, block_l=32, num_warps=8, state_unroll=2),
         None, None),
        ("fwd 32x32w8 unroll 2", 64, F64(block_d=32, block_l=32, num_warps=8, state_unroll=2),
         None, None),
        ("fwd 32x32w8", 64, F64(block_d=32, block_l=32, num_warps=8), None, None),
        ("fwd 32x32w4 unroll 2", 64, F64(block_d=32, block_l=32, num_warps=4, state_unroll=2),
         None, None),
        ("default", 16, None, None, None),
    ],
    "recurrent": [  # after 2026-12-01: the recurrent forward's tiles (one channel a thread)
        ("default (recurrent 32x8w1)", 64, None, None, None),
        ("recurrent 16x8w1", 64, REC(block_d=16), None, None),
        ("recurrent 64x8w2", 64, REC(block_d=64, num_warps=2), None, None),
        ("default (scan 64x32w4)", 16, None, None, None),
        ("recurrent 32x8w1", 16, REC(block_d=32), None, None),
    ],
}


METHOD = ("do_bench medians (mambalearn.timing.time_ms), one process; b8 d2048 bf16 with z, D, "
          "delta_bias, softplus; err = largest relative error of out and the eight gradients "
          "against the default kernels on the same inputs; peak = max_memory_allocated of fwd+bwd")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=400)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"),
                    help="folder of the results file")
    ap.add_argument("--json", help="(older runs' flag) a file name: its folder is --out")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--set", default="registers", choices=sorted(EXPERIMENTS))
    a = ap.parse_args()
    if a.json:
        a.out = os.path.dirname(os.path.abspath(a.json))
    t0 = time.time()
    import torch

    from course.bench import peak_gb, time_ms
    from course.bench.selective_scan import fwd_bwd, inputs, load_mamba_ssm
    from mambalearn.mamba1 import default_config, selective_scan_fn
    from mambalearn.testing import rel_error
    gpu = torch.cuda.is_available() and not a.cpu_smoke
    dev, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    rows, refs, peer = [], {}, load_mamba_ssm() if gpu else None

    def grads(fn, x):
        leaves = {k: v.detach().requires_grad_() for k, v in x.items()}
        out = fn(**leaves, delta_softplus=True)
        out.backward(torch.ones_like(out))
        return [out] + [v.grad for v in leaves.values()]

    def measure():
        shapes = {}
        for label, n, fcfg, bcfg, chunk, *more in EXPERIMENTS[a.set]:
            length = more[0] if more else 2048
            if time.time() - t0 > a.limit - 30:
                print(f"skip {label} n{n}: budget", flush=True)
                continue
            s = dict(b=8, d=2048, l=length, n=n) if gpu else dict(b=1, d=8, l=32, n=min(n, 20))
            key = (n, length)
            if key not in shapes:
                shapes[key] = inputs(**s, device=torch.device(dev), dtype=dtype)
                refs[key] = grads(selective_scan_fn, shapes[key])
                if peer is not None:
                    errs = zip(grads(peer, shapes[key]), refs[key], strict=True)
                    rows.append(dict(label="mamba_ssm cuda", n=n, l=length, chunk="-",
                                     err=max(rel_error(g, r) for g, r in errs)))
                    with torch.no_grad():
                        rows[-1]["fwd_ms"] = time_ms(
                            lambda x=shapes[key]: peer(**x, delta_softplus=True))
                    rows[-1]["fb_ms"] = time_ms(fwd_bwd(peer, shapes[key]))
                    rows[-1]["peak_gb"] = peak_gb(fwd_bwd(peer, shapes[key]))
                    print(rows[-1], flush=True)
            x = shapes[key]
            if len(shapes) > 1:  # keep one shape's inputs on the GPU at a time
                for k in [k for k in shapes if k != key]:
                    del shapes[k], refs[k]
            cfg = default_config(s["n"], dev)
            changes = {k: v for k, v in (("forward", fcfg), ("backward", bcfg), ("chunk", chunk))
                       if v is not None}
            if not gpu:  # the interpreter's tiles, every other setting as on the GPU
                changes = {k: dataclasses.replace(v, block_d=2, num_warps=1) if k != "chunk" else v
                           for k, v in changes.items()}
            cfg = cfg.replace(**changes)
            fn = (lambda c: lambda **k: selective_scan_fn(**k, config=c))(cfg)
            row = dict(label=label, n=n, l=length, chunk=cfg.chunk)
            try:
                errs = zip(grads(fn, x), refs[key], strict=True)
                row["err"] = max(rel_error(g, r) for g, r in errs)
                with torch.no_grad():
                    row["fwd_ms"] = time_ms(lambda f=fn, x=x: f(**x, delta_softplus=True))
                row["fb_ms"] = time_ms(fwd_bwd(fn, x))
                row["peak_gb"] = peak_gb(fwd_bwd(fn, x))
            except Exception as e:  # noqa: BLE001 - one failing variant must not end the run
                row["error"] = f"{type(e).__name__}: {e}"[:200]
            print(row, flush=True)
            rows.append(row)

    try:
        measure()
    finally:  # what was measured is recorded, even when the budget cut the set short
        record("selective_scan_experiments", [dict(r, set=a.set) for r in rows],
               " ".join(["python3 -m bench.gpu.experiments", *sys.argv[1:]]),
               peers={"mamba_ssm": "2.3.2.post1 (CUDA, .mamba_ref/build)"} if peer else {},
               out_dir=a.out, method=METHOD)
    _table(rows)


def _table(rows):
    print(f"{'label':28s} {'n':>3s} {'l':>5s} {'chunk':>5s} {'fwd ms':>8s} {'f+b ms':>8s} "
          f"{'bwd ms':>8s} {'peak GB':>8s} {'err':>8s}")
    f = lambda v, p=3: f"{v:.{p}f}" if isinstance(v, float) else "-"
    for r in rows:
        bwd = r["fb_ms"] - r["fwd_ms"] if "fb_ms" in r else None
        print(f"{r['label'][:28]:28s} {r['n']:3d} {r['l']:5d} {str(r['chunk']):>5s} "
              f"{f(r.get('fwd_ms')):>8s} {f(r.get('fb_ms')):>8s} {f(bwd):>8s} "
              f"{f(r.get('peak_gb')):>8s} "
              f"{r.get('err', 0):8.1e} {r.get('error', '')[:60]}")


if __name__ == "__main__":
    main()
