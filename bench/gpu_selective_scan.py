"""Device script for chapter 09's selective scan (run on the H200 through the `run` tool).

    PYTHONUNBUFFERED=1 python3 bench/gpu_selective_scan.py [--stage all|check] [--limit S]

1. builds mamba_ssm's CUDA selective scan from .mamba_ref (sm_90 only) in a background process,
   unless .mamba_ref/build/selective_scan_cuda*.so is there (carried from an earlier call);
2. compiles the candidate tiles of our kernels in parallel processes (Triton's disk cache), then
   times each candidate (forward alone, backward alone) and keeps the fastest;
3. checks tuned, teaching and mamba_ssm against the fp32 sequential oracle at b8 d2048 n16 l2048
   (relative error ‖out − ref‖/‖ref‖ of out and of every gradient);
4. runs the bench topic (every backend, DESIGN §6 shapes) and the gpu-marked tests if time is left.
Everything lands in $OUT (json, log, plot, the built .so); a short table is printed last.
"""

import argparse
import glob
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
OUT = os.environ.get("OUT", "/tmp/out")
REF = os.path.join(ROOT, ".mamba_ref")
SRC = os.path.join(REF, "mamba_ssm-2.3.2.post1", "csrc", "selective_scan")
T0 = time.time()
MAIN = dict(b=8, d=2048, n=16, l=2048)
C = lambda bd, bl, w, **k: dict(BLOCK_D=bd, BLOCK_L=bl, num_warps=w, **k)
R = dict(UNROLL=False)  # the run-time loop over states (carries in memory)
U = dict(UNROLL=True)  # the unrolled loop over states (carries in registers)
FWD16 = [C(32, 8, 1), C(64, 8, 2), C(128, 8, 4), C(64, 16, 4), C(64, 32, 4), C(64, 8, 2, **R),
         C(128, 8, 4, **R)]
BWD16 = [C(32, 8, 1), C(64, 8, 2), C(32, 16, 2), C(64, 16, 4), C(32, 8, 1, **U)]
FWD64 = [C(64, 8, 2, **R), C(128, 8, 4, **R)]
BWD64 = [C(32, 8, 1), C(64, 8, 2)]

BUILD = r"""
import os, sys, glob, torch
from torch.utils.cpp_extension import load
src = sys.argv[1]
flags = ["-O3", "-std=c++17", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
         "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
         "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
         "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math", "-lineinfo",
         "--threads", "2", "-gencode", "arch=compute_90,code=sm_90"]
files = [os.path.join(src, "selective_scan.cpp")] + sorted(glob.glob(os.path.join(src, "*.cu")))
os.makedirs("/tmp/ssbuild", exist_ok=True)
load(name="selective_scan_cuda", sources=files, extra_cflags=["-O3", "-std=c++17"],
     extra_cuda_cflags=flags, build_directory="/tmp/ssbuild", verbose=False)
print("built")
"""


left = None


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def start_build():
    if glob.glob(os.path.join(REF, "build", "selective_scan_cuda*.so")):
        log("mamba_ssm: using carried .mamba_ref/build/selective_scan_cuda.so")
        return None
    env = dict(os.environ, MAX_JOBS="16", TORCH_CUDA_ARCH_LIST="9.0")
    log("mamba_ssm: building selective_scan_cuda in the background")
    return subprocess.Popen([sys.executable, "-c", BUILD, SRC], env=env, stdout=open(
        os.path.join(OUT, "build.log"), "w"), stderr=subprocess.STDOUT)


def finish_build(proc, timeout):
    if proc is None:
        return
    try:
        rc = proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        proc.kill()
        log("mamba_ssm build did not finish in time: no peer in this run")
        return
    so = glob.glob("/tmp/ssbuild/selective_scan_cuda*.so")
    log(f"mamba_ssm build rc={rc}, {so}")
    if rc == 0 and so:
        os.makedirs(os.path.join(REF, "build"), exist_ok=True)
        shutil.copy(so[0], os.path.join(REF, "build", "selective_scan_cuda.so"))
        if os.path.getsize(so[0]) < 16 * 2**20:
            shutil.copy(so[0], os.path.join(OUT, "selective_scan_cuda.so"))


# ---------------------------------------------------------------------------------------------
def _inputs(s, dtype_name="bfloat16"):
    import torch

    from mambalearn.bench.selective_scan import inputs
    return inputs(**s, device=torch.device("cuda"), dtype=getattr(torch, dtype_name))


def _warm(job):
    """Worker: run one (kind, config, shape) once so Triton compiles it into the disk cache."""
    kind, cfg, s = job
    t = time.time()
    try:
        import torch

        from mambalearn.triton import selective_scan as T
        x = _inputs(s)
        shape = (s["b"], s["d"], s["l"], s["n"], 1)
        args = [x[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
        if kind == "teach":
            from mambalearn.bench.selective_scan import fwd_bwd
            from mambalearn.triton.selective_scan_teaching import selective_scan_teaching
            fwd_bwd(selective_scan_teaching, x)()
        elif kind == "fwd":
            T.FWD_CONFIG = cfg
            T._forward(*args, True, None, shape)
        else:
            T.FWD_CONFIG = FWD64[0] if s["n"] > 16 else T.DEFAULT_FWD
            _, states, _ = T._forward(*args, True, None, shape)
            T.BWD_CONFIG = cfg
            T._backward(torch.randn_like(x["u"]), *args, True, None, states, shape)
        torch.cuda.synchronize()
        return kind, cfg, s["n"], time.time() - t, None
    except Exception as e:  # noqa: BLE001
        return kind, cfg, s["n"], time.time() - t, f"{type(e).__name__}: {e}"[:300]


def precompile(jobs, deadline, procs=8):
    """Compile in parallel processes until ``deadline`` (time.time()); the rest compile on use."""
    ctx = mp.get_context("spawn")
    pool = ctx.Pool(procs)
    pending = [pool.apply_async(_warm, (j,)) for j in jobs]
    while pending and time.time() < deadline:
        for r in [r for r in pending if r.ready()]:
            kind, cfg, n, dt, err = r.get()
            log(f"compiled {kind} n{n} {cfg} in {dt:.1f}s {err or ''}")
            pending.remove(r)
        time.sleep(0.5)
    if pending:
        log(f"{len(pending)} compile jobs unfinished at the deadline")
    pool.terminate()


def sweep(T, fwd_cfgs, bwd_cfgs, s, results):
    """Time each candidate: forward alone, backward alone (from one set of stored states)."""
    import torch

    from mambalearn.bench import time_ms
    x = _inputs(s)
    shape = (s["b"], s["d"], s["l"], s["n"], 1)
    args = [x[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
    best_f = best_b = None
    for cfg in fwd_cfgs:
        T.FWD_CONFIG = cfg
        try:
            ms = time_ms(lambda: T._forward(*args, True, None, shape))
        except Exception as e:  # noqa: BLE001
            log(f"fwd {cfg} failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        results.append(dict(kind="fwd", n=s["n"], l=s["l"], cfg=cfg, ms=ms))
        log(f"fwd n{s['n']} l{s['l']} {cfg}: {ms:.3f} ms")
        if best_f is None or ms < best_f[1]:
            best_f = (cfg, ms)
    best_f = best_f or (fwd_cfgs[0], None)
    T.FWD_CONFIG = best_f[0]
    _, states, _ = T._forward(*args, True, None, shape)
    dout = torch.randn_like(x["u"])
    for cfg in bwd_cfgs:
        T.BWD_CONFIG = cfg
        try:
            ms = time_ms(lambda: T._backward(dout, *args, True, None, states, shape))
        except Exception as e:  # noqa: BLE001
            log(f"bwd {cfg} failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        results.append(dict(kind="bwd", n=s["n"], l=s["l"], cfg=cfg, ms=ms))
        log(f"bwd n{s['n']} l{s['l']} {cfg}: {ms:.3f} ms")
        if best_b is None or ms < best_b[1]:
            best_b = (cfg, ms)
    best_b = best_b or (bwd_cfgs[0], None)
    T.BWD_CONFIG = best_b[0]
    return best_f, best_b


def accuracy(fns, s, out):
    """‖· − ref‖/‖ref‖ of out and every gradient vs the fp32 sequential oracle (bf16 inputs)."""
    import torch

    from mambalearn.scan.sequential import selective_scan_sequential
    x = _inputs(s)
    dout = torch.randn_like(x["u"])
    names = list(x)

    def grads(fn):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in x.items()}
        o = fn(**leaves, delta_softplus=True)
        o.backward(dout.to(o.dtype))
        return [o.detach().float()] + [leaves[k].grad.float() for k in names]

    ref = grads(lambda **k: selective_scan_sequential(
        **{a: (v.float() if v.dtype != torch.float32 else v) for a, v in k.items()},
        delta_softplus=True))
    for name, fn in fns.items():
        try:
            got = grads(fn)
        except Exception as e:  # noqa: BLE001
            log(f"accuracy {name} failed: {type(e).__name__}: {e}")
            continue
        keys = ["out"] + names
        errs = {k: ((g - r).norm() / r.norm()).item()
                for k, g, r in zip(keys, got, ref, strict=True)}
        out[name] = errs
        log(f"rel. error vs fp32 oracle, {name}: "
            + " ".join(f"{k} {v:.2e}" for k, v in errs.items()))
        del got
        torch.cuda.empty_cache()


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, topic in zip(axes, ["selective_scan fwd", "selective_scan fwd+bwd"], strict=False):
        rs = [r for r in rows if r["topic"] == topic]
        labels = [f"{r['backend']}\n{r['shape'].split(' bf16')[0]}" for r in rs]
        ax.barh(range(len(rs)), [r["ms"] for r in rs])
        ax.set_yticks(range(len(rs)), labels, fontsize=6)
        ax.set_xscale("log")
        ax.set_xlabel("ms (log)")
        ax.set_title(f"{topic} (H200)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def check(report, a):
    """Tuned and teaching kernels vs the fp32 oracle at b8 d2048 n16 l2048, then gpu tests."""
    from mambalearn.triton import selective_scan as T
    from mambalearn.triton.selective_scan_teaching import selective_scan_teaching
    accuracy({"triton tuned": T.selective_scan_fn, "triton teaching": selective_scan_teaching},
             MAIN, report["accuracy"])
    json.dump(report, open(os.path.join(OUT, "selective_scan_check.json"), "w"), indent=1)
    if not a.no_tests and left() > 60:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p",
                            "no:cacheprovider", "tests/test_selective_scan.py"], cwd=ROOT,
                           capture_output=True, text=True, timeout=max(10, left() - 10))
        open(os.path.join(OUT, "pytest.log"), "w").write(r.stdout + r.stderr)
        log("pytest: " + (r.stdout.strip().splitlines() or ["?"])[-1])
    for k, v in report["accuracy"].items():
        print(k, {x: f"{y:.1e}" for x, y in v.items()})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", default="all")
    ap.add_argument("--limit", type=float, default=300)
    ap.add_argument("--fwd", default=None, help="python list of fwd configs to sweep")
    ap.add_argument("--bwd", default=None, help="python list of bwd configs to sweep")
    ap.add_argument("--no-tests", action="store_true")
    a = ap.parse_args()
    global left
    left = lambda: a.limit - (time.time() - T0)  # seconds left before the run's limit
    os.makedirs(OUT, exist_ok=True)
    report = dict(device=None, sweep=[], best={}, accuracy={}, rows=[])
    if a.stage == "check":  # correctness only, default tiles, no mamba_ssm build (~2 min)
        return check(report, a)
    build = start_build()

    import torch
    report["device"] = torch.cuda.get_device_name()
    from mambalearn.triton import selective_scan as T
    fwd_cfgs = eval(a.fwd) if a.fwd else FWD16
    bwd_cfgs = eval(a.bwd) if a.bwd else BWD16
    n64 = dict(MAIN, n=64)
    jobs = [("teach", None, MAIN)]
    jobs += [("fwd", c, MAIN) for c in fwd_cfgs] + [("bwd", c, MAIN) for c in bwd_cfgs]
    jobs += [("fwd", c, n64) for c in FWD64] + [("bwd", c, n64) for c in BWD64]
    precompile(jobs, deadline=time.time() + left() - 150)
    log("precompiled")

    best = {}
    for s, fc, bc in ((MAIN, fwd_cfgs, bwd_cfgs), (n64, FWD64, BWD64)):
        if s is n64 and left() < 150:
            best[64] = ((FWD64[0], None), (BWD64[0], None))
            continue
        best[s["n"]] = sweep(T, fc, bc, s, report["sweep"])
        log(f"n{s['n']}: best fwd {best[s['n']][0]}, best bwd {best[s['n']][1]}")
    report["best"] = {f"n{k}": dict(fwd=v[0], bwd=v[1]) for k, v in best.items()}
    T.FWD_CONFIG = lambda n: best[16 if n <= 16 else 64][0][0]
    T.BWD_CONFIG = lambda n: best[16 if n <= 16 else 64][1][0]
    json.dump(report, open(os.path.join(OUT, "selective_scan.json"), "w"), indent=1)

    finish_build(build, left() - 110)
    from mambalearn.bench import selective_scan as S
    from mambalearn.triton.selective_scan_teaching import selective_scan_teaching
    fns = {"triton tuned": T.selective_scan_fn, "triton teaching": selective_scan_teaching}
    peer = S.load_mamba_ssm()
    if peer is not None:
        fns["mamba_ssm cuda"] = peer
    if left() > 90:
        accuracy(fns, MAIN, report["accuracy"])
    json.dump(report, open(os.path.join(OUT, "selective_scan.json"), "w"), indent=1)

    rows = []
    for i, shape in enumerate(S.SHAPES_GPU):
        if left() < (60 if i == 0 else 35):
            log(f"no time left for {shape}")
            continue
        rows += S.run(True, shapes=[shape], first=(i == 0))
        report["rows"] = rows
        json.dump(report, open(os.path.join(OUT, "selective_scan.json"), "w"), indent=1)
        from mambalearn.bench import table
        print(table(rows), flush=True)
    report["rows"] = rows
    json.dump(report, open(os.path.join(OUT, "selective_scan.json"), "w"), indent=1)
    try:
        plot(rows, os.path.join(OUT, "selective_scan.png"))
    except Exception as e:  # noqa: BLE001
        log(f"plot failed: {e}")

    if not a.no_tests and left() > 60:
        log("gpu tests")
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-m", "gpu", "-p",
                            "no:cacheprovider", "tests/test_selective_scan.py"], cwd=ROOT,
                           capture_output=True, text=True, timeout=max(10, left() - 15))
        open(os.path.join(OUT, "pytest.log"), "w").write(r.stdout + r.stderr)
        log("pytest: " + (r.stdout.strip().splitlines() or ["?"])[-1])

    from mambalearn.bench import table
    print(table(rows))
    print("best", report["best"])
    for k, v in report["accuracy"].items():
        print(k, {a: f"{b:.1e}" for a, b in v.items()})


if __name__ == "__main__":
    main()
