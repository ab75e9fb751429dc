"""Device script for chapter 09's selective scan: one run on a GPU machine, from the repo root.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.selective_scan [--limit S] [--build]
        [--tests S]
    python3 -m bench.gpu.selective_scan --cpu-smoke    # the control flow, tiny, on a CPU
    python3 -m bench.gpu.selective_scan --defaults     # the default kernels only

In one process, under the wall budget ``--limit``: (``--build``) mamba_ssm's CUDA selective scan
built from ``.mamba_ref`` in the background; (``--tests S``) ``pytest -m gpu`` on the Mamba-1
test files, S seconds at most; the accuracy of every row's kernels (out, the eight gradients and
the initial state's) against the fp32 sequential oracle at b2 d512 l2048; then every row of
`ROWS` timed (forward, forward + backward, peak memory) at b8 d2048 n16 l2048, l8192 and n64
(bf16 u/delta/z/B/C, fp32 A/D/delta_bias, z, D, softplus), the rows with ``initial_state`` too;
mamba_ssm's kernel last, in the same process, once its build is there. JSON in $OUT; a table
(time, ratio to mamba_ssm, % of the exp floor, peak GB) printed last. The old stages (the tile
sweep of 2026-11-29, ``--stage all``) are in the history; their results in docs/BENCHMARKS.md.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
OUT = os.environ.get("OUT", "/tmp/out")
REF = os.path.join(ROOT, ".mamba_ref")
SRC = os.path.join(REF, "mamba_ssm-2.3.2.post1", "csrc", "selective_scan")
TESTS = ["tests/test_selective_scan.py", "tests/test_selective_scan_bwd_variants.py",
         "tests/test_triton_scan.py", "tests/test_check_ch08.py", "tests/test_check_ch09.py"]
T0 = time.time()

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


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def start_build():
    """mamba_ssm's extension in a background process (unless a built .so was carried)."""
    if glob.glob(os.path.join(REF, "build", "selective_scan_cuda*.so")):
        return None
    log("mamba_ssm: building selective_scan_cuda in the background")
    env = dict(os.environ, MAX_JOBS="12", TORCH_CUDA_ARCH_LIST="9.0")
    return subprocess.Popen([sys.executable, "-c", BUILD, SRC], env=env, start_new_session=True,
                            stdout=open(os.path.join(OUT, "build.log"), "w"),
                            stderr=subprocess.STDOUT)


def wait_peer(deadline):
    """mamba_ssm's selective_scan_fn once its .so is there (None at the deadline)."""
    from course.bench.selective_scan import load_mamba_ssm
    while time.time() < deadline:
        if glob.glob(os.path.join(REF, "build", "selective_scan_cuda*.so")):
            return load_mamba_ssm()
        so = glob.glob("/tmp/ssbuild/selective_scan_cuda*.so")
        if so and not glob.glob("/tmp/ssbuild/lock"):  # (cpp_extension holds it while linking)
            os.makedirs(os.path.join(REF, "build"), exist_ok=True)
            shutil.copy(so[0], os.path.join(REF, "build", "selective_scan_cuda.so"))
            continue
        time.sleep(1.0)
    return None


def run_tests(limit):
    """``pytest -m gpu`` on the Mamba-1 files (4 workers if pytest-xdist is there), killed with
    its workers at ``limit`` seconds; the log goes to $OUT/pytest.log."""
    import signal
    t_end = time.time() + max(10.0, limit)
    base = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    for cmd in (base + ["-n", "4"] + TESTS, base + TESTS):
        p = subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            text, _ = p.communicate(timeout=max(1.0, t_end - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            text = (p.communicate()[0] or "") + "\n(killed at the time limit)"
        if not (p.returncode == 4 and "-n" in text):  # (rc 4 with -n: no pytest-xdist there)
            break
    open(os.path.join(OUT, "pytest.log"), "w").write(text)
    log("pytest -m gpu: " + (text.strip().splitlines() or ["?"])[-1])


def rows(cfgs, gpu, defaults_only=False):
    """(label, shape, config) to time: the defaults and the other forward kernel."""
    s16 = dict(b=8, d=2048, n=16, l=2048) if gpu else dict(b=1, d=8, n=4, l=32)
    s8k = dict(s16, l=8192) if gpu else dict(s16, l=64)
    s64 = dict(s16, n=64) if gpu else dict(s16, n=20)
    out = [("default", s, None) for s in (s16, s8k, s64)]
    if not defaults_only:  # the other forward kernel at each shape (the backward: default)
        rec16 = cfgs.Config(64, cfgs.FORWARD_RECURRENT, cfgs.BACKWARD)
        scan64 = cfgs.Config(128, cfgs.FORWARD_LARGE_N, cfgs.BACKWARD_LARGE_N)
        pre = cfgs.FORWARD_VARIANTS["recurrent 32x8w1 prefetch"]
        out += [("recurrent fwd 32x8w1", s16, rec16),
                ("recurrent fwd 32x8w1 prefetch", s16, rec16.replace(forward=pre)),
                ("scan fwd 64x32w8 (default to 11-30)", s64, scan64),
                ("recurrent fwd 32x8w1 prefetch", s64, scan64.replace(forward=pre)),
                ("recurrent fwd 16x8w1", s64, scan64.replace(
                    forward=cfgs.FORWARD_VARIANTS_LARGE_N["recurrent 16x8w1"]))]
    if not gpu:  # the interpreter's tiles, every other setting as on the GPU
        out = [(lab, s, c if c is None else c.replace(forward=dict(block_d=4, num_warps=1),
                                                      backward=cfgs.CPU_BACKWARD))
               for lab, s, c in out]
    return out


def accuracy(fns, s, dev, dtype, report):
    """‖· − ref‖/‖ref‖ of out, every gradient and d initial_state vs the fp32 oracle."""
    import torch

    from course.bench.selective_scan import inputs
    from mambalearn.scan.sequential import selective_scan_sequential
    from mambalearn.testing import rel_error
    x = inputs(**s, device=dev, dtype=dtype)
    h0 = 0.1 * torch.randn(s["b"], s["d"], s["n"], device=dev)
    dout = torch.randn_like(x["u"])

    def grads(fn, with_h0):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in x.items()}
        kw = dict(initial_state=h0.clone().requires_grad_()) if with_h0 else {}
        o = fn(**leaves, **kw, delta_softplus=True)
        o.backward(dout.to(o.dtype))
        got = {"out": o.detach().float(), **{k: v.grad.float() for k, v in leaves.items()}}
        if with_h0:
            got["initial_state"] = kw["initial_state"].grad
        return got

    def oracle(**k):
        return selective_scan_sequential(**{a: v.float() if v.dtype != torch.float32 else v
                                            for a, v in k.items() if a != "delta_softplus"},
                                         delta_softplus=True)

    refs = {h: grads(oracle, h) for h in (False, True)}
    for name, (fn, with_h0) in fns.items():
        try:
            got = grads(fn, with_h0)
            report[name] = {k: rel_error(v, refs[with_h0][k]) for k, v in got.items()}
            log(f"accuracy {name} n{s['n']}: " + " ".join(f"{k} {v:.1e}"
                                                         for k, v in report[name].items()))
        except Exception as e:  # noqa: BLE001 - one broken variant must not end the run
            report[name] = {"error": f"{type(e).__name__}: {e}"[:200]}
            log(f"accuracy {name}: {report[name]['error']}")


def time_row(label, fn, x, s, gpu, h0=False):
    """fwd and fwd+bwd medians and peaks of ``fn`` on inputs ``x`` (with an initial state)."""
    import torch

    from course.bench import peak_gb, time_ms
    from course.bench.selective_scan import fwd_bwd
    kw = dict(initial_state=torch.zeros(s["b"], s["d"], s["n"], device=x["u"].device)) if h0 \
        else {}
    row = dict(label=label + (" + initial_state" if h0 else ""), n=s["n"], l=s["l"],
               shape=f"b{s['b']} d{s['d']} n{s['n']} l{s['l']}")
    try:
        with torch.no_grad():
            f = lambda: fn(**x, **kw, delta_softplus=True)
            row["fwd_ms"], row["fwd_peak_gb"] = time_ms(f), peak_gb(f)
        xs = dict(x, **{k: v.requires_grad_() for k, v in kw.items()})
        both = fwd_bwd(fn, xs)
        row["fb_ms"], row["fb_peak_gb"] = time_ms(both), peak_gb(both)
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {e}"[:200]
    log(row)
    if gpu:
        torch.cuda.empty_cache()
    return row


def table(report, floors):
    """The rows with ratios to mamba_ssm in this run and % of the exp floor."""
    peer = {(r["n"], r["l"]): r for r in report["rows"] if r["label"] == "mamba_ssm cuda"}
    f = lambda v: f"{v:.3f}" if isinstance(v, float) else "-"
    lines = [f"{'kernels':36s} {'shape':22s} {'fwd ms':>7s} {'ratio':>5s} {'floor%':>6s} "
             f"{'f+b ms':>7s} {'ratio':>5s} {'floor%':>6s} {'peak GB f+b':>11s}"]
    for r in report["rows"]:
        p, fl = peer.get((r["n"], r["l"]), {}), floors[(r["n"], r["l"])]
        ratio = {k: f"{r[k] / p[k]:.2f}" if k in r and k in p else "-" for k in ("fwd_ms", "fb_ms")}
        pct = {k: f"{100 * m * fl / r[k]:.0f}" if k in r else "-"
               for k, m in (("fwd_ms", 1), ("fb_ms", 2))}
        lines.append(f"{r['label'][:36]:36s} {r['shape']:22s} {f(r.get('fwd_ms')):>7s} "
                     f"{ratio['fwd_ms']:>5s} {pct['fwd_ms']:>6s} {f(r.get('fb_ms')):>7s} "
                     f"{ratio['fb_ms']:>5s} {pct['fb_ms']:>6s} "
                     f"{f(r.get('fb_peak_gb')):>11s} {r.get('error', '')[:40]}")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=250, help="wall budget, seconds")
    ap.add_argument("--build", action="store_true", help="build mamba_ssm in the background")
    ap.add_argument("--tests", type=float, default=0, help="run pytest -m gpu for S seconds")
    ap.add_argument("--defaults", action="store_true", help="time the default kernels only")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, on a CPU")
    a = ap.parse_args()
    left = lambda: a.limit - (time.time() - T0)
    os.makedirs(OUT, exist_ok=True)
    build = start_build() if a.build and not a.cpu_smoke else None
    if a.tests:  # 1. correctness of every kernel at real sizes (compiles them, too)
        run_tests(min(a.tests, left() - 60))
    import torch

    from course.bench.selective_scan import EXP_RATE, inputs
    from mambalearn.mamba1 import config as cfgs
    from mambalearn.mamba1 import selective_scan_fn
    gpu = torch.cuda.is_available() and not a.cpu_smoke
    dev, dtype = (torch.device("cuda"), torch.bfloat16) if gpu else (torch.device("cpu"),
                                                                     torch.float32)
    report = dict(device=torch.cuda.get_device_name() if gpu else "cpu (interpreter)",
                  accuracy={}, rows=[], command=" ".join(sys.argv))
    save = lambda: json.dump(report, open(os.path.join(OUT, "selective_scan.json"), "w"),
                             indent=1, default=str)
    todo = rows(cfgs, gpu, a.defaults)
    call = lambda c: (lambda **k: selective_scan_fn(**k, config=c))
    # 2. accuracy of every row's kernels (n16 and n64 shapes, smaller b and d), with h0 too
    for n in sorted({s["n"] for _, s, _ in todo}):
        acc_s = dict(b=2, d=512, n=n, l=2048) if gpu else dict(b=1, d=4, n=n, l=24)
        fns = {f"{lab} n{n} h0={h}": (call(c), h) for lab, s, c in todo if s["n"] == n
               and s["l"] == min(t["l"] for _, t, _ in todo) for h in (False, True)}
        accuracy(fns, acc_s, dev, dtype, report["accuracy"])
        save()
    # 3. time every row; the defaults also with an initial state
    for lab, s, c in todo:
        if left() < 40:
            log(f"skip {lab} {s}: budget")
            continue
        x = inputs(**s, device=dev, dtype=dtype)
        report["rows"].append(time_row(lab, call(c), x, s, gpu))
        if c is None:
            report["rows"].append(time_row(lab, call(c), x, s, gpu, h0=True))
        save()
        del x
    # 4. mamba_ssm's CUDA kernel in this process, once built
    peer = wait_peer(T0 + a.limit - 25) if gpu else None
    if build is not None and build.poll() is None:
        log("mamba_ssm build unfinished: no peer in this run")
    for s in ({(t["n"], t["l"]): t for _, t, _ in todo}.values() if peer else ()):
        x = inputs(**s, device=dev, dtype=dtype)
        report["rows"].append(time_row("mamba_ssm cuda", peer, x, s, gpu))
        save()
    if peer is not None and left() > 5:
        accuracy({"mamba_ssm cuda n16 h0=False": (peer, False)}, dict(b=2, d=512, n=16, l=2048),
                 dev, dtype, report["accuracy"])
    floors = {(s["n"], s["l"]): s["b"] * s["d"] * s["n"] * s["l"] / EXP_RATE * 1e3
              for _, s, _ in todo}
    report["table"] = table(report, floors)
    save()
    print(f"device: {report['device']}; used {time.time() - T0:.0f} s of {a.limit:.0f}; "
          f"floor = one exp2 per (b, d, l, n) element (fwd), two (fwd+bwd)")
    for k, v in report["accuracy"].items():
        print("rel. error vs fp32 oracle", k, {x: (f"{y:.1e}" if isinstance(y, float) else y)
                                               for x, y in v.items()})
    print("\n".join(report["table"]))


if __name__ == "__main__":
    main()
