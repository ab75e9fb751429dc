"""Device script: the batch sweep at fixed tokens — Mamba-1 (cut into segments) and the decode step.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.batch_one [--limit S] [--sections m1,variants,step]
    python3 -m bench.gpu.batch_one --cpu-smoke     # the control flow, tiny, on a CPU

Every ratio is measured the project's way (`mambalearn.timing.compare`): both kernels in this
process, each warmed ≥ 1 s, then 5 interleaved rounds, the median of the per-round ratios (and
their spread). mamba_ssm's CUDA selective scan is built from ``.mamba_ref`` in the background at
the start (about 130 s); its Triton decode step is imported from the same source tree.

Sections:
  m1        b·l = 32 768 and 262 144 tokens, b ∈ {1, 2, 4, 8, 16, 64}, d2048, n16 and n64, bf16
            u/Δ/z/B/C, fp32 A/D/bias, z, D, softplus: ours (default plan) vs CUDA, fwd and fwd+bwd,
            with the segments each launch used, the exp floor of one pass and the output error
  variants  b1 l32768 n16 / n64 forward: segments 1 … 32, the recurrent forward with prefetch
  parts     b1 and b4 l·b = 32 768 n16: the summaries, the finishing kernel and the backward's
            pieces timed alone (where the cut's time goes)
  step      decode step b1 and b64 h80 p64 n128 fp32 state, 20 calls replayed in a CUDA graph:
            a sweep of (BLOCK_P, warps, evict-first), then the default and the best against
            mamba_ssm's selective_state_update, interleaved
Rows go to results files of the topics ``batch_one`` and ``step`` under $OUT
(`bench.gpu.record`); a short table is printed last.
"""

import argparse
import os
import sys
import time
import traceback

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from mambalearn import device  # noqa: E402,F401  (on a CPU: TRITON_INTERPRET=1 before Triton loads)

OUT = os.environ.get("OUT", "/tmp/out")
T0 = time.time()
ROWS = {}  # topic -> rows
EXP_RATE = 132 * 16 * 1.98e9  # exp2 per second on an H200 (SMs × MUFU lanes × clock)


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def keep(topic, **row):
    """A row of the results store's ``topic`` (printed as it arrives, kept for `save`)."""
    row = {k: v for k, v in row.items() if v is not None}
    ROWS.setdefault(topic, []).append(row)
    log(topic, " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in row.items()))


def save(args):
    """Each topic's rows into a results file under $OUT (device, date, command, commit, peers)."""
    from bench.gpu.record import record
    peers = {"mamba_ssm": "2.3.2.post1 (CUDA selective scan built for sm_90 from its source; its "
                          "Triton selective_state_update)"}
    method = ("mambalearn.timing.compare: every callable warmed ≥ 1 s, then 5 interleaved rounds "
              "of triton.testing.do_bench (median, 50 ms each); ratio = median of the per-round "
              "ratios to the baseline, spread = (max − min) / median of them; bf16 u/Δ/z/B/C, "
              "fp32 A/D/bias, z, D, softplus; decode: 20 calls replayed in one CUDA graph, ms a "
              "call")
    for topic, rows in ROWS.items():
        record(topic, rows, command="python3 -m bench.gpu.batch_one " + " ".join(sys.argv[1:]),
               peers=peers, out_dir=OUT, method=method,
               baseline="mamba_ssm cuda" if topic == "batch_one" else "mamba_ssm")


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def plan_of(x, n, d, l, b):
    """The segments the default forward and backward use at this shape."""
    import triton

    from mambalearn.mamba1 import config as cfgs
    cfg = cfgs.default_config(n, "cuda", l)
    f, k = cfg.forward, cfg.backward
    sms = cfgs.sm_count("cuda")
    fw = cfgs.segment_plan(cfg.segments, b * triton.cdiv(d, f.block_d), f.per_sm, l,
                           cfg.segment_unit, sms)[0]
    bw = cfgs.segment_plan(cfg.segments, b * triton.cdiv(d, k.block_d), k.per_sm, l,
                           cfg.segment_unit, sms)[0] if k.layout == "state-outer" else 1
    return fw, bw


def m1(args, peer, deadline):
    from course.bench.selective_scan import fwd_bwd, inputs
    from mambalearn.mamba1 import selective_scan_fn as ours
    from mambalearn.timing import compare
    d = 2048 if args.gpu else 8
    tokens = args.tokens if args.gpu else (64,)
    batches = args.batches if args.gpu else (1, 2)
    for n in (args.n if args.gpu else (4,)):
        for tok in (tokens if n <= 16 or not args.gpu else args.large_n_tokens):
            for b in (batches if n <= 16 or not args.gpu else args.large_n_batches):
                if time.time() > deadline:
                    log("m1: time limit")
                    return
                l = tok // b
                dev = torch.device("cuda" if args.gpu else "cpu")
                x = inputs(b, d, n, l, dev, dtype=torch.bfloat16 if args.gpu else torch.float32)
                fns = {"ours fwd": lambda x=x: ours(**x, delta_softplus=True),
                       "ours fwd+bwd": fwd_bwd(ours, x)}
                if peer is not None:
                    fns["cuda fwd"] = lambda x=x: peer(**x, delta_softplus=True)
                    fns["cuda fwd+bwd"] = fwd_bwd(peer, x)
                with torch.no_grad():
                    err = rel(ours(**x, delta_softplus=True), peer(**x, delta_softplus=True)) \
                        if peer is not None else None
                c = compare(fns, warm_s=1.0 if args.gpu else 0.0, rounds=5 if args.gpu else 1,
                            rep=50)
                fw, bw = plan_of(x, n, d, l, b)
                floor = b * d * n * l / EXP_RATE * 1e3
                shape = f"b{b} d{d} n{n} l{l}"
                for work in ("fwd", "fwd+bwd"):
                    r = c.ratio(f"ours {work}", f"cuda {work}") if peer else (None, None)
                    keep("batch_one", op=work, backend="ours", shape=shape, tokens=tok, b=b,
                         n=n, segments=str(fw) if work == "fwd" else f"{fw}/{bw}",
                         ms=c.ms(f"ours {work}"), ratio=r[0], spread=r[1],
                         exp_floor_ms=floor * (1 if work == "fwd" else 2),
                         out_rel_err_vs_cuda=err if work == "fwd" else None)
                    if peer is not None:
                        keep("batch_one", op=work, backend="mamba_ssm cuda", shape=shape,
                             tokens=tok, b=b, n=n, ms=c.ms(f"cuda {work}"))
                x = fns = None  # free the inputs before the next shape
                if args.gpu:
                    torch.cuda.empty_cache()


def variants(args, peer, deadline):
    """b1 l32768: the forward with each segment count, and the recurrent forward."""
    import dataclasses

    from course.bench.selective_scan import inputs
    from mambalearn.mamba1 import config as cfgs
    from mambalearn.mamba1 import selective_scan_fn as ours
    from mambalearn.timing import compare
    d, l = (2048, 32768) if args.gpu else (8, 128)
    for n in (args.n if args.gpu else (4,)):
        if time.time() > deadline:
            return
        dev = torch.device("cuda" if args.gpu else "cpu")
        x = inputs(1, d, n, l, dev, dtype=torch.bfloat16 if args.gpu else torch.float32)
        base = cfgs.default_config(n, dev, l)
        rec = dataclasses.replace(cfgs.FORWARD_RECURRENT, prefetch=True)
        cands = {f"S={s}": base.replace(segments=s) for s in (1, 2, 4, 8, 16, 32)}
        cands["default"] = base
        cands.update({f"recurrent prefetch S={s}": base.replace(forward=rec, segments=s)
                      for s in (16, 32, 64)})
        cands["S=8 split 1"] = base.replace(segments=8, summary=dict(split=1))
        cands["summary 16 steps a tile"] = base.replace(summary=dict(block_l=16))
        cands["summary 2 warps"] = base.replace(summary=dict(block_d=64, num_warps=2))
        fns = {k: (lambda c=c, x=x: ours(**x, delta_softplus=True, config=c)) for k, c in
               cands.items()}
        want = peer(**x, delta_softplus=True) if peer is not None else None
        if peer is not None:
            fns["cuda"] = lambda x=x: peer(**x, delta_softplus=True)
        with torch.no_grad():
            errs = {k: rel(f(), want) if want is not None else None for k, f in fns.items()}
            c = compare(fns, warm_s=1.0 if args.gpu else 0.0, rounds=5 if args.gpu else 1,
                        rep=50)
        for k in fns:
            r = c.ratio(k, "cuda") if peer is not None else (None, None)
            keep("batch_one", op="fwd, variant", backend="mamba_ssm cuda" if k == "cuda" else
                 f"ours {k}", shape=f"b1 d{d} n{n} l{l}", b=1, n=n, ms=c.ms(k),
                 ratio=None if k == "cuda" else r[0], spread=None if k == "cuda" else r[1],
                 out_rel_err_vs_cuda=None if k == "cuda" else errs[k])


def parts(args, peer, deadline):
    """Where a cut forward's and backward's time goes: the launches of one call timed alone."""
    d, tok = (2048, 32768) if args.gpu else (8, 256)
    for b in (1, 4):
        if time.time() > deadline:
            return
        _parts_at(args, b, d, tok // b, 16 if args.gpu else 4)


def _parts_at(args, b, d, l, n):
    import triton

    from course.bench.selective_scan import inputs
    from mambalearn.mamba1 import api as tuned
    from mambalearn.mamba1 import config as cfgs
    from mambalearn.mamba1.args import flags
    from mambalearn.mamba1.fused import forward as scan_forward
    from mambalearn.mamba1.fused import segments
    from mambalearn.timing import compare
    dev = torch.device("cuda" if args.gpu else "cpu")
    x = inputs(b, d, n, l, dev, dtype=torch.bfloat16 if args.gpu else torch.float32)
    cfg = cfgs.default_config(n, dev, l)
    shape = (b, d, l, n, 1)
    sms = cfgs.sm_count(dev) if args.gpu else 132
    S, seg = cfgs.segment_plan(None, b * triton.cdiv(d, cfg.forward.block_d), cfg.forward.per_sm,
                               l, cfg.segment_unit, sms)
    k = cfgs.summary_split(S, seg, b * triton.cdiv(d, 32), cfg.summary, sms)
    if not args.gpu:  # (the interpreter runs the plan the GPU would)
        cfg = cfg.replace(segments=S, summary=dict(split=k))
    fl = flags(x["D"], x["z"], x["delta_bias"], True, x["B"], x["C"], None)  # as args.run does
    summ = (x["u"], x["delta"], x["A"], x["B"], x["delta_bias"], fl, None, None, shape, S, seg,
            k, cfg.summary)
    starts = segments.forward_starts(*summ) if S > 1 else None
    fwd = (x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], x["z"], x["delta_bias"], fl,
           None, None)
    out, states, last = tuned.forward(*fwd, shape, cfg)
    dout = torch.ones_like(out)
    bwd = (dout, None, x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], x["z"],
           x["delta_bias"], fl, None, states, shape, cfg, False)
    fns = {"whole forward": lambda: tuned.forward(*fwd, shape, cfg),
           "finish only": lambda: scan_forward.forward(*fwd[:-1], starts, seg, shape, cfg),
           "whole backward": lambda: tuned.backward(*bwd)}
    if S > 1:
        fns["summaries and fold"] = lambda: segments.forward_starts(*summ)
        fns["adjoint summaries only"] = lambda: segments.adjoint_summaries(
            dout, x["delta"], x["A"], x["C"], x["z"], x["delta_bias"], fl, None, None, shape,
            S, seg, k, cfg.summary)
    with torch.no_grad():
        c = compare(fns, warm_s=1.0 if args.gpu else 0.0, rounds=5 if args.gpu else 1, rep=50)
    for name in fns:
        keep("batch_one", op=f"part: {name}", backend="ours", shape=f"b{b} d{d} n{n} l{l}", b=b,
             n=n, segments=str(S), pieces=k, ms=c.ms(name))


def step(args, deadline):
    """The decode step: a tile sweep, then default and best against mamba_ssm, interleaved."""
    from course.bench import step as bstep
    from mambalearn import inference
    from mambalearn.mamba2.step import StepConfig
    from mambalearn.mamba2.step import selective_state_update as ours
    from mambalearn.timing import compare
    theirs = bstep.load_mamba_ssm_step() if args.gpu else None
    shapes = [(1, 80, 64, 128), (64, 80, 64, 128)] if args.gpu else [(1, 2, 4, 8)]
    for b, h, p, n in shapes:
        dev = "cuda" if args.gpu else "cpu"
        inp = bstep.mamba2_step_inputs(b, h, p, n, torch.float32, device=dev)
        a = {k: v for k, v in inp.items() if k != "state"}
        want = inference.decode_step(inp["state"].double(), *(a[k].double() for k in (
            "x", "dt", "A", "B", "C", "D")), None, a["dt_bias"].double(), True)

        def fn_for(tune, theirs_fn=None, inp=inp, a=a):
            s = inp["state"].clone()
            c = StepConfig(**tune)
            f = (lambda: theirs_fn(s, **a)) if theirs_fn else (lambda: ours(s, **a, config=c))
            return f

        def graph(f):
            if not args.gpu:
                return f
            f()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(20):
                    f()
            return g.replay

        out = ours(inp["state"].clone(), **a)
        shape = f"b{b} h{h} p{p} n{n} fp32 state"
        keep("step", op="step, correct", backend="ours default, float64 check", shape=shape,
             rel_err=rel(out, want))
        sweep = {}
        for bp in (2, 4, 8, 16, 32, 64):
            for nw in (1, 2, 4, 8):
                for stream in (False, True):
                    if time.time() > deadline or bp * n // (32 * nw) < 1:
                        continue
                    tune = dict(block_p=bp, num_warps=nw, stream=stream)
                    try:
                        g = graph(fn_for(tune))
                        sweep[(bp, nw, stream)] = bstep_ms(g, args) / 20
                    except Exception as e:  # noqa: BLE001 - a tile that fails to build
                        log("tile", tune, type(e).__name__, str(e)[:80])
        best = sorted(sweep, key=sweep.get)[:3]
        for k in best:
            keep("step", op="step, graph, sweep", backend=f"ours, BLOCK_P {k[0]}, {k[1]} warps"
                 f"{', streamed' if k[2] else ''}", shape=shape, ms=sweep[k])
        fns = {"default": graph(fn_for({}))}
        for k in best:
            fns[f"{k[0]}x{k[1]}{' evict' if k[2] else ''}"] = graph(fn_for(
                dict(block_p=k[0], num_warps=k[1], stream=k[2])))
        if theirs is not None:
            fns["mamba_ssm"] = graph(fn_for({}, theirs))
        c = compare(fns, warm_s=1.0 if args.gpu else 0.0, rounds=5 if args.gpu else 1, rep=50)
        for k in fns:
            r = c.ratio(k, "mamba_ssm") if theirs is not None and k != "mamba_ssm" else (None,
                                                                                      None)
            name = {"default": "ours default", "mamba_ssm": "mamba_ssm"}.get(k, f"ours {k}")
            keep("step", op="step, graph", backend=name, shape=shape, ms=c.ms(k) / 20,
                 ratio=r[0], spread=r[1], floor_ms=bstep.floor_ms(b, h, p, n, torch.float32))


def bstep_ms(fn, args):
    from mambalearn.timing import time_ms
    return time_ms(fn, warmup=5, rep=20 if args.gpu else 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=400)
    ap.add_argument("--sections", default="m1,variants,step")
    ap.add_argument("--cpu-smoke", action="store_true")
    ints = lambda v: tuple(int(x) for x in v.split(","))
    ap.add_argument("--tokens", type=ints, default=(32768, 262144), help="m1: b·l values")
    ap.add_argument("--batches", type=ints, default=(1, 2, 4, 8, 16, 64), help="m1: b values")
    ap.add_argument("--n", type=ints, default=(16, 64), help="m1 and variants: state sizes")
    ap.add_argument("--large-n-tokens", type=ints, default=(32768, 262144),
                    help="m1: b·l values for n > 16")
    ap.add_argument("--large-n-batches", type=ints, default=(1, 2, 4, 8, 16, 64),
                    help="m1: b values for n > 16")
    args = ap.parse_args()
    args.gpu = not args.cpu_smoke
    os.makedirs(OUT, exist_ok=True)
    deadline = T0 + args.limit
    peer = None
    if args.gpu:
        from bench.gpu.selective_scan import start_build, wait_peer
        if not os.path.exists("/tmp/ssbuild"):  # (unless a build is already under way)
            start_build()
    for name in args.sections.split(","):
        try:
            if name == "step":
                step(args, deadline)
                continue
            if args.gpu and peer is None:
                peer = wait_peer(min(deadline, time.time() + 200))
                log("mamba_ssm CUDA:", "ready" if peer else "not built")
            {"m1": m1, "variants": variants, "parts": parts}[name](args, peer, deadline)
        except Exception:  # noqa: BLE001 - report, then the next section
            traceback.print_exc()
    if args.gpu:
        save(args)
    print()
    for topic, rows in ROWS.items():
        for r in rows:
            print(topic, " | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                    for k, v in r.items()))


if __name__ == "__main__":
    main()
