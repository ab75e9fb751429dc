"""Device script for chapter 15: the MIMO prefill against our SISO at the same state size.

Mamba-3's claim (Lahoti et al. 2026, §3.3) is that MIMO buys accuracy at little extra cost: rank r
multiplies the arithmetic per state update by about r on the same state bytes. This run measures
where that holds for our kernels, at b8 l2048 h32 p64 n128 na32 bf16 (the SISO benchmark shape):

    1. agreement first: ``mamba3_mimo_combined`` (chunk 64/r, mamba_ssm's recommendation) against
       the float64 chunked oracle (``mambalearn.mamba3.mimo_reference``), output and every gradient,
       at b1 l200 (a partial last chunk) with the timing's head sizes, so the timed kernels are the
       ones compiled here; then
    2. forward and forward+backward, ``mambalearn.timing.compare`` (each callable warmed ≥ 1 s,
       ≥ 5 interleaved rounds): our SISO (``mamba3_siso_combined``, chunk 64) against MIMO at
       rank r, one rank at a time in the order 4, 1, 2, 8 while ``--limit`` allows.

Rows are printed as they come and recorded (``bench.gpu.record``) as OUT/<device>_mamba3_mimo_
<date>.json, even when the run is cut short. ``--cpu-smoke`` runs every step at toy sizes in
Triton's interpreter (float32, one short round): a test of this script, not a measurement.

    python3 -m bench.gpu.mimo --limit 55 --out $OUT          (H200, ≤ 60 s)
    python3 -m bench.gpu.mimo --cpu-smoke --out /tmp/out     (any machine, ~20 s)
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

SHAPE = dict(b=8, l=2048, h=32, g=1, p=64, n=128, na=32)
TOL = {torch.bfloat16: 5e-2, torch.float32: 1e-4}  # worst relative error the timing waits for
AGREE_L = 200
SMOKE = dict(b=1, l=24, h=2, g=1, p=16, n=16, na=4)
RANKS = (4, 1, 2, 8)
NAMES = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "MIMO_V", "MIMO_Z", "MIMO_Out",
         "Angles", "D", "Z")


def inputs(b, l, h, g, p, n, na, r, dtype, device, seed=0):
    """MIMO inputs at rank r (None: SISO's layouts), as a model would feed them."""
    gen = torch.Generator().manual_seed(seed)
    rr = lambda *s, scale=1.0: (torch.randn(*s, generator=gen) * scale)
    DT = torch.nn.functional.softplus(rr(b, h, l) - 2.0)  # Δ ≈ 0.1
    A = -torch.nn.functional.softplus(rr(b, h, l))
    qk = (b, l, g, n) if r is None else (b, l, r, g, n)
    bias = (h, n) if r is None else (h, r, n)
    x = dict(Q=rr(*qk) / n ** 0.5, K=rr(*qk) / n ** 0.5, V=rr(b, l, h, p), ADT=A * DT, DT=DT,
             Trap=rr(b, h, l), Q_bias=torch.ones(bias), K_bias=torch.ones(bias),
             Angles=rr(b, l, h, na), D=torch.ones(h), Z=rr(b, l, h, p))
    if r is not None:
        x.update(MIMO_V=torch.ones(h, r, p) / r, MIMO_Z=torch.ones(h, r, p),
                 MIMO_Out=torch.ones(h, r, p) / r)  # mamba_ssm's initialisation
    keep32 = {"ADT", "DT", "Q_bias", "K_bias", "Angles", "D", "MIMO_V", "MIMO_Z", "MIMO_Out"}
    return {k: v.to(device, torch.float32 if k in keep32 else dtype) for k, v in x.items()}


def agreement_rows(r, dims, dtype, device):
    """‖ours − oracle‖/‖oracle‖ of the output and every gradient (float64 chunked oracle)."""
    from mambalearn.mamba3 import mamba3_mimo_combined
    from mambalearn.mamba3.mimo_reference import mamba3_mimo_chunked
    from mambalearn.testing import rel_error

    x = inputs(**{**dims, "b": 1, "l": min(AGREE_L, dims["l"])}, r=r, dtype=dtype,
               device=device, seed=1)
    ours = {k: v.clone().requires_grad_() for k, v in x.items()}
    ref = {k: v.double().requires_grad_() for k, v in x.items()}
    out = mamba3_mimo_combined(**ours, chunk_size=max(1, 64 // r))
    want = mamba3_mimo_chunked(**ref, chunk_size=max(1, 64 // r))
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(2)).to(device)
    (out.float() * g).sum().backward()
    (want * g.double()).sum().backward()
    rows = [dict(op="agreement", rank=r, what="out", rel_err=rel_error(out, want))]
    rows += [dict(op="agreement", rank=r, what=f"d{k}", rel_err=rel_error(ours[k].grad,
                                                                         ref[k].grad))
             for k in NAMES]
    return rows


def timing_rows(r, dims, dtype, device, warm_s, rounds, rep):
    """Forward and forward+backward: SISO and MIMO rank r side by side (``timing.compare``)."""
    from mambalearn.mamba3 import mamba3_mimo_combined, mamba3_siso_combined
    from mambalearn.timing import compare

    siso, mimo = inputs(**dims, r=None, dtype=dtype, device=device), inputs(
        **dims, r=r, dtype=dtype, device=device)
    q = max(1, 64 // r)
    run = {"siso": lambda x: mamba3_siso_combined(**x, chunk_size=64),
           f"mimo r{r}": lambda x: mamba3_mimo_combined(**x, chunk_size=q)}
    args = {"siso": siso, f"mimo r{r}": mimo}
    grad = torch.randn(dims["b"], dims["l"], dims["h"], dims["p"], device=device, dtype=dtype)

    rows, shape = [], " ".join(f"{k}{v}" for k, v in dims.items()) + \
        f" {str(dtype).replace('torch.', '')}"
    for op, fns in zip(("fwd", "fwd+bwd"), callables(run, args, grad), strict=True):
        got = compare(fns, warm_s=warm_s, rounds=rounds, rep=rep)
        ratio, spread = got.ratio(f"mimo r{r}", "siso")
        for name in run:
            rows.append(dict(op=op, backend="ours SISO (chunk 64)" if name == "siso" else
                             f"ours MIMO rank {r} (chunk {q})", rank=1 if name == "siso" else r,
                             shape=shape, ms=got.ms(name),
                             **({} if name == "siso" else dict(ratio_to_siso=ratio,
                                                               ratio_spread=spread))))
    return rows


def callables(run, args, grad):
    """{name: fwd}, {name: fwd+bwd} for ``run`` {name: f(x)} on ``args`` {name: inputs}: the
    forward under no_grad, fwd+bwd on leaves of their own with the upstream gradient ``grad``."""
    def fwd(name):
        def f():
            with torch.no_grad():
                run[name](args[name])
        return f

    def fwd_bwd(name):
        leaves = {k: v.clone().requires_grad_() for k, v in args[name].items()}

        def f():
            run[name](leaves).backward(grad)
        return f

    return {n: fwd(n) for n in run}, {n: fwd_bwd(n) for n in run}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=55.0, help="seconds for the whole run")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes in the interpreter")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    gpu = torch.cuda.is_available() and not args.cpu_smoke
    if not gpu and not args.cpu_smoke:
        print("skipped: no GPU (use --cpu-smoke to test this script)")
        return []
    from bench.gpu.record import record

    dims, dtype, device = (SHAPE, torch.bfloat16, "cuda") if gpu else (SMOKE, torch.float32,
                                                                       "cpu")
    timing = dict(warm_s=1.0, rounds=5, rep=100) if gpu else dict(warm_s=0.0, rounds=1, rep=1)
    ranks = RANKS if gpu else (4, 1)
    print(torch.cuda.get_device_name() if gpu else "CPU (interpreter, smoke run)", flush=True)
    rows = []
    try:
        for r in ranks:
            if time.perf_counter() - t0 > args.limit - (15 if gpu else 0):
                rows.append(dict(op="skipped", rank=r, why=f"--limit {args.limit:.0f} s"))
                print(rows[-1], flush=True)
                continue
            agree = agreement_rows(r, dims, dtype, device)
            bad = [a for a in agree if not a["rel_err"] < TOL[dtype]]
            if bad:  # a wrong kernel's time means nothing: say so and time the next rank
                agree.append(dict(op="agreement failed", rank=r, what=", ".join(
                    a["what"] for a in bad), tolerance=TOL[dtype]))
            for row in agree + ([] if bad else timing_rows(r, dims, dtype, device, **timing)):
                row["elapsed_s"] = round(time.perf_counter() - t0, 1)
                rows.append(row)
                print(row, flush=True)
    except Exception as e:  # noqa: BLE001 - record what was measured, then the failure
        rows.append(dict(op="failed", error=f"{type(e).__name__}: {e}"))
        print(rows[-1], flush=True)
    finally:
        record("mamba3_mimo", rows, command="python3 -m bench.gpu.mimo"
               + (" --cpu-smoke" if not gpu else f" --limit {args.limit:.0f}"), peers={},
               out_dir=args.out,
               method="agreement: relative error vs the float64 chunked oracle (b1 l200); "
                      "timings: mambalearn.timing.compare (warm ≥ 1 s, 5 interleaved rounds, "
                      "median; ratio = median of per-round ratios MIMO / SISO); bf16 inputs, "
                      "fp32 states; MIMO chunk 64/r, SISO chunk 64; no peer (mamba_ssm's MIMO "
                      "prefill is TileLang)" if gpu else "CPU smoke run of the script")
    print(table(rows), flush=True)
    return rows


def table(rows):
    lines = [f"{'op':<9}{'backend':<32}{'ms':>10}{'× SISO':>9}"]
    for r in rows:
        if "ms" in r:
            ratio = f"{r['ratio_to_siso']:.2f}" if "ratio_to_siso" in r else "-"
            lines.append(f"{r['op']:<9}{r['backend']:<32}{r['ms']:>10.4f}{ratio:>9}")
    worst = {}
    for r in rows:
        if r.get("op") == "agreement":
            worst[r["rank"]] = max(worst.get(r["rank"], (0, "")), (r["rel_err"], r["what"]))
    lines += [f"agreement rank {k}: worst ‖ours − oracle‖/‖oracle‖ {e:.2e} ({w})"
              for k, (e, w) in worst.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
