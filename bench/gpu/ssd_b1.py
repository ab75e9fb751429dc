"""Device script: SSD at batch one — the backward's walks cut or not, the forward's config swept.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.ssd_b1 --limit 200 --out $OUT
    python3 -m bench.gpu.ssd_b1 --cpu-smoke --out /tmp/ssd_b1     (control flow, toy sizes, CPU)

h80 p64 n128 g1, chunk 256, bf16 x/B/C, fp32 dt/A/D/dt_bias, softplus, no z
(``course.bench.ssd.make_inputs``), against mamba_ssm 2.3.2.post1's ``mamba_chunk_scan_combined``
(its source tree, ``course.bench.ssd.load_mamba_ssm_ssd``).

0. **prewarm** (``--prewarm`` s at most, ``--workers`` spawned processes sharing Triton's disk
   cache): every config of mamba_ssm's SSD autotuners (each worker a slice, as
   ``bench.gpu.batch_one_ssd``'s prewarm) and every variant of ours, compiled at exactly the calls
   parts 1 and 2 time. Nothing is timed there.
The cases run in the order b1 l16384 fwd+bwd, b1 l32768 fwd, b4 l4096 fwd, b4 l4096 fwd+bwd
(``CASES``). Expected on a fresh H200 (estimates): start 10 s, prewarm ≤ 58 s, then each case
its mamba_ssm tuning (~138 configs for fwd+bwd ≈ 20 s, ~42 for the forward ≈ 6 s) and ~1.5 s a
callable timed: ≈ 40 + 28 + 22 + 35 s — the last case is the one the limit cuts first.

1. **fwd+bwd** at b1 l16384 and b4 l4096: ours with the backward's two walks over chunks (step 0's
   recompute of the states, step 3's reverse state passing) as ``BWD_VARIANTS`` sets them — the
   one walk each (the previous default: pointer-load recompute), the default (``config.gpu_config``
   rules: at b1 the forward's descriptor kernel cut as the forward's), forced cuts of either
   kernel and of the state passing (a variant equal to one before is left out) — against
   mamba_ssm, whose autotuners are
   cleared before this shape's first fwd+bwd call (tuned on the call timed). Every variant's seven
   gradients are checked against the one walk's first, on inputs whose states carry over many
   chunks (slow decay: ``inputs(slow=True)``; relative norm ≤ ``GRAD_TOL``: a wrong one is a row,
   not timed); mamba_ssm's against ours as information. At b1, the kernels of both
   sides under torch.profiler.
2. **fwd sweep** at b1 l32768 and b4 l4096, under ``torch.no_grad()`` on inputs that need no
   grad: ours at the default config and at ``FWD_VARIANTS`` (the states kernel's cut, tiles,
   warps, stages, register caps; the outputs kernel's tiles, warps, stages), each output checked
   against the default's first (slow-decay inputs, ≤ ``OUT_TOL``), against mamba_ssm's forward
   tuned on this shape's first no-grad call.

Every ratio is ``mambalearn.timing.compare``'s: each callable warmed ≥ 1 s, 5 interleaved rounds
of ``do_bench`` (median, ``REP_MS`` ms each), the median of the per-round ratios and its spread
(vs = to mamba_ssm, vs_base = to our default / one walk). A part or shape starts only while
``--limit`` leaves it ``NEED`` seconds (else a row says it was skipped). Rows are printed as they
come; ``$OUT/<device>_ssd_b1_<date>.json`` is written through ``bench.gpu.record``; a short table
last. ``--cpu-smoke``: toy sizes in Triton's interpreter (no peer): a test of this script.
"""

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
if __name__ == "__main__" and "--cpu-smoke" in sys.argv:  # the interpreter, even beside a GPU
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

import mambalearn.device  # noqa: E402,F401  (on a CPU: TRITON_INTERPRET=1 before Triton)
from bench.gpu.record import Run as RunBase  # noqa: E402

T0 = time.time()
HEADS = dict(h=80, p=64, g=1, n=128)
CHUNK = 256
BWD_POINTS = [(1, 16384), (4, 4096)]
FWD_POINTS = [(1, 32768), (4, 4096)]
# the order of the timed cases (batch one first: what is left when the limit cuts the run)
CASES = [("bwd", BWD_POINTS[0]), ("fwd", FWD_POINTS[0]), ("fwd", FWD_POINTS[1]),
         ("bwd", BWD_POINTS[1])]
# backward variants: changes of the shape's default config (None: the default itself)
_PTR = dict(tma=False, maxnreg=96)  # the backward's recompute before: pointer loads
_TMA = dict(tma=True, maxnreg=96)  # the forward's states kernel (tensor descriptors)
BWD_VARIANTS = {
    "one walk (old default)": dict(backward=dict(passing_split=1, states=dict(_PTR, split=1))),
    "default (rules)": None,
    "pointer cut 4": dict(backward=dict(passing_split=1, states=dict(_PTR, split=4))),
    "TMA one walk": dict(backward=dict(passing_split=1, states=dict(_TMA, split=1))),
    "TMA cut 4": dict(backward=dict(passing_split=1, states=dict(_TMA, split=4))),
    "TMA cut 8": dict(backward=dict(passing_split=1, states=dict(_TMA, split=8))),
    "passing cut 4": dict(backward=dict(passing_split=4, states=dict(_PTR, split=1))),
    "passing cut 8": dict(backward=dict(passing_split=8, states=dict(_PTR, split=1))),
}
BWD_BASE = "one walk (old default)"
# forward variants: changes of the shape's default config
FWD_VARIANTS = {
    "states split 1": dict(states=dict(split=1)),
    "states split 2": dict(states=dict(split=2)),
    "states split 4": dict(states=dict(split=4)),
    "states split 8": dict(states=dict(split=8)),
    "states split 16": dict(states=dict(split=16)),
    "states no register cap": dict(states=dict(maxnreg=None)),
    "states maxnreg 128": dict(states=dict(maxnreg=128)),
    "states 8 warps": dict(states=dict(num_warps=8, maxnreg=None)),
    "states 64x128 tile 8 warps": dict(states=dict(block_n=128, num_warps=8, maxnreg=None)),
    "states 2 stages": dict(states=dict(stages=2, maxnreg=None)),
    "outputs 8 warps": dict(outputs=dict(num_warps=8)),
    "outputs 3 stages": dict(outputs=dict(num_stages=3)),
    "outputs loop k32 s3": dict(outputs=dict(block_k=32, loop=True, num_stages=3)),
    "outputs m128 8 warps": dict(outputs=dict(block_m=128, num_warps=8)),
}
FWD_CUTS_MAX_B = 2  # batches above this: no forward variant cuts the walk in more than 2
GRAD_TOL = 1e-2  # a cut changes float32 summation order (and so some bf16 roundings of H) only
OUT_TOL = 1e-3
REP_MS = 40
NEED = {"prewarm": 100, "bwd": 38, "fwd": 26}  # seconds a part / shape needs at least (GPU)
TOPIC = "ssd_b1"
SMOKE = dict(points=[(1, 112)], heads=dict(h=2, p=16, g=1, n=16), chunk=16)
PREFIX = "mamba_ssm.ops.triton.ssd"
PEER_SLICES = 8  # prewarm workers compiling mamba_ssm's configs (ours: one a timed call)
METHOD = (
    "mambalearn.timing.compare: every callable warmed >= 1 s, then 5 interleaved rounds of "
    f"triton.testing.do_bench (median, {REP_MS} ms each); ms = median over the rounds; vs = median "
    "of the per-round ratios to mamba_ssm (tuned on the call timed: its autotuners cleared before "
    "the shape's first call on the path, TRITON_CACHE_AUTOTUNING=0), vs_base = to our base "
    "(bwd: the one walk; fwd: the default config), spread = (max - min) / median. fwd+bwd = "
    "torch.autograd.grad of x, dt, A, B, C, D, dt_bias for a random dout "
    "(course.bench.ssd.fwd_bwd); "
    "fwd = under torch.no_grad(). h80 p64 n128 g1 chunk 256 bf16, fp32 dt/A/D/dt_bias, softplus, "
    "no z. check rows: rel. norm error of each variant against the base first (grads: the largest "
    "of the seven).")


class Run(RunBase):
    """``bench.gpu.record.Run`` with this script's clock, the parts' needs (``NEED``) and rows
    printed as JSON, rounded to 5 digits."""

    def __init__(self, limit, smoke):
        super().__init__(limit, smoke, T0)

    def has(self, part):
        return not self.gpu or self.left() >= NEED[part]

    def keep(self, **row):
        row = {k: (float(f"{v:.5g}") if math.isfinite(v) else str(v))  # (JSON: no inf, NaN)
               if isinstance(v, float) else v for k, v in row.items() if v is not None}
        self.rows.append(row)
        print(f"[{time.time() - T0:6.1f}s]", json.dumps(row)[:600], flush=True)
        return row


# --------------------------------------------------------------------------------------------
# sizes and callables (the same in the workers and the timing process)
def dims(smoke):
    return (SMOKE["heads"], SMOKE["chunk"]) if smoke else (HEADS, CHUNK)


def point(b, l, smoke):
    return SMOKE["points"][0] if smoke else (b, l)


def inputs(b, l, smoke, slow=False):
    """``make_inputs`` at (b, l); ``slow``: A in [−0.02, −0.002] instead of [−9, −1], so that a
    state carries over many chunks (with the timed inputs a chunk's decay exp(Σ Δ A) is ~e⁻⁴⁰:
    a walk that dropped its carries would pass a check on them)."""
    from course.bench.ssd import make_inputs

    heads, _ = dims(smoke)
    b, l = point(b, l, smoke)
    dev = "cpu" if smoke or not torch.cuda.is_available() else "cuda"
    args, kw = make_inputs(b, l, **heads, dtype=torch.float32 if smoke else torch.bfloat16,
                           device=dev, seed=0)
    if slow:
        gen = torch.Generator(device=dev).manual_seed(1)
        A = -(torch.rand(heads["h"], generator=gen, device=dev) * 0.018 + 0.002)
        args = (*args[:2], A, *args[3:])
    return args, kw


def config(args, changes, smoke):
    """Our default config for the inputs' shape, ``changes`` applied; on a CPU the GPU rules'
    config (the interpreter runs it: the point of a smoke run is the control flow)."""
    from mambalearn.mamba2.config import gpu_config

    _, q = dims(smoke)
    (b, l, h, p), (g, n) = args[0].shape, args[3].shape[2:]
    cfg = gpu_config((b, l, h, p, g, n, q), 132)
    if smoke:  # the interpreter's tiles, the GPU's cuts
        from mambalearn.mamba2.config import CPU

        cfg = CPU.replace(states=dict(split=cfg.states.split),
                          backward=dict(passing_split=cfg.backward.passing_split,
                                        states=dict(split=cfg.backward.states.split)))
        changes = _cpu_changes(changes)
    return cfg.replace(**changes) if changes else cfg


def _cpu_changes(changes):
    """A variant's changes without the GPU-only settings the interpreter cannot take (a 64 × 128
    tile at p 16, n 16 is clipped anyway; ``maxnreg`` is ignored)."""
    if not changes:
        return changes
    out = json.loads(json.dumps(changes))
    for part in out.values():
        part.pop("block_m", None)
        part.pop("block_k", None)
    return out


def bwd_fns(args, kw, smoke, mamba):
    """{name: closure} for the fwd+bwd part at one shape: mamba_ssm first, then our variants."""
    from course.bench.ssd import fwd_bwd
    from mambalearn.mamba2 import mamba_chunk_scan_combined as ours

    _, q = dims(smoke)
    gen = torch.Generator(device=args[0].device).manual_seed(1)
    dout = torch.randn(args[0].shape, generator=gen, device=args[0].device).to(args[0].dtype)
    fns = {}
    if mamba is not None:
        fns["mamba_ssm"] = fwd_bwd(lambda *a, **k: mamba(*a, q, **k), args, kw, dout)
    seen = set()
    for name, changes in BWD_VARIANTS.items():  # (a variant equal to one before: left out)
        cfg = config(args, changes, smoke)
        if cfg not in seen:
            seen.add(cfg)
            fns[name] = fwd_bwd(lambda *a, cfg=cfg, **k: ours(*a, q, config=cfg, **k), args, kw,
                                dout)
    return fns


def fwd_fns(args, kw, smoke, mamba):
    """{name: closure} for the forward sweep at one shape (under no_grad): mamba_ssm, our
    default, our variants (a variant equal to one before is left out, and at b > 2 one that
    cuts the states walk in more than 2)."""
    from mambalearn.mamba2 import mamba_chunk_scan_combined as ours

    _, q = dims(smoke)

    def nograd(fn):
        def go():
            with torch.no_grad():
                return fn()
        return go

    fns = {}
    if mamba is not None:
        fns["mamba_ssm"] = nograd(lambda: mamba(*args, q, **kw))
    base = config(args, None, smoke)
    fns["default"] = nograd(lambda: ours(*args, q, config=base, **kw))
    seen = {base}
    for name, changes in FWD_VARIANTS.items():
        cfg = config(args, changes, smoke)
        if cfg in seen or (args[0].shape[0] > FWD_CUTS_MAX_B and cfg.states.split > 2):
            continue  # the same as one before; or a cut where b · h fills the GPU
        seen.add(cfg)
        fns[name] = nograd(lambda cfg=cfg: ours(*args, q, config=cfg, **kw))
    return fns


# --------------------------------------------------------------------------------------------
# 0. prewarm
def _job(kind, arg, smoke):
    """One prewarm job: ("peer", (i, n)) compiles slice i of n of mamba_ssm's configs at every
    timed call; ("ours", (path, b, l, i, n)) runs variants i, i + n, … of ours once at one timed
    call."""
    from bench.gpu.batch_one_ssd import clear_autotuners, slice_autotuners
    from course.bench.ssd import load_mamba_ssm_ssd

    if kind == "peer":
        mamba = load_mamba_ssm_ssd()
        slice_autotuners(PREFIX, *arg)
        for path, points in (("bwd", BWD_POINTS), ("fwd", FWD_POINTS)):
            for b, l in points:
                clear_autotuners(PREFIX)
                args, kw = inputs(b, l, smoke)
                make = bwd_fns if path == "bwd" else fwd_fns
                make(args, kw, smoke, mamba)["mamba_ssm"]()
                del args, kw
    else:
        path, b, l, i, n = arg
        args, kw = inputs(b, l, smoke)
        fns = (bwd_fns if path == "bwd" else fwd_fns)(args, kw, smoke, None)
        for fn in list(fns.values())[i::n]:
            fn()
    torch.cuda.synchronize()
    return kind, str(arg)


def prewarm(run, workers, seconds):
    jobs = [("peer", (i, PEER_SLICES)) for i in range(PEER_SLICES)]
    jobs += [("ours", ("bwd", b, l, 0, 1)) for b, l in BWD_POINTS]
    jobs += [("ours", ("fwd", b, l, i, 2)) for b, l in FWD_POINTS for i in range(2)]
    t, done = time.time(), 0
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    futures = [pool.submit(_job, kind, arg, False) for kind, arg in jobs]
    try:
        for f in cf.as_completed(futures, timeout=seconds):
            try:
                f.result()
            except Exception as e:  # noqa: BLE001 - a failing job is a row, not the end
                run.keep(part="prewarm", error=f"{type(e).__name__}: {str(e)[:300]}")
            done += 1
        pool.shutdown()
    except cf.TimeoutError:  # end the workers this run started (they would share the GPU)
        for proc in list(pool._processes.values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
    run.keep(part="prewarm", jobs=len(jobs), done=done, workers=workers,
             seconds=time.time() - t)


# --------------------------------------------------------------------------------------------
# timing
def compared(run, part, shape, fns, base):
    from mambalearn.timing import compare

    warm, rounds = (1.0, 5) if run.gpu else (0.0, 1)
    if run.gpu:  # what the limit leaves: variants dropped from the end (base and peer kept)
        each = warm + rounds * REP_MS * 2.5e-3  # s a callable (do_bench ~2.5× its rep)
        fit = max(2, int((run.left() - 5) / each))
        if len(fns) > fit:
            names = list(fns)
            drop = [n for n in names if n not in ("mamba_ssm", base)][fit - 2:]
            run.keep(part=part, shape=shape, error=f"time limit: not timed: {', '.join(drop)}")
            fns = {n: f for n, f in fns.items() if n not in drop}
    try:
        res = compare(fns, warm_s=warm, rounds=rounds, rep=REP_MS)
    except Exception as e:  # noqa: BLE001 - e.g. out of memory: a row, go on
        return run.keep(part=part, shape=shape, error=f"{type(e).__name__}: {str(e)[:300]}")
    for name in fns:
        r = dict(part=part, shape=shape, variant=name, ms=res.ms(name))
        for key, ref in (("vs", "mamba_ssm"), ("vs_base", base)):
            if ref in fns and name != ref:
                r[key], r[f"{key}_spread"] = res.ratio(name, ref)
        run.keep(**r)


def checked(run, part, shape, check_fns, fns, base, tol, grads):
    """Run every callable of ``check_fns`` (the same calls on slow-decay inputs) once, mamba_ssm
    first (its tuning call: the timed shape and path), and keep those of ``fns`` whose result is
    within ``tol`` of ``base``'s (relative norm; gradients: the largest of them); a row each."""
    from mambalearn.testing import rel_error

    outs, keep = {}, {}
    for name, fn in check_fns.items():
        try:
            t = time.time()
            outs[name] = fn()
            if run.gpu:
                torch.cuda.synchronize()
            if name == "mamba_ssm":
                run.keep(part=part, shape=shape, variant=name, tune_s=time.time() - t)
        except Exception as e:  # noqa: BLE001 - a variant that fails is a row
            run.keep(part=part, shape=shape, variant=name, check="error",
                     error=f"{type(e).__name__}: {str(e)[:300]}")
    want = outs.get(base)
    if want is None:
        return {}
    for name, got in outs.items():
        err = (max(rel_error(a.float(), b.float()) for a, b in zip(got, want, strict=True))
               if grads else rel_error(got.float(), want.float()))
        ok = name == "mamba_ssm" or err <= tol
        run.keep(part=part, shape=shape, variant=name, check="ok" if ok else "WRONG",
                 rel_to_base=err)
        if ok:
            keep[name] = fns[name]
    return keep


def case(run, mamba, path, b, l):
    """One (path, point): mamba_ssm tuned on its first call here, each variant checked, then all
    timed side by side; at b1 fwd+bwd, the kernels of each side under torch.profiler."""
    from bench.gpu.batch_one_ssd import clear_autotuners, kernel_times

    part = "fwd+bwd" if path == "bwd" else "fwd"
    shape = f"b{b} l{l}" if run.gpu else "toy"
    if not run.has(path):
        return run.keep(part=part, shape=shape, error="skipped: time limit")
    if mamba is not None:
        clear_autotuners(PREFIX)  # tuned on this (shape, path)'s first call
    make, base, tol = ((bwd_fns, BWD_BASE, GRAD_TOL) if path == "bwd" else
                       (fwd_fns, "default", OUT_TOL))
    slow_args, slow_kw = inputs(b, l, run.smoke, slow=True)
    args, kw = inputs(b, l, run.smoke)
    fns = checked(run, part, shape, make(slow_args, slow_kw, run.smoke, mamba),
                  make(args, kw, run.smoke, mamba), base, tol, grads=path == "bwd")
    del slow_args, slow_kw
    compared(run, part, shape, fns, base)
    if run.gpu and path == "bwd" and b == 1 and run.left() > NEED["fwd"] + 10:
        for name in ("mamba_ssm", BWD_BASE, "default (rules)"):
            if name in fns:
                run.keep(part="profile", shape=shape, variant=name,
                         kernels=json.dumps(kernel_times(fns[name])))
    del args, kw, fns
    if run.gpu:
        torch.cuda.empty_cache()


def table(rows):
    """The timed rows (≤ 30 lines; of the forward sweep only the variants faster than the
    default, the slower ones named on one line a shape), then errors and wrong variants."""
    lines = [f"{'part':<8}{'shape':<12}{'variant':<30}{'ms':>8}{'vs':>7}{'±':>6}{'vs_base':>8}"]
    f = lambda r, k, fmt: fmt.format(r[k]) if r.get(k) is not None else "-"
    slower = {}
    for r in rows:
        if ("ms" in r and r["part"] == "fwd" and r["variant"] != "mamba_ssm"
                and r.get("vs_base", 0) >= 1.0):
            slower.setdefault(r["shape"], []).append(r["variant"])
        elif "ms" in r:
            lines.append(f"{r['part']:<8}{r['shape']:<12}{r['variant'][:29]:<30}{r['ms']:>8.4f}"
                         f"{f(r, 'vs', '{:.3f}'):>7}{f(r, 'vs_spread', '{:.2f}'):>6}"
                         f"{f(r, 'vs_base', '{:.3f}'):>8}")
    lines += [f"fwd {shape}: not faster than the default: {', '.join(names)}"[:160]
              for shape, names in slower.items()]
    bad = [r for r in rows if "error" in r or r.get("check") == "WRONG"]
    lines += [json.dumps(r)[:200] for r in bad]
    return "\n".join(lines[:30] + ([f"… {len(lines) - 30} more lines"] if len(lines) > 30 else []))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=200.0, help="seconds for the whole run")
    ap.add_argument("--prewarm", type=float, default=58.0, help="seconds for the prewarm at most")
    ap.add_argument("--workers", type=int, default=min(14, max(1, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--parts", default="bwd,fwd", help="bwd, fwd (in this order)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"), help="results folder")
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes, interpreter: a test")
    args = ap.parse_args(argv)
    # mamba_ssm tunes in this process on the call timed, never from Triton's autotune disk cache
    os.environ["TRITON_CACHE_AUTOTUNING"] = "0"
    if not torch.cuda.is_available() and not args.cpu_smoke:
        raise SystemExit("no GPU: run with --cpu-smoke for the control flow at toy sizes")
    global T0
    T0 = time.time()
    run = Run(args.limit, args.cpu_smoke)
    print(torch.cuda.get_device_name() if run.gpu else "CPU smoke run (interpreter)", flush=True)
    parts = args.parts.split(",")
    if run.gpu and args.prewarm > 0:
        if run.left() >= NEED["prewarm"]:
            prewarm(run, args.workers, min(args.prewarm, run.left() - 120))
        else:
            run.keep(part="prewarm", error="skipped: time limit")
    mamba = None
    if run.gpu:
        from course.bench.ssd import load_mamba_ssm_ssd

        mamba = load_mamba_ssm_ssd()
    for path, (b, l) in CASES if run.gpu else [("bwd", (1, 1)), ("fwd", (1, 1))]:
        if path in parts:
            case(run, mamba, path, b, l)
    from bench.gpu.record import peer_versions, record

    path = record(TOPIC, run.rows, command="python3 -m bench.gpu.ssd_b1 " + " ".join(argv),
                  peers=peer_versions(), out_dir=args.out, method=METHOD,
                  config_rules="mambalearn.mamba2.config.gpu_config (132 SMs)")
    print(f"\n== {time.time() - T0:.0f} s, {len(run.rows)} rows: {path}\n" + table(run.rows),
          flush=True)
    return run.rows


if __name__ == "__main__":
    main()
