"""Device script: Mamba-3 SISO launch variants, each checked, then timed against mamba_ssm.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.m3_siso --limit 150 --out $OUT
    python3 -m bench.gpu.m3_siso --cpu-smoke --out /tmp/m3s   (the control flow, toy sizes, CPU)

``mamba3_siso_combined`` at b8 l2048 and b1 l32768 (h32 g1 n128 p64 na32, chunk 64, bf16, D and
Z), the forward alone (under ``torch.no_grad()``) and forward+backward, **each (shape, path) in a
fresh Python process** as ``bench.gpu.peers`` runs them (its helpers, imported): the process's
first call is mamba_ssm's with its full autotune, so it tunes on the call timed and nothing else
(TRITON_CACHE_AUTOTUNING=0). Then in that process:

1. every variant of ours (``VARIANTS``: a ``mambalearn.mamba3.config.Config`` change each) and
   the default are checked on fresh leaves against mamba_ssm (output, and every gradient for
   fwd+bwd; random upstream gradient) and each variant against the default: a variant past
   ``bench.gpu.peers.TOL`` is a row saying so, and is not timed;
2. mamba_ssm, the default and the variants that passed are timed in one
   ``mambalearn.timing.compare`` (each warmed ≥ 1 s, 5 interleaved rounds, 50 ms each; ratio =
   median of the per-round ratios; against mamba_ssm and against the default).

First ``bench.gpu.peers.prewarm`` compiles mamba_ssm's autotune configs at these calls in
parallel processes, and ``--ours-workers`` more compile our variants (``--prewarm`` seconds at
most, then the fresh processes compile what is left). The cases run in the order b8 fwd,
b8 fwd+bwd, b1 fwd, b1 fwd+bwd; one starts only while
``--limit`` leaves it ``NEED`` seconds (else a row says it was skipped), and a process times as
many of ours (in ``VARIANTS``' order, the default first) as its time left allows (a row names
those left out). Expected on an H200 whose Triton cache already holds mamba_ssm's configs (a
``bench.gpu.peers`` run earlier in the call): ≈ 60 s a forward case, ≈ 90 s a fwd+bwd case
(its autotuner benchmarks 234 configs); so ``--limit 150`` covers b8 l2048 and ``--limit 330``
all four. Rows: one per
(variant, shape, path), written to ``$OUT/<device>_m3_siso_<date>.json`` through
``bench.gpu.record``; a short table last. What each variant is for, and the floors:
bench/NOTES_mamba3.md ("2026-12-03: the forward's launches").
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
if __name__ == "__main__" and "--cpu-smoke" in sys.argv:  # the interpreter, even beside a GPU
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

import mambalearn.device  # noqa: E402,F401  (on a CPU: TRITON_INTERPRET=1 before Triton)
from bench.gpu import peers as P  # noqa: E402

# name -> the Config fields it changes (the default is "default": no change)
# (sm_90 builds and predictions: bench/NOTES_mamba3.md; dropped before the run, by their builds:
# the walk at 32 columns, the outputs at 16 columns unrolled (178 registers: still 2 an SM), at
# 8 warps (one program an SM), dv capped at 168 registers (296-392 B of stack), dq/dk capped at
# 168 (568 B at 32 heads a program, 592 at 8) or with one pipeline stage (184 B))
VARIANTS = {
    "walk n64": dict(forward_launches=2, walk_col_block=64),
    "walk n64 w8": dict(forward_launches=2, walk_col_block=64, walk_warps=8),
    "out loop": dict(output_unroll=2),
    "out loop n16": dict(output_unroll=2, output_col_block=16),
    "out reg168": dict(output_maxnreg=168),
    "stages4": dict(state_stages=4),
    "walk n64 out loop n16": dict(forward_launches=2, walk_col_block=64, output_unroll=2,
                                  output_col_block=16),
    # the backward's kernels (fwd+bwd only): the state gradients and passing in one reverse walk;
    # dv's column blocks as a loop; dq/dk over 8 heads a program (4× the programs, float32
    # partial sums) or 64 columns at 8 warps (A formed half as often)
    "back walk n32": dict(state_grad_launches=1),
    "back walk n64 w8": dict(state_grad_launches=1, walk_col_block=64, walk_warps=8),
    "dv loop": dict(bwd_v_unroll=2),
    "qk hpp8": dict(heads_per_program=8),
    "qk n64 w8": dict(col_block=64, output_col_block=32, bwd_v_col_block=32, bwd_qk_warps=8),
    # the whole forward in one launch (``mambalearn.mamba3.walk``): a program per P_BLK channels
    # of a (batch, head) walks the chunks (also the grad path's forward); no spill in any of
    # these sm_90 builds (bench/NOTES_mamba3.md, "the forward in ONE launch")
    "one p16": dict(forward_launches=1, walk1_p_block=16, walk1_col_block=32),
    "one p16 w8": dict(forward_launches=1, walk1_p_block=16, walk1_col_block=32, walk1_warps=8),
    "one p32": dict(forward_launches=1, walk1_p_block=32, walk1_col_block=16),
    "one p32 w8": dict(forward_launches=1, walk1_p_block=32, walk1_col_block=16, walk1_warps=8),
    "one p64 w8": dict(forward_launches=1, walk1_p_block=64, walk1_col_block=16, walk1_warps=8),
    "all": dict(forward_launches=2, walk_col_block=64, walk_warps=8, output_unroll=2,
                output_col_block=16, state_grad_launches=1, bwd_v_unroll=2),
}
BACKWARD_ONLY = ("back walk n32", "back walk n64 w8", "dv loop", "qk hpp8", "qk n64 w8")
FORWARD_ONLY = ("out reg168", "stages4")  # not timed in fwd+bwd (time: the limit)
CASES = [((8, 2048), "fwd"), ((8, 2048), "fwd+bwd"), ((1, 32768), "fwd"), ((1, 32768), "fwd+bwd")]
NEED = {"fwd": (35, 15), "fwd+bwd": (60, 25)}  # seconds a case needs at least (GPU, CPU)
SECONDS_TIMED = 1.6  # a callable's share of a compare, GPU
METHOD = ("mambalearn.timing.compare in one process per (shape, path): every callable warmed "
          ">= 1 s, then 5 interleaved rounds of triton.testing.do_bench (median, 50 ms each); ms = "
          "median over rounds; ratio = median of the per-round ratios variant / mamba_ssm, "
          "vs_default = the same against our default, spread = (max - min) / median of the "
          "ratios to mamba_ssm. mamba_ssm's full autotune tuned on the call timed (its first "
          "call in the process; TRITON_CACHE_AUTOTUNING=0). fwd = under torch.no_grad() on inputs "
          "not requiring grad; fwd+bwd = out.backward(ones). bf16 Q/K/V/Z/Trap/Angles, fp32 "
          "ADT/DT/biases/D, chunk 64. 'check' rows: rel. errors of each of ours against "
          "mamba_ssm and of each variant against the default on fresh leaves (random upstream "
          "gradient); a variant past bench.gpu.peers.TOL is not timed.")


def ours_with(changes, shape, device):
    """Our ``mamba3_siso_combined`` at the default config for ``shape`` changed by ``changes``."""
    from mambalearn.mamba3 import mamba3_siso_combined
    from mambalearn.mamba3.config import default_config

    cfg = default_config(shape, device).replace(**changes)
    return functools.partial(mamba3_siso_combined, config=cfg)


def errors(got, want):
    """{rel_err_<name>: ‖got − want‖/‖want‖} and the names past ``peers.TOL``."""
    errs = {f"rel_err_{k}": P.rel(got[k], v) for k, v in want.items() if k in got}
    bad = [k[8:] for k, e in errs.items() if not e < P.TOL["out" if k == "rel_err_out" else "grad"]]
    return errs, bad


def case(run, point, path, peer, names):
    """One (shape, path) in this process: tune the peer, check, time; rows kept in ``run``."""
    from bench.gpu.batch_one_ssd import autotuners
    from mambalearn.timing import compare

    smoke = run.smoke
    chunk = P.SMOKE["chunk"] if smoke else P.M3_CHUNK
    d = P.m3_dims(point, smoke)
    kw = P.m3_inputs(point, path, smoke)
    dev = kw["V"].device
    label = dict(op=f"m3_siso {path}", shape="b{b} l{l} h{h} p{p} n{n} ".format(**d)
                 + ("bf16" if kw["V"].dtype == torch.bfloat16 else "fp32"))
    shape = (d["b"], d["l"], d["h"], d["g"], d["n"], d["p"], d["na"], chunk)
    sides = {"default": ours_with({}, shape, dev)}
    skip = BACKWARD_ONLY if path == "fwd" else FORWARD_ONLY
    sides.update({v: ours_with(VARIANTS[v], shape, dev) for v in names if v not in skip})
    sync = torch.cuda.synchronize if run.gpu else (lambda: None)
    g = torch.Generator(device=dev).manual_seed(1)
    dout = torch.randn(kw["V"].shape, generator=g, device=dev).to(kw["V"].dtype)
    # ours first (each variant against the default: compiles them, and a slow peer tuning
    # below still leaves these rows), then the peer's first call, which its autotuner tunes on
    mine, ok = {}, []
    for name, fn in sides.items():
        try:
            mine[name] = P.m3_results(fn, kw, path, chunk, dout)
            row, bad = {}, []
            if name != "default":
                e, bad = errors(mine[name], mine["default"])
                row = {f"{k}_vs_default": float(v) for k, v in e.items()}
            run.keep(**label, variant=name, check="FAILED: " + ", ".join(
                f"{x} vs default" for x in bad) if bad else "ok", **row)
            if not bad:
                ok.append(name)
        except Exception as e:  # noqa: BLE001 - a variant that fails is a row, not the end
            traceback.print_exc()
            run.keep(**label, variant=name, check=f"FAILED: {type(e).__name__}: {str(e)[:200]}")
    fns = {}
    if peer is not None:
        fns["mamba_ssm"] = P.m3_call(peer, kw, path, chunk)
        t = time.time()
        fns["mamba_ssm"]()
        sync()
        run.keep(**label, variant="mamba_ssm", tune_s=time.time() - t)
        for at in autotuners(P.M3_PREFIX):
            for cfg in at.cache.values():
                run.keep(**label, variant="mamba_ssm tuning", kernel=at.base_fn.__name__,
                         config=str(cfg))
        theirs = P.m3_results(peer, kw, path, chunk, dout)
        for name in list(ok):
            e, bad = errors(mine[name], theirs)
            run.keep(**label, variant=name, check="FAILED: " + ", ".join(
                f"{x} vs mamba_ssm" for x in bad) if bad else "ok",
                **{f"{k}_vs_mamba_ssm": float(v) for k, v in e.items()})
            if bad:
                ok.remove(name)
        del theirs
    del mine
    if run.gpu:
        torch.cuda.empty_cache()
    # as many of ours as the limit leaves time to time (each ≈ 1 s warm + 5 × 50 ms), in order
    fit = max(1, int((run.left() - 8) / SECONDS_TIMED)) - len(fns) if run.gpu else len(ok)
    for name in ok[max(fit, 1):]:
        run.keep(**label, variant=name, error="not timed: time limit")
    fns.update({name: P.m3_call(sides[name], kw, path, chunk) for name in ok[:max(fit, 1)]})
    c = compare(fns, warm_s=1.0 if run.gpu else 0.0, rounds=5 if run.gpu else 1, rep=50)
    for name in fns:
        r = c.ratio(name, "mamba_ssm") if "mamba_ssm" in fns else (None, None)
        vd = c.ratio(name, "default")[0] if "default" in fns else None
        run.keep(**label, variant=name, backend="mamba_ssm" if name == "mamba_ssm" else "ours",
                 ms=c.ms(name), ratio=r[0], spread=r[1], vs_default=vd,
                 changes=json.dumps(VARIANTS.get(name, {})))


def compile_ours(names, point, paths, smoke):
    """A prewarm worker: our kernels of each variant in ``names`` compiled into Triton's disk
    cache by one call per path at ``point`` (b, l): the fresh processes then load them (neither
    b nor l is compiled in, but the dq/dk kernel's heads a program follow from them, and both
    cases give the same). (None, or the error.)"""
    try:
        chunk = P.SMOKE["chunk"] if smoke else P.M3_CHUNK
        for path in paths:
            kw = P.m3_inputs(point, path, smoke)
            d = P.m3_dims(point, smoke)
            shape = (d["b"], d["l"], d["h"], d["g"], d["n"], d["p"], d["na"], chunk)
            for name in names:
                P.m3_call(ours_with(VARIANTS.get(name, {}), shape, kw["V"].device), kw, path,
                          chunk)()
        if torch.cuda.is_available() and not smoke:
            torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001 - a failing compile is a row, not the end of the run
        return f"{type(e).__name__}: {str(e)[:300]}"


def prewarm(run, todo, names, args):
    """Our variants compiled in ``--ours-workers`` processes while ``peers.prewarm`` compiles
    mamba_ssm's configs (and our default) in its own; at most ``--prewarm`` seconds in all."""
    import concurrent.futures as cf
    import multiprocessing as mp

    t = time.time()
    paths = list(dict.fromkeys(path for _, path in todo))
    names = names[:1] if run.smoke else names  # the interpreter compiles nothing: the flow
    k = max(1, min(args.ours_workers, len(names)))
    pool = cf.ProcessPoolExecutor(max_workers=k, mp_context=mp.get_context("spawn"))
    futures = [pool.submit(compile_ours, names[i::k], todo[0][0], paths, run.smoke)
               for i in range(k)]
    P.prewarm(run, todo, args.workers if run.gpu else 1, args.prewarm)
    done, _ = cf.wait(futures, timeout=max(0.0, args.prewarm - (time.time() - t)))
    for f in done:
        if f.result():
            run.keep(op="prewarm", backend="ours (variants)", error=f.result())
    if len(done) < len(futures):
        for proc in list(pool._processes.values()):
            proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    run.keep(op="prewarm", backend="ours (variants)", jobs=len(futures), done=len(done),
             seconds=time.time() - t)


def child(args):
    """The body of one fresh process: ``--child B,L --path P``; rows to ``--rows``."""
    run = P.Run(args.limit, args.cpu_smoke, rows_file=args.rows)
    point = tuple(int(v) for v in args.child.split(","))
    P.log(f"m3_siso {args.path} b{point[0]} l{point[1]}: a fresh process")
    peer = P.load_m3_peer(run)
    case(run, point, args.path, peer, args.variants)


def cases(run, todo, names):
    """Each (point, path) of ``todo`` in a fresh process, while the limit leaves it time."""
    for point, path in todo:
        shape = f"b{point[0]} l{point[1]}"
        if run.left() < NEED[path][0 if run.gpu else 1]:
            run.keep(op=f"m3_siso {path}", shape=shape, error="skipped: time limit")
            continue
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as rows_file:
            cmd = [sys.executable, "-m", "bench.gpu.m3_siso", "--child", f"{point[0]},{point[1]}",
                   "--path", path, "--rows", rows_file.name, "--limit", str(run.left()),
                   "--variants", ",".join(names)] + (["--cpu-smoke"] if run.smoke else [])
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
            try:
                rc = subprocess.run(cmd, cwd=ROOT, env=env,
                                    timeout=max(1.0, run.left() - 3)).returncode
            except subprocess.TimeoutExpired:
                rc = "cut by the time limit"
            for line in rows_file.read().splitlines():  # (already printed by the child)
                run.rows.append(json.loads(line))
        if rc != 0:
            run.keep(op=f"m3_siso {path}", shape=shape, error=f"process ended with {rc}")


def table(rows):
    """The short table: a line per variant, a column per (shape, path) with ms and the ratio to
    mamba_ssm (× default where there is no peer); then the failed checks and errors."""
    timed = [r for r in rows if "ms" in r]
    cols = list(dict.fromkeys((r["shape"].split(" h")[0], r["op"][8:]) for r in timed))
    names = list(dict.fromkeys(r["variant"] for r in timed))
    at = {(r["variant"], r["shape"].split(" h")[0], r["op"][8:]): r for r in timed}
    lines = [f"{'ms (× mamba_ssm)':<21}" + "".join(f"{s + ' ' + p:>18}" for s, p in cols)]
    for name in names:
        cells = []
        for s, p in cols:
            r = at.get((name, s, p))
            ratio = None if r is None else r.get("ratio", r.get("vs_default"))
            cells.append("-" if r is None else f"{r['ms']:.3f} ({ratio:.2f})" if ratio is not None
                         else f"{r['ms']:.3f}")
        lines.append(f"{name[:20]:<21}" + "".join(f"{c:>18}" for c in cells))
    for r in rows:
        if "error" in r or str(r.get("check", "ok")) != "ok":
            lines.append(json.dumps(r, ensure_ascii=False)[:300])
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=150.0, help="seconds for the whole run")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"), help="results folder")
    ap.add_argument("--cases", default=None, help="e.g. 8x2048:fwd,1x32768:fwd+bwd (default: "
                    "all four, b8 first)")
    ap.add_argument("--variants", default=list(VARIANTS), help="names from VARIANTS, comma "
                    "separated", type=lambda v: [x for x in v.split(",") if x])
    ap.add_argument("--prewarm", type=float, default=45.0, help="seconds at most for compiling "
                    "mamba_ssm's autotune configs (and our default) in parallel first "
                    "(bench.gpu.peers.prewarm; fast when Triton's cache holds them); 0: none")
    ap.add_argument("--workers", type=int, default=min(11, max(1, (os.cpu_count() or 2) - 5)),
                    help="processes compiling mamba_ssm's configs in the prewarm")
    ap.add_argument("--ours-workers", type=int, default=4,
                    help="processes compiling our variants in the prewarm, beside them")
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes, interpreter: a test")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, choices=P.M3_PATHS, help=argparse.SUPPRESS)
    ap.add_argument("--rows", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    os.environ["TRITON_CACHE_AUTOTUNING"] = "0"  # each process tunes mamba_ssm for itself
    P.T0 = time.time()  # peers.Run's clock starts with this process
    if args.child:
        return child(args)
    if not torch.cuda.is_available() and not args.cpu_smoke:
        raise SystemExit("no GPU: run with --cpu-smoke for the control flow at toy sizes")
    run = P.Run(args.limit, args.cpu_smoke)
    P.log(torch.cuda.get_device_name() if run.gpu else "CPU smoke run (Triton's interpreter)")
    todo = CASES
    if args.cases:
        todo = [(tuple(int(x) for x in c.split(":")[0].split("x")), c.split(":")[1])
                for c in args.cases.split(",")]
    if run.smoke:  # the toy point, both paths
        todo = [(P.SMOKE["m3"][0], path) for path in dict.fromkeys(p for _, p in todo)]
    if args.prewarm > 0 and run.left() > args.prewarm + NEED["fwd"][0 if run.gpu else 1]:
        prewarm(run, todo, args.variants, args)
    cases(run, todo, args.variants)
    from bench.gpu.record import record

    path = record("m3_siso", run.rows, command="python3 -m bench.gpu.m3_siso " + " ".join(argv),
                  peers=P.peers_meta(run),
                  out_dir=args.out, method=METHOD, baseline="mamba_ssm",
                  variants=json.dumps(VARIANTS))
    print(f"\n== {time.time() - P.T0:.0f} s, {len(run.rows)} rows: {path}\n" + table(run.rows),
          flush=True)
    return run.rows


if __name__ == "__main__":
    main()
