"""Device script: Mamba-1's forward at batch 1–4 (chapter 09's cut), variants against the default.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.m1_b1 --limit 150 --out $OUT
    python3 -m bench.gpu.m1_b1 --cpu-smoke          # the control flow, tiny, in the interpreter

At b1 / b2 / b4 with b·l = 32 768 tokens, d2048, n16 and n64 (bf16 u/Δ/z/B/C, fp32 A/D/bias, z, D,
softplus), every variant of the forward below is first checked against the default's output (and
against mamba_ssm's CUDA selective scan where its extension is built: the lead starts that build at
the call's start; this script never waits for it), then all are timed in this process with
`mambalearn.timing.compare` (each warmed ≥ 1 s, 5 interleaved rounds, the median of the per-round
ratios to the default, and to the peer). A variant whose output is off is reported, never timed.

Variants (`mambalearn.mamba1.config` fields, from the config without hints and with the exact
softplus, the default before these runs; one equal to today's default is not timed twice):
  no L1 hints, exact softplus   that starting point itself
  summary L1        the summaries ask for the next tile's B rows in L1 at each tile's top
  finish L1         the finishing kernel likewise (scan: the next block's u, Δ, z and B, C rows;
                    recurrent: the next tile's B, C rows)
  both L1           both
  summary L1, fast softplus  Δ's softplus from MUFU's ex2 and lg2 in both kernels (12 instructions,
                    not 30; the scan finish's build then has no spill), the hint in the summaries
  both L1, fast softplus               the hints and the softplus together; and with:
    split 8         the summaries cut finer (more one-warp programs in flight)
    half S          half the segments of the plan (fewer summarised steps, fewer programs)
    recurrent finish  (n16) the recurrent forward finishing 28 / b segments
    no register prefetch  (n64) the recurrent finish's L1 hint instead of its B/C rows held a
                    step ahead in registers
    split 1         (n64) one piece a segment (the n64 summaries: 255 registers, 8 programs an SM)
    states/2, states/4 a summary  a channel tile's states summarised by 2 (4) programs (n64:
                    168 (100) registers instead of 255; x, Δ and softplus loaded and computed twice)
  (summary L1 and finish L1 alone at b1 only)
Rows go to ``$OUT/<device>_m1_b1_<date>.json`` (`bench.gpu.record`); a short table is printed last.
"""

import argparse
import glob
import os
import shutil
import sys
import time
import traceback

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from mambalearn import device  # noqa: E402,F401  (on a CPU: TRITON_INTERPRET=1 before Triton loads)

T0 = time.time()
ROWS = []
TOL = 5e-3  # a variant's output against the default's (bf16 out: their roundings differ ~1e-3)


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def keep(**row):
    row = {k: v for k, v in row.items() if v is not None}
    ROWS.append(row)
    log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def peer_now():
    """mamba_ssm's CUDA selective_scan_fn if its extension is built by now (no waiting)."""
    if not torch.cuda.is_available():
        return None
    ref = os.path.join(ROOT, ".mamba_ref", "build")
    if not glob.glob(os.path.join(ref, "selective_scan_cuda*.so")):
        so = glob.glob("/tmp/ssbuild/selective_scan_cuda*.so")
        if not so or glob.glob("/tmp/ssbuild/lock"):  # (cpp_extension holds it while linking)
            return None
        os.makedirs(ref, exist_ok=True)
        shutil.copy(so[0], os.path.join(ref, "selective_scan_cuda.so"))
    from course.bench.selective_scan import load_mamba_ssm
    return load_mamba_ssm()


def plan(cfg, b, d, l, n, sms):
    """(S, pieces) the default plan cuts this call into."""
    import triton

    from mambalearn.mamba1 import config as cfgs
    S, seg = cfgs.segment_plan(cfg.segments, b * triton.cdiv(d, cfg.forward.block_d),
                               cfg.forward.per_sm, l, cfg.segment_unit, sms)
    k = cfgs.summary_split(S, seg, b * triton.cdiv(d, cfg.summary.block_d), cfg.summary, sms)
    return S, k


def variants(base, n, b, S, gpu):
    """name → Config: the default first."""
    import dataclasses

    from mambalearn.mamba1 import config as cfgs
    l1, sp = dict(l1_prefetch=True), dict(fast_softplus=True)
    off = dict(l1_prefetch=False, fast_softplus=False)
    plain = base.replace(forward=off, summary=off)  # no hint, the exact softplus: the variants'
    both = plain.replace(forward=l1, summary=l1)    # starting point (and the default before)
    fast = both.replace(forward=sp, summary=sp)  # L1 hints and the MUFU softplus, both kernels
    out = {"default": base, "no L1 hints, exact softplus": plain}
    if b == 1:  # (each hint alone: where the time goes, at b1 only)
        out.update({"summary L1": plain.replace(summary=l1),
                    "finish L1": plain.replace(forward=l1)})
    sl = plain.replace(forward=sp, summary=dict(**l1, **sp))  # (no hint in the finish)
    out.update({"both L1": both, "summary L1, fast softplus": sl, "both L1, fast softplus": fast})
    # (n64: the finish's hint spills at 255 registers; the state split goes with `sl` there)
    out[f"{'both' if n <= 16 else 'summary'} L1, fast softplus, states/2 a summary"] = (
        fast if n <= 16 else sl).replace(summary=dict(state_split=2))
    if n <= 16:
        out["both L1, fast softplus, split 8"] = fast.replace(summary=dict(split=8 if gpu else 2))
        if S > 2:
            out["half S, both L1, fast softplus"] = fast.replace(segments=S // 2)
        rec = dataclasses.replace(cfgs.FORWARD_RECURRENT, l1_prefetch=True, fast_softplus=True)
        if not gpu:
            rec = dataclasses.replace(rec, block_d=4)
        # (132 registers: 15 one-warp programs an SM, 1980 on the H200; 64 a segment at b1)
        out["recurrent finish, both L1, fast softplus"] = fast.replace(
            forward=rec, segments=max(2, 28 // b) if gpu else 4)
    else:
        out["both L1, fast softplus, no register prefetch"] = fast.replace(
            forward=dict(prefetch=False))
        out["both L1, fast softplus, split 1"] = fast.replace(summary=dict(split=1))
        out["summary L1, fast softplus, states/4 a summary"] = sl.replace(
            summary=dict(state_split=4 if gpu else 1))
    # (a variant equal to the default is timed once, as the default)
    return {k: v for k, v in out.items() if k == "default" or v != base}


def shape_run(args, n, b, l, deadline):
    from course.bench.selective_scan import inputs
    from mambalearn.mamba1 import config as cfgs
    from mambalearn.mamba1 import selective_scan_fn as ours
    from mambalearn.timing import compare
    d = 2048 if args.gpu else 4
    dev = torch.device("cuda" if args.gpu else "cpu")
    x = inputs(b, d, n, l, dev, dtype=torch.bfloat16 if args.gpu else torch.float32)
    base = cfgs.default_config(n, dev, l)
    sms = cfgs.sm_count(dev) if args.gpu else 132
    S, k = plan(base, b, d, l, n, sms)
    if not args.gpu:  # (the interpreter: the cut the GPU would make, smaller)
        S, k = 3, 2
        base = base.replace(segments=S, summary=dict(split=k))
    shape = f"b{b} d{d} n{n} l{l}"
    cands = variants(base, n, b, S, args.gpu)
    peer = peer_now()
    fns, errs = {}, {}
    with torch.no_grad():
        want = ours(**x, delta_softplus=True, config=base).float()
        theirs = peer(**x, delta_softplus=True).float() if peer is not None else None
        for name, cfg in cands.items():
            if time.time() > deadline:
                break
            try:
                out = ours(**x, delta_softplus=True, config=cfg).float()
            except Exception as e:  # noqa: BLE001 - a variant that fails is reported
                keep(op="fwd, variant", backend=f"ours {name}", shape=shape, b=b, n=n,
                     error=f"{type(e).__name__}: {str(e)[:200]}")
                continue
            e_def = rel(out, want)
            e_peer = rel(out, theirs) if theirs is not None else None
            errs[name] = (e_def, e_peer)
            if e_def > TOL or not torch.isfinite(out).all():
                keep(op="fwd, variant", backend=f"ours {name}", shape=shape, b=b, n=n,
                     error=f"output off: rel err vs default {e_def:.3g} > {TOL}")
                continue
            fns[name] = (lambda c=cfg: ours(**x, delta_softplus=True, config=c))
        if peer is not None:
            fns["cuda"] = lambda: peer(**x, delta_softplus=True)
        if time.time() > deadline:
            log(f"{shape}: time limit before timing")
            return
        c = compare(fns, warm_s=1.0 if args.gpu else 0.0, rounds=5 if args.gpu else 1, rep=50)
    floor = b * d * n * l / EXP_RATE * 1e3
    for name in fns:
        cfg = cands.get(name)
        r_def = c.ratio(name, "default") if name != "default" else (None, None)
        r_peer = c.ratio(name, "cuda") if peer is not None and name != "cuda" else (None, None)
        seg = None
        if cfg is not None:
            seg = cfg.segments if cfg.segments is not None else S
        keep(op="fwd, variant", backend="mamba_ssm cuda" if name == "cuda" else f"ours {name}",
             shape=shape, b=b, n=n, segments=seg, ms=c.ms(name), ratio_vs_default=r_def[0],
             spread_vs_default=r_def[1], ratio=r_peer[0], spread=r_peer[1],
             exp_floor_ms=floor, rel_err_vs_default=errs.get(name, (None,))[0],
             rel_err_vs_cuda=errs.get(name, (None, None))[1])


EXP_RATE = 132 * 16 * 1.98e9  # exp2 per second on an H200 (SMs × MUFU lanes × clock)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=150)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--cpu-smoke", action="store_true")
    ints = lambda v: tuple(int(x) for x in v.split(","))
    ap.add_argument("--batches", type=ints, default=(1, 2, 4))
    ap.add_argument("--n", type=ints, default=(16, 64))
    args = ap.parse_args()
    args.gpu = not args.cpu_smoke
    os.makedirs(args.out, exist_ok=True)
    deadline = T0 + args.limit - 3  # (the file is written after)
    tokens = 32768 if args.gpu else 128
    todo = [(n, b) for b in args.batches for n in args.n]  # b1 of every n first
    for n, b in (todo if args.gpu else [(4, 1), (18, 4)]):
        left = deadline - time.time()
        if left < (25 if args.gpu else 0):
            keep(op="fwd, variant", backend="skipped", shape=f"b{b} n{n} l{tokens // b}",
                 b=b, n=n, error=f"time limit ({left:.0f} s left)")
            continue
        try:
            shape_run(args, n, b, tokens // b, deadline)
        except Exception:  # noqa: BLE001 - report, then the next shape
            traceback.print_exc()
        if args.gpu:
            torch.cuda.empty_cache()
    if args.gpu:
        from bench.gpu.record import record
        path = record(
            "m1_b1", ROWS, command="python3 -m bench.gpu.m1_b1 " + " ".join(sys.argv[1:]),
            peers={"mamba_ssm": "2.3.2.post1 (CUDA selective scan built for sm_90 from its "
                                "source, where built in time)"},
            out_dir=args.out, baseline="ours default",
            method="each variant's output checked against the default's first (rel err ≤ "
                   f"{TOL}); mambalearn.timing.compare: every callable warmed ≥ 1 s, then 5 "
                   "interleaved rounds of triton.testing.do_bench (median, 50 ms each); ratio "
                   "= median of per-round ratios to mamba_ssm cuda, ratio_vs_default to ours "
                   "default; bf16 u/Δ/z/B/C, fp32 A/D/bias, z, D, softplus, forward under "
                   "no_grad")
        log("wrote", path)
    print()  # the short table: a line a shape, ratios to the default and to CUDA
    for shape in dict.fromkeys(r["shape"] for r in ROWS):
        rs = [r for r in ROWS if r["shape"] == shape]
        d = next((r for r in rs if r["backend"] == "ours default" and "ms" in r), {})
        head = f"{shape}: default " + (f"{d['ms']:.3f} ms" if d else "not timed")
        if "ratio" in d:
            head += f" ({d['ratio']:.3f}× cuda)"
        print(head)
        print("   " + "; ".join(
            f"{r['backend'].removeprefix('ours ')} "
            + (f"{r['ratio_vs_default']:.3f}" if "ratio_vs_default" in r else
               r.get("error", "")[:40] if "ms" not in r else f"{r['ms']:.3f} ms")
            for r in rs if r is not d))

if __name__ == "__main__":
    main()
