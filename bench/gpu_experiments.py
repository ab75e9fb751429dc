"""Mamba-1 launch experiments on the GPU, each checked against the default kernels, in one call.

    PYTHONUNBUFFERED=1 python3 bench/gpu_experiments.py [--limit S] [--json FILE]
    python3 bench/gpu_experiments.py --cpu-smoke      # control flow in the interpreter, tiny

Every row of ``EXPERIMENTS``: forward and forward+backward median ms, peak GB of fwd+bwd, and the
largest relative error of out and of the eight gradients against the default kernels on the same
inputs (a broken variant shows here, not as a fast row). ``chunk`` replaces
``selective_scan.chunk_size`` (the steps between stored states, shared by forward and backward)
for that row. mamba_ssm's CUDA kernel is timed at each shape in the same process when its built
extension is in .mamba_ref/build. A short table is printed last.
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

SO = dict(LAYOUT="state-outer", EVEN=True, REV_LOADS=False)
EXPERIMENTS = [  # label, n, forward config (None: default), backward config, chunk (None: default)
    ("default", 16, None, None, None),
    ("bwd so 1x64w1", 16, None, dict(SO, BLOCK_D=1, num_warps=1), None),
    ("bwd so 2x64w1 r96", 16, None, dict(SO, BLOCK_D=2, num_warps=1, maxnreg=96), None),
    ("bwd so 4x64w2", 16, None, dict(SO, BLOCK_D=4, num_warps=2), None),
    ("default", 64, None, None, None),
    ("bwd so 1x128w1", 64, None, dict(SO, BLOCK_D=1, num_warps=1), None),
    ("bwd so 2x128w1", 64, None, dict(SO, BLOCK_D=2, num_warps=1), None),
    ("chunk 64, bwd so 2x64w1", 64, None, dict(SO, BLOCK_D=2, num_warps=1), 64),
    ("chunk 64, bwd so 1x64w1", 64, None, dict(SO, BLOCK_D=1, num_warps=1), 64),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=400)
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "/tmp/out"),
                                                   "experiments.json"))
    ap.add_argument("--cpu-smoke", action="store_true")
    a = ap.parse_args()
    t0 = time.time()
    import torch

    from mambalearn.bench import peak_gb, time_ms
    from mambalearn.bench.selective_scan import inputs, load_mamba_ssm
    from mambalearn.testing import rel_error
    from mambalearn.triton import selective_scan as T
    gpu = torch.cuda.is_available() and not a.cpu_smoke
    dev, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    default_chunk = T.chunk_size
    rows, refs, peer = [], {}, load_mamba_ssm() if gpu else None

    def grads(fn, x):
        leaves = {k: v.detach().requires_grad_() for k, v in x.items()}
        out = fn(**leaves, delta_softplus=True)
        out.backward(torch.ones_like(out))
        return [out] + [v.grad for v in leaves.values()]

    def both(fn, x):
        leaves = {k: v.detach().requires_grad_() for k, v in x.items()}

        def run():
            out = fn(**leaves, delta_softplus=True)
            out.backward(torch.ones_like(out))
            for v in leaves.values():
                v.grad = None
        return run

    shapes = {}
    for label, n, fcfg, bcfg, chunk in EXPERIMENTS:
        if time.time() - t0 > a.limit - 30:
            print(f"skip {label} n{n}: budget", flush=True)
            continue
        s = dict(b=8, d=2048, l=2048, n=n) if gpu else dict(b=1, d=8, l=32, n=min(n, 20))
        if n not in shapes:
            shapes[n] = inputs(**s, device=torch.device(dev), dtype=dtype)
            refs[n] = grads(T.selective_scan_fn, shapes[n])
            if peer is not None:
                rows.append(dict(label="mamba_ssm cuda", n=n, chunk="-", err=max(
                    rel_error(g, r) for g, r in zip(grads(peer, shapes[n]), refs[n]))))
                f = lambda: peer(**shapes[n], delta_softplus=True)
                with torch.no_grad():
                    rows[-1]["fwd_ms"] = time_ms(f)
                rows[-1]["fb_ms"] = time_ms(both(peer, shapes[n]))
                rows[-1]["peak_gb"] = peak_gb(both(peer, shapes[n]))
                print(rows[-1], flush=True)
        x = shapes[n]
        cfg = {"fwd": fcfg, "bwd": bcfg}
        if not gpu:  # the interpreter's tiles, every other key as on the GPU
            cfg = {k: dict(v, BLOCK_D=2, num_warps=1) if v else v for k, v in cfg.items()}
        fn = lambda **k: T.selective_scan_fn(**k, config=cfg)
        row = dict(label=label, n=n, chunk=chunk or default_chunk(n))
        T.chunk_size = (lambda n_: chunk) if chunk else default_chunk
        try:
            row["err"] = max(rel_error(g, r) for g, r in zip(grads(fn, x), refs[n]))
            with torch.no_grad():
                row["fwd_ms"] = time_ms(lambda: fn(**x, delta_softplus=True))
            row["fb_ms"] = time_ms(both(fn, x))
            row["peak_gb"] = peak_gb(both(fn, x))
        except Exception as e:  # noqa: BLE001 - one failing variant must not end the run
            row["error"] = f"{type(e).__name__}: {e}"[:200]
        T.chunk_size = default_chunk
        print(row, flush=True)
        rows.append(row)
        json.dump(rows, open(a.json, "w"), indent=1)
    print(f"{'label':28s} {'n':>3s} {'chunk':>5s} {'fwd ms':>8s} {'f+b ms':>8s} {'bwd ms':>8s} "
          f"{'peak GB':>8s} {'err':>8s}")
    f = lambda v, p=3: f"{v:.{p}f}" if isinstance(v, float) else "-"
    for r in rows:
        bwd = r["fb_ms"] - r["fwd_ms"] if "fb_ms" in r else None
        print(f"{r['label'][:28]:28s} {r['n']:3d} {str(r['chunk']):>5s} {f(r.get('fwd_ms')):>8s} "
              f"{f(r.get('fb_ms')):>8s} {f(bwd):>8s} {f(r.get('peak_gb')):>8s} "
              f"{r.get('err', 0):8.1e} {r.get('error', '')[:60]}")


if __name__ == "__main__":
    main()
