"""Device script: what finite answers at A = −∞ cost — two source trees timed side by side.

    python3 -m bench.gpu.ieee_cost --base DIR [--rounds 5] [--json F]     (H200, ≈ 5 min)
    python3 -m bench.gpu.ieee_cost --base DIR --tiny --rounds 1             (interpreter smoke)

``DIR`` holds another checkout's ``mambalearn`` (e.g. ``git archive <commit> mambalearn | tar -x
-C DIR``); this checkout is the other. Each round runs one worker process per tree, the trees in
alternating order, and each worker times every case with ``triton.testing.do_bench`` (median of
its repetitions) after a warm-up call; the table gives each tree's median over rounds and the
ratio this / base. The cases are the launches the change touched, at the shapes issue tables
time: SSD's fused forward (two launches and one) and fwd+bwd at b4 l4096 h80 p64 n128 bf16; the
Mamba-1 fwd+bwd at b8 d2048 l2048, n16 and n64; Mamba-3 SISO fwd and fwd+bwd and MIMO rank 4
fwd+bwd at b8 l2048 h32 p64 n128. Expected: within noise (≤ 1 %) everywhere — the change adds a
select per element only in the small cumsum launches and the Mamba-3 s tile, one per (channel,
state) in the Mamba-1 backward.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


def cases(tiny):
    import torch

    dev = "cuda" if torch.cuda.is_available() and not tiny else "cpu"
    bf = torch.bfloat16 if dev == "cuda" else torch.float32
    g = torch.Generator(device=dev).manual_seed(0)
    r = lambda *s, dt=bf: torch.randn(*s, device=dev, generator=g).to(dt)  # noqa: E731
    out = {}

    from mambalearn.mamba2 import mamba_chunk_scan_combined
    from mambalearn.mamba2.fused.forward import ssd_fused_forward

    b, l, h, p, n = (4, 4096, 80, 64, 128) if not tiny else (1, 40, 2, 16, 16)
    q = 256 if not tiny else 16
    x, B, C = r(b, l, h, p), r(b, l, 1, n), r(b, l, 1, n)
    dt = r(b, l, h, dt=torch.float32)
    A = -torch.rand(h, device=dev, generator=g) - 0.5
    kw = dict(D=r(h, dt=torch.float32), dt_bias=r(h, dt=torch.float32), dt_softplus=True)
    out["ssd fused fwd"] = lambda: ssd_fused_forward(x, dt, A, B, C, q, **kw)
    out["ssd one-launch fwd"] = lambda: ssd_fused_forward(x, dt, A, B, C, q, launches=1, **kw)
    leaves = [t.clone().requires_grad_() for t in (x, dt, A, B, C)]
    out["ssd fwd+bwd"] = lambda: mamba_chunk_scan_combined(*leaves, q, **kw).sum().backward()

    from mambalearn.mamba1 import selective_scan_fn

    for n1 in (16, 64):
        b, d, l = (8, 2048, 2048) if not tiny else (1, 8, 40)
        n1 = n1 if not tiny else 4
        m1 = [r(b, d, l), r(b, d, l), -torch.rand(d, n1, device=dev, generator=g) - 0.5,
              r(b, n1, l), r(b, n1, l), r(d, dt=torch.float32), r(b, d, l)]
        m1 = [t.requires_grad_() for t in m1]
        out[f"mamba1 n{n1} fwd+bwd"] = (lambda m1=m1: selective_scan_fn(
            *m1, delta_softplus=True).sum().backward())

    from mambalearn.mamba3 import mamba3_mimo_combined, mamba3_siso_combined

    b, l, h, p, n, na = (8, 2048, 32, 64, 128, 32) if not tiny else (1, 40, 2, 16, 16, 4)
    s3 = dict(Q=r(b, l, 1, n), K=r(b, l, 1, n), V=r(b, l, h, p),
              ADT=-torch.rand(b, h, l, device=dev, generator=g) * 0.1,
              DT=torch.rand(b, h, l, device=dev, generator=g) * 0.1 + 0.01,
              Trap=r(b, h, l, dt=torch.float32), Q_bias=r(h, n, dt=torch.float32),
              K_bias=r(h, n, dt=torch.float32), Angles=r(b, l, h, na, dt=torch.float32),
              D=r(h, dt=torch.float32), Z=r(b, l, h, p))
    c3 = 64 if not tiny else 16
    out["mamba3 siso fwd"] = lambda: mamba3_siso_combined(**s3, chunk_size=c3)
    s3g = {k: v.clone().requires_grad_() for k, v in s3.items()}
    out["mamba3 siso fwd+bwd"] = lambda: mamba3_siso_combined(**s3g, chunk_size=c3).sum().backward()
    rk = 4 if not tiny else 2
    mm = dict(s3, Q=r(b, l, rk, 1, n), K=r(b, l, rk, 1, n), Q_bias=r(h, rk, n, dt=torch.float32),
              K_bias=r(h, rk, n, dt=torch.float32), MIMO_V=r(h, rk, p, dt=torch.float32),
              MIMO_Z=r(h, rk, p, dt=torch.float32), MIMO_Out=r(h, rk, p, dt=torch.float32))
    mmg = {k: v.clone().requires_grad_() for k, v in mm.items()}
    out[f"mamba3 mimo r{rk} fwd+bwd"] = lambda: mamba3_mimo_combined(
        **mmg, chunk_size=(16 if not tiny else 8)).sum().backward()
    return out


def worker(tiny):
    import torch
    import triton.testing

    import mambalearn

    print(f"mambalearn from {mambalearn.__file__}", file=sys.stderr)
    times = {}
    for name, fn in cases(tiny).items():
        fn()  # compile, tune nothing: the configs are fixed
        if torch.cuda.is_available() and not tiny:
            torch.cuda.synchronize()
            times[name] = triton.testing.do_bench(fn, warmup=100, rep=400)
        else:
            times[name] = 1.0  # the interpreter: a smoke test, not a time
    print(json.dumps(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", help="a directory holding the other tree's mambalearn package")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help="toy sizes in the interpreter")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.tiny)
    if not a.base or not (Path(a.base) / "mambalearn").is_dir():
        ap.error("--base must be a directory holding a mambalearn package")
    trees = {"base": str(Path(a.base).resolve()), "this": str(HERE)}
    got = {k: [] for k in trees}
    for i in range(a.rounds):
        for k in (("base", "this") if i % 2 == 0 else ("this", "base")):
            env = dict(os.environ, PYTHONPATH=trees[k], MAMBALEARN_PROGRESS="0",
                       MAMBALEARN_RESULTS=str(HERE / "docs" / "results"))  # one store for both
            if a.tiny:
                env["TRITON_INTERPRET"] = "1"
            # run as a file from the tree's directory: ``-m`` would put this checkout's root (the
            # working directory) ahead of PYTHONPATH, and its mambalearn would win
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker"] + (
                ["--tiny"] if a.tiny else [])
            res = subprocess.run(cmd, cwd=trees[k], env=env, capture_output=True, text=True)
            if res.returncode:
                sys.exit(f"{k} worker failed:\n{res.stderr[-3000:]}")
            got[k].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {i + 1} {k}: done", flush=True)
    rows = []
    for name in got["this"][0]:
        med = {k: statistics.median(r[name] for r in got[k]) for k in trees}
        rows.append(dict(case=name, base_ms=med["base"], this_ms=med["this"],
                         ratio=med["this"] / med["base"]))
        print(f"{name:26s} base {med['base']:9.4f} ms  this {med['this']:9.4f} ms  "
              f"this/base {med['this'] / med['base']:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps(dict(rounds=a.rounds, rows=rows), indent=1))


if __name__ == "__main__":
    main()
