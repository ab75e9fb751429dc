"""Device script, chapter 12: when does Mamba beat attention? One model width, many lengths.

    python3 -m bench.gpu.attention OUTDIR [--budget 85]      (on the H200)
    python3 -m bench.gpu.attention OUTDIR                    (no GPU: a tiny smoke run)

Records OUTDIR/<device>_attention_<date>.json (``bench.gpu.record``: copy it into docs/results;
chapters 05 and 12 read it there) and draws OUTDIR/attention_h200.png (docs/figures;
``attention_cpu_smoke.png`` on a CPU); prints ``torch.cuda.get_device_properties(0)``, whose L2
size chapter 05 cites from the results file.
At d_model 2048 and a fixed number of tokens per call (b · l = 32768), bf16:

* attention: ``torch.nn.functional.scaled_dot_product_attention``, flash backend, causal,
  16 heads × 128;
* Mamba-1: ``mambalearn.mamba1.selective_scan_fn``, d_inner 4096, n 16, with z, D,
  delta_bias, softplus;
* SSD (Mamba-2): ``mambalearn.mamba2.mamba_chunk_scan_combined``, 64 heads × 64, n 128,
  chunk 256, D, dt_bias, softplus;

forward and forward + backward for l = 512 … 32768, then one decode step per token at batch 16:
attention over a KV cache of l tokens against ``mambalearn.mamba2.step.selective_state_update``
(Mamba-1 state (b, 4096, 16) and Mamba-2 state (b, 64, 64, 128), fp32), CUDA-graph timed.
Only the sequence mixers are timed (no projections, MLPs or norms). A budget (seconds) stops
new measurements in time; what was measured is always written.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.gpu.record import record  # noqa: E402
from mambalearn import device, inference  # noqa: E402
from mambalearn.mamba2 import reference as ssd
from mambalearn.scan.sequential import selective_scan_sequential  # noqa: E402

METHOD = ("scaled_dot_product_attention (flash, causal) against our Mamba-1 scan and SSD at one "
          "d_model, b·l tokens a call constant; decode at batch decode_b, CUDA-graph timed; only "
          "the sequence mixers are timed; checks = relative norm error against each oracle")
GPU = dict(tokens=32768, lengths=[512, 1024, 2048, 4096, 8192, 16384, 32768], heads=16, hd=128,
           d_inner=4096, n1=16, h2=64, p2=64, n2=128, chunk=256, decode_b=16,
           decode_lengths=[512, 2048, 8192, 32768, 131072])
CPU = dict(tokens=16, lengths=[8, 16], heads=2, hd=4, d_inner=8, n1=2, h2=2, p2=4, n2=4,
           chunk=8, decode_b=2, decode_lengths=[8, 16])  # a control-flow smoke run, not a timing


def timer(gpu):
    """ms of one call: do_bench medians on a GPU (short warm-up and repeat), a wall clock on CPU."""
    if gpu:
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median")

    def cpu(fn):  # one call: on a CPU this times Triton's interpreter, nothing to compare
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return cpu


def graph_timer(gpu):
    """Decode steps: one kernel each, so replay 20 calls from a CUDA graph (no launch cost)."""
    if not gpu:
        return timer(False)
    import triton.testing

    def run(fn):
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
        except Exception:  # noqa: BLE001 - a backend that cannot be captured: time it eagerly
            return timer(True)(fn)
    return run


def attention(b, l, cfg, dev, backward=False):
    """Causal self-attention over (b, heads, l, hd) bf16 (fp32 on a CPU): flash on a GPU."""
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    q, k, v = (torch.randn(b, cfg["heads"], l, cfg["hd"], device=dev, dtype=dt,
                           requires_grad=backward) for _ in range(3))

    def run():
        with _flash(dev):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if backward:
            torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    return run


def _flash(dev):
    from contextlib import nullcontext

    if dev.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def mamba1(b, l, cfg, dev, backward=False):
    from mambalearn.mamba1 import selective_scan_fn

    d, n = cfg["d_inner"], cfg["n1"]
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    r = lambda *s: torch.randn(*s, device=dev)
    x = dict(u=r(b, d, l).to(dt), delta=(0.5 * r(b, d, l) - 4.0).to(dt),
             A=-torch.arange(1, n + 1, device=dev, dtype=torch.float32).repeat(d, 1),
             B=r(b, n, l).to(dt), C=r(b, n, l).to(dt), D=r(d), z=r(b, d, l).to(dt),
             delta_bias=0.1 * r(d))
    leaves = {k: v.requires_grad_(backward) for k, v in x.items()}

    def run():
        out = selective_scan_fn(**leaves, delta_softplus=True)
        if backward:
            torch.autograd.grad(out, list(leaves.values()), torch.ones_like(out))
    return run


def mamba2(b, l, cfg, dev, backward=False):
    from mambalearn.mamba2 import mamba_chunk_scan_combined

    h, p, n = cfg["h2"], cfg["p2"], cfg["n2"]
    dt_ = torch.bfloat16 if dev.type == "cuda" else torch.float32
    r = lambda *s: torch.randn(*s, device=dev)
    x, B, C = r(b, l, h, p).to(dt_), r(b, l, 1, n).to(dt_), r(b, l, 1, n).to(dt_)
    dt, A, D, bias = r(b, l, h) - 2.0, -torch.rand(h, device=dev) * 8 - 1.0, r(h), r(h) * 0.1
    leaves = [t.requires_grad_(backward) for t in (x, dt, A, B, C, D, bias)]

    def run():
        out = mamba_chunk_scan_combined(*leaves[:5], cfg["chunk"], D=leaves[5], dt_bias=leaves[6],
                                        dt_softplus=True)
        if backward:
            torch.autograd.grad(out, leaves, torch.ones_like(out))
    return run


def kv_step(b, l, cfg, dev):
    """One decode step of attention: one query per sequence against a cache of l keys/values."""
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    q = torch.randn(b, cfg["heads"], 1, cfg["hd"], device=dev, dtype=dt)
    k, v = (torch.randn(b, cfg["heads"], l, cfg["hd"], device=dev, dtype=dt) for _ in range(2))

    def run():
        with _flash(dev):
            return F.scaled_dot_product_attention(q, k, v)
    return run


def state_step(b, cfg, dev, layout):
    """One decode step of a Mamba layer: the fp32 state updated in place (Mamba-1 or -2 layout)."""
    from mambalearn.mamba2.step import selective_state_update

    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    r = lambda *s: torch.randn(*s, device=dev)
    if layout == "mamba1":
        d, n = cfg["d_inner"], cfg["n1"]
        state, x, delta = r(b, d, n), r(b, d).to(dt), r(b, d).to(dt)
        A, B, C, D = -torch.rand(d, n, device=dev) - 0.5, r(b, n).to(dt), r(b, n).to(dt), r(d)
    else:
        h, p, n = cfg["h2"], cfg["p2"], cfg["n2"]
        state, x, delta = r(b, h, p, n), r(b, h, p).to(dt), r(b, h)[..., None].expand(b, h, p)
        A = (-torch.rand(h, device=dev) - 0.5)[:, None, None].expand(h, p, n)
        B, C, D = r(b, 1, n).to(dt), r(b, 1, n).to(dt), r(h)[:, None].expand(h, p)
    return lambda: selective_state_update(state, x, delta, A, B, C, D, dt_softplus=True)


def checks(cfg, dev):
    """Each backend against a slow oracle at the run's widths and a short length (relative norm
    error; bf16 inputs on a GPU). On a GPU this also compiles the kernels the timings use."""
    err = lambda a, w: ((a.double().cpu() - w.double().cpu()).norm() / w.double().norm()).item()
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # CPU float32; the oracles run on the CPU
    l, out = 2 * cfg["chunk"], {}
    q, k, v = (r(1, cfg["heads"], l, cfg["hd"]) for _ in range(3))
    with _flash(dev):
        got = F.scaled_dot_product_attention(*(t.to(dev, dt) for t in (q, k, v)), is_causal=True)
    mask = torch.ones(l, l, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2) / cfg["hd"] ** 0.5).masked_fill(~mask, -torch.inf)
    out["attention"] = err(got, torch.softmax(scores, -1) @ v)
    from mambalearn.mamba1 import selective_scan_fn

    d, n = cfg["d_inner"], cfg["n1"]
    u, delta, A = r(1, d, l), r(1, d, l).abs() * 0.1, -torch.rand(d, n, generator=g) - 0.5
    B, C = r(1, n, l), r(1, n, l)
    lo = lambda *ts: [t.to(dt).float() for t in ts]  # what the kernel sees, for the oracle
    got = selective_scan_fn(*(t.to(dev, dt) for t in (u, delta)), A.to(dev),
                            *(t.to(dev, dt) for t in (B, C)))
    out["mamba1"] = err(got, selective_scan_sequential(*lo(u, delta), A, *lo(B, C)))
    from mambalearn.mamba2 import mamba_chunk_scan_combined

    h, p, n2 = cfg["h2"], cfg["p2"], cfg["n2"]
    x, dt_, A2 = r(1, l, h, p), r(1, l, h) - 2, -torch.rand(h, generator=g) - 0.5
    B2, C2 = r(1, l, 1, n2), r(1, l, 1, n2)
    got = mamba_chunk_scan_combined(x.to(dev, dt), dt_.to(dev), A2.to(dev), B2.to(dev, dt),
                                    C2.to(dev, dt), cfg["chunk"], dt_softplus=True)
    want = ssd.mamba_chunk_scan_ref(*(t.double() for t in (*lo(x), dt_, A2, *lo(B2, C2))),
                                    cfg["chunk"], dt_softplus=True)
    out["mamba2"] = err(got, want)
    from mambalearn.mamba2.step import selective_state_update

    st, xs, ds, B1, C1 = r(2, d, n), r(2, d), r(2, d).abs() * 0.3, r(2, n), r(2, n)
    want_st = st.double()
    want = inference.decode_step(want_st, *(t.double() for t in (xs, ds, A, B1, C1)))
    st = st.to(dev)
    got = selective_state_update(st, *(t.to(dev) for t in (xs, ds, A, B1, C1)))
    out["state_update"] = max(err(got, want), err(st, want_st))
    out["ok"] = all(e < (5e-2 if dt == torch.bfloat16 else 1e-4) for e in out.values())
    return out


def crossover(rows, op, fast=("mamba1", "mamba2")):
    """The first l at which attention takes longer than the faster Mamba kernel (None if never)."""
    by = {}
    for r in rows:
        if r["op"] == op:
            by.setdefault(r["l"], {})[r["backend"]] = r["ms"]
    constant = by.pop(0, {})  # decode: the state update does not depend on l (stored at l = 0)
    for l in sorted(by):
        mamba = [by[l].get(k, constant.get(k)) for k in fast if k in by[l] or k in constant]
        if "attention" in by[l] and mamba and by[l]["attention"] > min(mamba):
            return l
    return None


def measure(cfg, dev, budget, t0, only=("decode", "fwd", "fwd+bwd")):
    """Rows dict(op, backend, b, l, ms, us_per_token), decode first, then fwd, then fwd+bwd."""
    gpu = dev.type == "cuda"
    rows, skipped, bench, graph = [], [], timer(gpu), graph_timer(gpu)
    db = cfg["decode_b"]
    jobs = [("decode", name, db, 0, lambda name=name: state_step(db, cfg, dev, name), graph)
            for name in ("mamba1", "mamba2")]
    jobs += [("decode", "attention", db, l, lambda l=l: kv_step(db, l, cfg, dev), graph)
             for l in cfg["decode_lengths"]]
    for op, bwd in (("fwd", False), ("fwd+bwd", True)):
        for l in cfg["lengths"]:
            b = max(1, cfg["tokens"] // l)
            for name, make in (("attention", attention), ("mamba1", mamba1), ("mamba2", mamba2)):
                jobs.append((op, name, b, l, lambda m=make, b=b, l=l, w=bwd: m(b, l, cfg, dev, w),
                             bench))
    for op, name, b, l, make, time_it in jobs:
        if op not in only:
            continue
        if time.time() - t0 > budget:
            skipped.append(f"{op} {name} l{l}")
            continue
        try:
            ms = time_it(make())
        except Exception as e:  # noqa: BLE001 - record and go on: the other rows still count
            skipped.append(f"{op} {name} l{l}: {type(e).__name__}: {str(e)[:200]}")
            continue
        tokens = b if op == "decode" else b * l
        rows.append(dict(op=op, backend=name, b=b, l=l, ms=ms, us_per_token=1e3 * ms / tokens))
        print(f"{op:8s} {name:9s} b{b:<5d} l{l:<7d} {ms:9.4f} ms  {rows[-1]['us_per_token']:9.4f} "
              f"µs/token  (t = {time.time() - t0:.0f} s)", flush=True)
        if gpu:
            torch.cuda.empty_cache()
    return rows, skipped


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    names = {"attention": "attention (SDPA flash)", "mamba1": "Mamba-1 scan",
             "mamba2": "SSD (Mamba-2)"}
    for ax, op in zip(axes, ("fwd", "fwd+bwd", "decode"), strict=True):
        for backend, label in names.items():
            pts = sorted((r["l"], r["us_per_token"]) for r in res["rows"]
                         if r["op"] == op and r["backend"] == backend)
            if op == "decode" and backend != "attention" and pts:  # constant in l: a line
                ax.axhline(pts[0][1], ls="--", color=f"C{list(names).index(backend)}",
                           label=f"{label} state update")
            elif pts:
                ls, ts = zip(*pts, strict=True)
                ax.loglog(ls, ts, "o-", label=label, color=f"C{list(names).index(backend)}")
        x = res["crossover"].get(op)
        if x:
            ax.axvline(x, color="gray", ls=":", label=f"attention slower from l = {x}")
        ax.set_xscale("log"), ax.set_yscale("log")
        ax.set_xlabel("context length l" if op == "decode" else "sequence length l")
        ax.set_ylabel("µs per token" + (f" (batch {res['config']['decode_b']})"
                                        if op == "decode" else ""))
        ax.set_title({"fwd": "forward", "fwd+bwd": "forward + backward",
                      "decode": "decode: one step"}[op], fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(f"{res['device']['name']}, d_model {res['config']['d_model']}, "
                 f"{res['config']['tokens']} tokens a call"
                 + ("" if res["cpu_smoke"] else ", bf16"), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def device_properties():
    if not torch.cuda.is_available():
        return {"name": "cpu (smoke run: interpreter, tiny sizes)"}
    p = torch.cuda.get_device_properties(0)
    print(p, flush=True)  # name, memory, SMs, L2 size: the record chapter 05 cites
    keep = {k: getattr(p, k) for k in dir(p) if not k.startswith("_")}
    return {k: v for k, v in keep.items() if isinstance(v, (int, float, str, bool))} | {
        "repr": str(p)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=85.0, help="seconds for the whole run")
    ap.add_argument("--only", nargs="+", default=["decode", "fwd", "fwd+bwd"],
                    choices=["decode", "fwd", "fwd+bwd"], help="measure only these")
    args = ap.parse_args(argv)
    t0 = time.time()
    dev = device.setup(seed=0)
    gpu = dev.type == "cuda"
    cfg = dict(GPU if gpu else CPU)
    cfg["d_model"] = cfg["heads"] * cfg["hd"]
    import triton

    res = {"device": device_properties(), "torch": torch.__version__, "triton": triton.__version__,
           "cpu_smoke": not gpu, "config": cfg,
           "command": "python3 -m bench.gpu.attention " + " ".join(argv or sys.argv[1:])}
    os.makedirs(args.outdir, exist_ok=True)
    stem = os.path.join(args.outdir, "attention_h200" if gpu else "attention_cpu_smoke")
    try:
        res["checks"] = checks(cfg, dev)
        print("checks (relative norm error vs oracle):", res["checks"], flush=True)
        res["rows"], res["skipped"] = measure(cfg, dev, args.budget, t0, args.only)
    finally:
        res.setdefault("rows", [])
        res["crossover"] = {op: crossover(res["rows"], op) for op in ("fwd", "fwd+bwd", "decode")}
        res["elapsed_s"] = round(time.time() - t0, 1)
        path = record("attention", res["rows"], res["command"], peers={}, out_dir=args.outdir,
                      method=METHOD, cpu_smoke=not gpu, device_properties=res["device"], config=cfg,
                      checks=res.get("checks"), crossover=res["crossover"],
                      skipped=res.get("skipped"), elapsed_s=res["elapsed_s"],
                      figure=f"docs/figures/{os.path.basename(stem)}.png")
        try:
            if res["rows"]:
                plot(res, stem + ".png")
        except ImportError as e:  # a device image without matplotlib: the JSON still counts
            print(f"no figure ({e}); plot it later from {path}")
    print(f"\ncrossover (attention slower than Mamba from l =): {res['crossover']}")
    print(f"skipped: {res.get('skipped')}\nwrote {path} and {stem}.png in {res['elapsed_s']} s")


if __name__ == "__main__":
    main()
