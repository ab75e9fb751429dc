"""Bench topic ``selective_scan``: the Mamba-1 selective scan, every backend, vs mamba_ssm's CUDA.

    python -m mambalearn bench selective_scan          # or: make bench

Shapes: b8 d2048 n16 l2048 bf16 with z, D, delta_bias and softplus; the same at
l8192 and at n64. Backends: the sequential oracle, the PyTorch scans (Blelloch, Hillis–Steele,
chunked), the chunked-recompute autograd wrapper (chapter 07), our Triton teaching and tuned
kernels, and ``mamba_ssm``'s CUDA kernel when its extension ``selective_scan_cuda`` can be
imported (built from ``.mamba_ref`` by ``bench/gpu/selective_scan.py``). The slow PyTorch
backends run at the first shape only.

Each row: time (median of ``triton.testing.do_bench``), ratio to mamba_ssm measured in the same
run, % of the floor, peak memory of the call beyond its inputs. Floor: one exp per (b, d, l, n)
element at the H200's MUFU rate (132 SMs × 16 per clock × its SM clock, ``roofline.H200``) for
the forward, two (one forward, one backward) for forward+backward; bytes (≈0.06 ms here) are the
smaller term.
On a CPU: tiny shapes, timing Triton's interpreter.
"""

import glob
import importlib.util
import os
import sys
import types

import torch

from course.bench import peak_gb, time_ms
from mambalearn import roofline

EXP_RATE = roofline.H200.exps  # exp2 per second on the reference H200 (MUFU: 16 per SM a clock)
REF = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".mamba_ref"))
SHAPES_GPU = [dict(b=8, d=2048, n=16, l=2048), dict(b=8, d=2048, n=16, l=8192),
              dict(b=8, d=2048, n=64, l=2048)]
SHAPES_CPU = [dict(b=1, d=4, n=4, l=24)]


def load_mamba_ssm():
    """``mamba_ssm.selective_scan_fn`` (CUDA) from ``.mamba_ref``, or None with the reason printed.

    The compiled extension is taken from ``sys.modules`` or ``.mamba_ref/build/*.so``; the Python
    interface from the unpacked source tree through stub packages (nothing is installed).
    """
    if not torch.cuda.is_available():
        return None
    if "selective_scan_cuda" not in sys.modules:
        found = sorted(glob.glob(os.path.join(REF, "build", "selective_scan_cuda*.so")))
        if not found:
            print("mamba_ssm: no selective_scan_cuda extension "
                  "(bench/gpu/selective_scan.py builds it)")
            return None
        spec = importlib.util.spec_from_file_location("selective_scan_cuda", found[0])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["selective_scan_cuda"] = mod
    root = os.path.join(REF, "mamba_ssm-2.3.2.post1", "mamba_ssm")
    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.utils"):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = [os.path.join(root, *name.split(".")[1:])]
            sys.modules[name] = m
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    except Exception as e:  # noqa: BLE001 - report and carry on without the peer
        print(f"mamba_ssm: interface not importable: {type(e).__name__}: {e}")
        return None
    return selective_scan_fn


def inputs(b, d, n, l, device, dtype=torch.bfloat16, seed=0):
    """Mamba-like inputs: u, delta, z, B, C in ``dtype``; A = −(1..n) (S4D-real), D, bias fp32."""
    g = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s: torch.randn(*s, device=device, generator=g)
    A = -torch.arange(1, n + 1, device=device, dtype=torch.float32).repeat(d, 1)  # (d, n)
    return dict(u=r(b, d, l).to(dtype), delta=(0.5 * r(b, d, l) - 4.0).to(dtype), A=A,
                B=r(b, n, l).to(dtype), C=r(b, n, l).to(dtype), D=r(d), z=r(b, d, l).to(dtype),
                delta_bias=0.1 * r(d))


def backends(first_shape, n=16):
    """name → fn(**inputs, delta_softplus=True); the PyTorch scans only at the first shape."""
    from mambalearn.mamba1.api import selective_scan_fn
    from mambalearn.mamba1.kernel import selective_scan_teaching

    out = {}
    if first_shape:
        from mambalearn.autograd import selective_scan_recompute
        from mambalearn.scan.chunked import selective_scan_chunked
        from mambalearn.scan.hillis_steele import hillis_steele_scan
        from mambalearn.scan.selective import selective_scan_parallel
        from mambalearn.scan.sequential import selective_scan_sequential
        out["sequential oracle"] = selective_scan_sequential
        out["pytorch blelloch"] = selective_scan_parallel
        out["pytorch hillis-steele"] = lambda **k: selective_scan_parallel(
            **k, scan=hillis_steele_scan)
        out["pytorch chunked"] = selective_scan_chunked
        out["recompute (autograd)"] = selective_scan_recompute
    if n <= 16:  # the teaching kernel unrolls its loop over states: minutes to compile at n64
        out["triton teaching"] = selective_scan_teaching
    out["triton tuned"] = selective_scan_fn
    peer = load_mamba_ssm()
    if peer is not None:
        out["mamba_ssm cuda"] = peer
    return out


FWD_ONLY = {"sequential oracle", "pytorch hillis-steele"}  # fwd+bwd too slow / too big there


def fwd_bwd(fn, x):
    """A closure running forward and backward (gradients dropped after each call)."""
    leaves = {k: v.detach().requires_grad_() for k, v in x.items()}

    def run():
        out = fn(**leaves, delta_softplus=True)
        out.backward(torch.ones_like(out))
        for v in leaves.values():
            v.grad = None

    return run


def measure(name, fn, x, shape, floor_ms, quick):
    """Rows for the forward and, unless FWD_ONLY, forward+backward of one backend."""
    rows = []
    fwd = lambda: fn(**x, delta_softplus=True)
    slow = name in ("sequential oracle",)
    kw = dict(warmup=1, rep=3) if slow or quick else (
        {} if name.startswith(("triton", "mamba")) else dict(warmup=5, rep=30))
    with torch.no_grad():
        rows.append(dict(topic="selective_scan fwd", backend=name, shape=shape,
                         ms=time_ms(fwd, **kw), peak_gb=peak_gb(fwd)))
    if name not in FWD_ONLY:
        both = fwd_bwd(fn, x)
        rows.append(dict(topic="selective_scan fwd+bwd", backend=name, shape=shape,
                         ms=time_ms(both, **kw), peak_gb=peak_gb(both)))
    for r in rows:
        f = floor_ms * (1 if r["topic"].endswith("fwd") else 2)
        r["floor_pct"] = 100.0 * f / r["ms"] if quick is False else None
    return rows


def run(gpu, shapes=None, first=True):
    device = torch.device("cuda" if gpu else "cpu")
    rows = []
    for i, s in enumerate(shapes or (SHAPES_GPU if gpu else SHAPES_CPU)):
        dtype = torch.bfloat16 if gpu else torch.float32
        x = inputs(**s, device=device, dtype=dtype)
        shape = f"b{s['b']} d{s['d']} n{s['n']} l{s['l']} {'bf16' if gpu else 'fp32'}"
        floor_ms = s["b"] * s["d"] * s["n"] * s["l"] / EXP_RATE * 1e3
        got = []
        for name, fn in backends(first_shape=(first and i == 0), n=s["n"]).items():
            try:
                got += measure(name, fn, x, shape, floor_ms, quick=not gpu)
            except Exception as e:  # noqa: BLE001 - one failing backend must not hide the others
                print(f"{name} at {shape}: {type(e).__name__}: {e}")
            if gpu:
                torch.cuda.empty_cache()
        for r in got:  # ratio to mamba_ssm's time for the same topic, this run
            peer = [p for p in got if p["backend"] == "mamba_ssm cuda" and p["topic"] == r["topic"]]
            r["ratio"] = r["ms"] / peer[0]["ms"] if peer else None
        rows += got
    return rows
