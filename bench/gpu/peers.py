"""Device script: the peers timed as their users run them, each tuned for the very call timed.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.peers [--limit 300] [--out $OUT]
    python3 -m bench.gpu.peers --cpu-smoke --out /tmp/peers   (the control flow, toy sizes, CPU)

1. **step**: the decode step, ours (``mambalearn.mamba2.step.selective_state_update``) against
   mamba_ssm's ``selective_state_update`` (its source tree, ``course.bench.step``), at b1 and
   b64 h80 p64 n128, fp32 state, bf16 x/B/C, fp32 A/D/dt_bias broadcast per head as Mamba-2's
   step passes them (``mamba2_step_inputs``), softplus — **without z** (Mamba-2's step: its gate
   is in the norm) and **with z** (b, h, p) bf16 (as Mamba-1's step calls it). Each side checked
   against the float64 oracle (``inference.decode_step``: output and new state), then timed as
   one call per CUDA graph and as 20 calls per graph (ms a call), the four graphs interleaved in
   one ``timing.compare``; then each kernel alone: ``torch.profiler`` over replays of the one-call
   graphs (the kernel's own device time; eager calls if the profiler sees no kernel in a graph).
2. **prewarm**: every autotune config of mamba_ssm's Mamba-3 kernels, and our Mamba-3 kernels,
   compiled in ``--workers`` spawned processes sharing Triton's disk cache, at exactly the
   (shape, path) calls step 3 times (each worker a slice of each autotuner's configs, as
   ``bench.gpu.batch_one_ssd``'s prewarm, whose autotuner helpers it uses). Nothing is timed.
3. **mamba3**: ``mamba3_siso_combined``, ours against mamba_ssm's **with its full autotune**
   (``course.bench.mamba3.load``), b8 l2048 and b1 l32768 (h32 g1 n128 p64 na32, chunk 64,
   bf16, D and Z), the forward alone and forward+backward, **each (shape, path) in a fresh Python
   process**: its first call is the call timed, so mamba_ssm's autotuner is tuned on it and on
   nothing else (its key holds neither batch nor length, and its forward's holds whether the
   forward stores for a backward; Triton's autotune disk cache is off: TRITON_CACHE_AUTOTUNING=0).
   The forward runs under ``torch.no_grad()`` on inputs that need no grad: inference, as
   mamba_ssm's ``generate`` runs it (under ``torch.inference_mode``, where its autograd function
   likewise stores nothing for a backward); fwd+bwd is ``out.backward(ones)`` with every input
   requiring grad. After the tuning call, ours and mamba_ssm's are checked against each other
   on fresh leaves (output, and every gradient for fwd+bwd, a random upstream gradient), then
   timed. The order: the forward at both shapes, then fwd+bwd at both.

Every ratio is ``mambalearn.timing.compare``'s: each callable warmed ≥ 1 s, then 5 interleaved
rounds of ``do_bench`` (median, 50 ms each); ratio = the median of the per-round ratios ours /
mamba_ssm (below 1: ours faster), spread = (max − min) / median of them. A part starts only
while ``--limit`` leaves it the time it needs (a row says what was skipped); rows are printed as
they come; ``$OUT/<device>_peers_<date>.json`` is written through ``bench.gpu.record`` and a
short table printed last. ``--cpu-smoke``: the same control flow at toy sizes in Triton's
interpreter (a peer that cannot run there is skipped, with a row saying so): a test of this
script, not a measurement.

Expected on a fresh H200 (an estimate, from sm_90 builds of mamba_ssm's kernels on a CPU: 0.5–5 s
of CPU each, ≈ 300–400 s for its 261 configs): step ≈ 40 s; prewarm ≈ 50–70 s on 15 workers
(cut at ``--prewarm`` s); each forward process ≈ 15 s and each fwd+bwd process ≈ 50 s (its
autotuner benchmarks 234 configs, ≈ 0.13 s each) — ≈ 4 min in all. What does not fit is skipped
with a row (the last, b1 l32768 fwd+bwd, first); ``--parts mamba3 --points 1x32768 --paths
fwd+bwd`` runs it alone.
"""

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
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
from bench.gpu.record import Run as RunBase  # noqa: E402

T0 = time.time()
STEP_SHAPES = [(1, 80, 64, 128), (64, 80, 64, 128)]  # (b, h, p, n)
STEP_CALLS = (1, 20)  # calls a CUDA graph
M3_POINTS = [(8, 2048), (1, 32768)]  # (b, l) at course.bench.mamba3.SHAPE's h, g, n, p, na
M3_PATHS = ("fwd", "fwd+bwd")
M3_CHUNK = 64
M3_PREFIX = "mamba_ssm.ops.triton.mamba3"  # the modules whose autotuners the prewarm slices
# the toy sizes of --cpu-smoke (Triton's interpreter: about 0.1 ms a scanned element)
SMOKE = dict(step=[(1, 2, 4, 8)], calls=(1, 2), m3=[(1, 20)], chunk=16,
             m3_dims=dict(h=1, g=1, n=8, p=8, na=2))
# seconds a part needs at least (GPU, CPU): it starts only while the limit leaves that much; the
# prewarm runs at most until RESERVE seconds are left, for the timing processes
NEED = {"step": (15, 3), "prewarm": (130, 15), "fwd": (25, 15), "fwd+bwd": (70, 20)}
RESERVE = (100, 10)
# ours against mamba_ssm (‖ours − theirs‖ / ‖theirs‖): both are within 2e-2 (output) and 5e-2
# (gradients) of the float64 oracle in tests/test_mamba3_triton.py; the step reads bf16 x/B/C
TOL = {"out": 2e-2, "grad": 1e-1, "step": 1e-2}
METHOD = (
    "mambalearn.timing.compare: every callable warmed >= 1 s, then 5 interleaved rounds of "
    "triton.testing.do_bench (median, 50 ms each); ms = the median over the rounds; ratio = the "
    "median of the per-round ratios ours / mamba_ssm, spread = (max - min) / median of them. "
    "step: fp32 state, bf16 x/B/C (and z: 'with z' rows), fp32 A/D/dt_bias broadcast per head "
    "(Mamba-2's step), softplus; 'step graph1' = one call a CUDA graph, 'step graph20' = 20 calls "
    "a graph, ms a call (do_bench clears L2 before each replay); 'step kernel' = the kernel's own "
    "device time under torch.profiler over replays of the one-call graph (eager calls where the "
    "profiler saw no kernel in the graph); 'step check' = rel. error of the output and the new "
    "state against inference.decode_step in float64. mamba3: mamba3_siso_combined, bf16 "
    "Q/K/V/Z/Trap/Angles, fp32 ADT/DT/biases/D, chunk 64, each (shape, path) in a fresh process "
    "whose first call is the call timed (mamba_ssm's full autotune tuned on it: tuned_on; "
    "TRITON_CACHE_AUTOTUNING=0), after a parallel prewarm that compiled every config at those "
    "calls; fwd = under torch.no_grad() on inputs not requiring grad (inference, as mamba_ssm's "
    "generate runs under torch.inference_mode); fwd+bwd = out.backward(ones), every input "
    "requiring grad (grads accumulate in .grad); tune_s = seconds of the tuning call; "
    "'mamba3 ... check' = ours against mamba_ssm on fresh leaves after the tuning call "
    "(rel. errors, random upstream gradient).")


class Run(RunBase):
    """``bench.gpu.record.Run`` with this script's clock and the parts' needs (``NEED``)."""

    def __init__(self, limit, smoke, rows_file=None):
        super().__init__(limit, smoke, T0, rows_file)

    def has_time(self, part):
        return self.left() >= NEED[part][0 if self.gpu else 1]


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def rel(a, b):
    """‖a − b‖ / ‖b‖ in float64."""
    from mambalearn.testing import rel_error

    return rel_error(a, b)


def dev(run):
    return "cuda" if run.gpu else "cpu"


# --------------------------------------------------------------------------------------------
# 1. the decode step
def step_inputs(b, h, p, n, with_z, device, seed=0):
    """``mamba2_step_inputs`` (fp32 state, bf16 x/B/C, per-head A/D/dt_bias), with z (b, h, p)
    bf16 when ``with_z``."""
    from course.bench.step import mamba2_step_inputs

    inp = mamba2_step_inputs(b, h, p, n, torch.float32, device=device, seed=seed)
    if with_z:
        g = torch.Generator(device=device).manual_seed(seed + 1)
        inp["z"] = torch.randn(b, h, p, generator=g, device=device).to(torch.bfloat16)
    return inp


def graphed(fn, calls, gpu):
    """A callable replaying ``calls`` calls of ``fn`` captured in one CUDA graph (on a CPU: the
    calls in a loop)."""
    if not gpu:
        return lambda: [fn() for _ in range(calls)]
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return g.replay


def kernel_ms(fn, reps=200):
    """(ms a call, kernel names) of the GPU kernels ``fn`` runs, from ``torch.profiler``'s device
    times over ``reps`` calls (None when the profiler saw no kernel)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total, names = 0.0, []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)
        if t > 0 and not e.key.startswith(("cuda", "Memcpy", "Memset")):  # not runtime calls
            total += t
            names.append(e.key)
    return (total / reps / 1e3, " + ".join(sorted(names))) if names else (None, "")


def graphs_compared(sides, inp, calls, gpu, rep):
    """Each side's step (``fn(state, **args)``) captured k times into one CUDA graph for each k in
    ``calls``, every graph on its own copy of the state (the step updates it in place), and all
    of them timed interleaved by ``timing.compare``. Returns (eager calls by (side, k), graphs by
    "<side> graph<k>", the comparison)."""
    from mambalearn.timing import compare

    a = {k: v for k, v in inp.items() if k != "state"}
    eager, fns = {}, {}
    for k in calls:
        for name, fn in sides.items():
            s = inp["state"].clone()  # each graph updates its own copy of the state, in place
            eager[name, k] = lambda fn=fn, s=s: fn(s, **a)
            fns[f"{name} graph{k}"] = graphed(eager[name, k], k, gpu)
    c = compare(fns, warm_s=1.0 if gpu else 0.0, rounds=5 if gpu else 1, rep=rep)
    return eager, fns, c


def step_case(run, shape, with_z, peer, calls=STEP_CALLS):
    """One shape with or without z: the checks, the graphs timed interleaved, the kernels alone."""
    from course.bench.step import floor_ms
    from mambalearn import inference
    from mambalearn.mamba2.step import selective_state_update as ours

    b, h, p, n = shape
    inp = step_inputs(b, h, p, n, with_z, dev(run))
    a = {k: v for k, v in inp.items() if k != "state"}
    label = dict(shape=f"b{b} h{h} p{p} n{n} fp32 state", z="with z" if with_z else "without z")
    sides = {"ours": ours, **({"mamba_ssm": peer} if peer is not None else {})}
    s64 = inp["state"].double()
    want = inference.decode_step(s64, *(a[k].double() for k in ("x", "dt", "A", "B", "C", "D")),
                                 a["z"].double() if with_z else None, a["dt_bias"].double(), True)
    for name, fn in sides.items():
        s = inp["state"].clone()
        out = fn(s, **a)
        errs = dict(rel_err=rel(out, want), state_rel_err=rel(s, s64))
        run.keep(op="step check", **label, backend=name, **errs,
                 check="ok" if max(errs.values()) < TOL["step"] else "FAILED")
    eager, fns, c = graphs_compared(sides, inp, calls, run.gpu, rep=50)
    floor = floor_ms(b, h, p, n, torch.float32)
    for k in calls:
        for name in sides:
            r = c.ratio(f"ours graph{k}", f"mamba_ssm graph{k}") \
                if name == "ours" and peer is not None else (None, None)
            run.keep(op=f"step graph{k}", **label, backend=name, ms=c.ms(f"{name} graph{k}") / k,
                     ratio=r[0], spread=r[1], floor_ms=floor)
    if not run.gpu:
        return
    alone = {}
    for name in sides:  # the kernel alone: its device time in the profile
        ms, kernels = kernel_ms(fns[f"{name} graph1"])
        how = "profiler, graph replays"
        if ms is None:
            (ms, kernels), how = kernel_ms(eager[name, 1]), "profiler, eager calls"
        alone[name] = dict(ms=ms, kernel=kernels, timed=how)
    for name, r in alone.items():
        if r["ms"] is None:
            run.keep(op="step kernel", **label, backend=name, error="no kernel in the profile")
            continue
        theirs = alone.get("mamba_ssm", {}).get("ms")
        run.keep(op="step kernel", **label, backend=name, **r,
                 ratio=r["ms"] / theirs if name == "ours" and theirs else None)


def step_part(run):
    from course.bench.step import load_mamba_ssm_step

    peer = load_mamba_ssm_step() if run.gpu else None
    if peer is None:
        run.keep(op="step", backend="mamba_ssm", error="not timed: " + (
            "its source tree did not load (course.bench._reference printed why)" if run.gpu
            else "its launcher needs CUDA (torch.cuda.device)"))
    shapes, calls = (STEP_SHAPES, STEP_CALLS) if not run.smoke else (SMOKE["step"], SMOKE["calls"])
    for with_z in (True, False):  # with z first: the figure found wrong
        for shape in shapes:
            label = dict(shape="b{} h{} p{} n{} fp32 state".format(*shape),
                         z="with z" if with_z else "without z")
            if not run.has_time("step"):
                run.keep(op="step", **label, error="skipped: time limit")
                continue
            try:
                with torch.no_grad():
                    step_case(run, shape, with_z, peer, calls)
            except Exception as e:  # noqa: BLE001 - a row says what failed; the next case runs
                traceback.print_exc()
                run.keep(op="step", **label, error=f"{type(e).__name__}: {str(e)[:300]}")
            if run.gpu:
                torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------
# 3. Mamba-3 (the prewarm, 2., below: it compiles what these calls run)
def m3_dims(point, smoke):
    from course.bench.mamba3 import SHAPE

    b, l = point
    return dict(SMOKE["m3_dims"] if smoke else SHAPE, b=b, l=l)


def m3_inputs(point, path, smoke):
    from course.bench import mamba3 as M

    gpu = torch.cuda.is_available() and not smoke
    return M.inputs(**m3_dims(point, smoke), dtype=torch.bfloat16 if gpu else torch.float32,
                    device="cuda" if gpu else "cpu", grad=path == "fwd+bwd")


def m3_call(fn, kw, path, chunk):
    """The call timed: the forward under no_grad, or forward + ``out.backward(ones)``."""
    if path == "fwd":
        def forward():
            with torch.no_grad():
                return fn(**kw, chunk_size=chunk)
        return forward
    from course.bench.mamba3 import _fwd_bwd

    return _fwd_bwd(fn, kw, chunk)


def m3_results(fn, kw, path, chunk, dout):
    """Output (and every gradient) of one call on fresh leaves: {name: tensor}."""
    x = {k: v.detach().clone().requires_grad_(path == "fwd+bwd") for k, v in kw.items()}
    with torch.set_grad_enabled(path == "fwd+bwd"):
        out = fn(**x, chunk_size=chunk)
    got = {"out": out}
    if path == "fwd+bwd":
        out.backward(dout)
        got.update({f"d{k}": v.grad for k, v in x.items() if v.grad is not None})
    return got


def m3_case(run, point, path, peer, smoke):
    """One (shape, path): the tuning call, the check, the timing; rows kept in ``run``."""
    from bench.gpu.batch_one_ssd import autotuners
    from mambalearn.mamba3 import mamba3_siso_combined as ours
    from mambalearn.timing import compare

    chunk = SMOKE["chunk"] if smoke else M3_CHUNK
    d = m3_dims(point, smoke)
    kw = m3_inputs(point, path, smoke)
    label = dict(shape="b{b} l{l} h{h} p{p} n{n} ".format(**d) + str(kw["V"].dtype)[6:].replace(
        "bfloat16", "bf16").replace("float32", "fp32"), tuned_on=path)
    op = f"mamba3 {path}"
    fns = {"mamba_ssm": m3_call(peer, kw, path, chunk)} if peer is not None else {}
    fns["ours"] = m3_call(ours, kw, path, chunk)
    sync = torch.cuda.synchronize if run.gpu else (lambda: None)
    tune_s = {}
    for name, fn in fns.items():  # the first call: mamba_ssm's autotuner tunes on it
        t = time.time()
        fn()
        sync()
        tune_s[name] = time.time() - t
    if peer is not None:
        for at in autotuners(M3_PREFIX):
            for cfg in at.cache.values():
                run.keep(op=f"{op} tuning", **label, backend="mamba_ssm",
                         kernel=at.base_fn.__name__, config=str(cfg),
                         bench_s=float(getattr(at, "bench_time", 0.0)))
        g = torch.Generator(device=kw["V"].device).manual_seed(1)
        out_shape = kw["V"].shape
        dout = torch.randn(out_shape, generator=g, device=kw["V"].device).to(kw["V"].dtype)
        theirs = m3_results(peer, kw, path, chunk, dout)
        mine = m3_results(ours, kw, path, chunk, dout)
        errs = {f"rel_err_{k}": rel(mine[k], v) for k, v in theirs.items() if k in mine}
        bad = [k[8:] for k, e in errs.items() if e >= TOL["out" if k == "rel_err_out" else "grad"]]
        run.keep(op=f"{op} check", **label, backend="ours vs mamba_ssm",
                 check="FAILED: " + ", ".join(bad) if bad else "ok", **errs)
        del theirs, mine
    c = compare(fns, warm_s=1.0 if run.gpu else 0.0, rounds=5 if run.gpu else 1, rep=50)
    for name in fns:
        r = c.ratio("ours", "mamba_ssm") if name == "ours" and peer is not None else (None, None)
        run.keep(op=op, **label, backend=name, ms=c.ms(name), ratio=r[0], spread=r[1],
                 tune_s=tune_s[name] if name == "mamba_ssm" else None)


def load_m3_peer(run):
    """mamba_ssm's ``mamba3_siso_combined`` with its full autotune (None on a CPU: its forward
    allocates on CUDA and its backward needs it; the row says so)."""
    from course.bench import mamba3 as M

    if not run.gpu:
        run.keep(op="mamba3", backend="mamba_ssm", error="not timed: Triton's interpreter cannot "
                 "run its mamba3_siso_combined (CUDA allocator, backward)")
        return None
    peer = M.load(autotune="full")
    if peer is None:
        run.keep(op="mamba3", backend="mamba_ssm", error="not timed: its source tree did not "
                 "load (course.bench._reference printed why)")
    return peer


def m3_child(args):
    """The body of one fresh process: ``--m3-child B,L --path P``; rows to ``--rows``."""
    run = Run(args.limit, args.cpu_smoke, rows_file=args.rows)
    point = tuple(int(v) for v in args.m3_child.split(","))
    log(f"mamba3 {args.path} b{point[0]} l{point[1]}: a fresh process")
    peer = load_m3_peer(run)
    m3_case(run, point, args.path, peer, args.cpu_smoke)


def m3_part(run, cases):
    """Each (point, path) of ``cases`` in a fresh process, while the limit leaves it time."""
    for point, path in cases:
        name = f"mamba3 {path} b{point[0]} l{point[1]}"
        if not run.has_time(path):
            run.keep(op=f"mamba3 {path}", shape=f"b{point[0]} l{point[1]}",
                     error="skipped: time limit")
            continue
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as rows_file:
            cmd = [sys.executable, "-m", "bench.gpu.peers", "--m3-child", f"{point[0]},{point[1]}",
                   "--path", path, "--rows", rows_file.name, "--limit", str(run.left())]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
            try:
                rc = subprocess.run(cmd + (["--cpu-smoke"] if run.smoke else []), cwd=ROOT,
                                    env=env, timeout=max(1.0, run.left() - 5)).returncode
            except subprocess.TimeoutExpired:
                rc = "cut by the time limit"
            for line in rows_file.read().splitlines():  # (already printed by the child)
                run.rows.append(json.loads(line))
        if rc != 0:
            run.keep(op=f"mamba3 {path}", shape=f"b{point[0]} l{point[1]}",
                     error=f"{name}: process ended with {rc}")


# --------------------------------------------------------------------------------------------
# 2. the prewarm: compile every config of the peer's autotuners and our kernels, in parallel
def job_ours(cases, smoke):
    """Compile our Mamba-3 kernels for each (point, path) (one call each)."""
    from mambalearn.mamba3 import mamba3_siso_combined as ours

    for point, path in cases:
        m3_call(ours, m3_inputs(point, path, smoke), path,
                SMOKE["chunk"] if smoke else M3_CHUNK)()


def job_peer(i, n, cases):
    """Compile configs i, i + n, … of every mamba_ssm Mamba-3 autotuner at each (point, path),
    each tuned afresh (``clear_autotuners``), so every specialisation the run meets compiles."""
    from bench.gpu.batch_one_ssd import clear_autotuners, slice_autotuners
    from course.bench import mamba3 as M

    peer = M.load(autotune="full")
    if peer is None:
        raise RuntimeError("mamba_ssm's mamba3_siso_combined did not load")
    slice_autotuners(M3_PREFIX, i, n)
    for point, path in cases:
        clear_autotuners(M3_PREFIX)
        m3_call(peer, m3_inputs(point, path, False), path, M3_CHUNK)()
    torch.cuda.synchronize()


def _prewarm_job(name, arg):
    """Entry point of a prewarm worker: (job name, None or the error)."""
    try:
        {"ours": job_ours, "peer": job_peer}[name](*arg)
        return name, None
    except Exception as e:  # noqa: BLE001 - a failing job is a row, not the end of the run
        return name, f"{type(e).__name__}: {str(e)[:300]}"


def prewarm(run, cases, workers, seconds):
    """Our kernels in a worker a path, the peer's configs sliced over the others, at ``cases``;
    at most ``seconds`` (then the workers are ended and the timing processes compile the rest).
    """
    paths = list(dict.fromkeys(path for _, path in cases))
    jobs = [("ours", ([c for c in cases if c[1] == path], run.smoke)) for path in paths]
    if run.gpu:
        n = max(1, workers - len(paths))
        jobs += [("peer", (i, n, cases)) for i in range(n)]
    t, done = time.time(), 0
    pool = cf.ProcessPoolExecutor(max_workers=min(workers, len(jobs)),
                                  mp_context=mp.get_context("spawn"))
    futures = [pool.submit(_prewarm_job, name, arg) for name, arg in jobs]
    try:
        for f in cf.as_completed(futures, timeout=seconds):
            name, err = f.result()
            done += 1
            if err:
                run.keep(op="prewarm", backend=name, error=err)
        pool.shutdown()
    except cf.TimeoutError:  # end this run's workers (they would share the GPU with the timing)
        for proc in list(pool._processes.values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        run.keep(op="prewarm", error=f"cut at {seconds:.0f} s: {len(jobs) - done} jobs unfinished")
    run.keep(op="prewarm", backend="ours and mamba_ssm" if run.gpu else "ours", jobs=len(jobs),
             done=done, workers=min(workers, len(jobs)), seconds=time.time() - t)


# --------------------------------------------------------------------------------------------
def peers_meta(run):
    """{name: version} of the peers this run timed: mamba_ssm's from its source tree's folder
    (``mamba_ssm-<version>``, found as ``course.bench._reference`` finds it)."""
    from course.bench import _reference

    if not any(r.get("backend") == "mamba_ssm" and "ms" in r for r in run.rows):
        return {}
    root = os.path.abspath(os.environ.get("MAMBA_SSM_PATH") or _reference.DEFAULT)
    tree = os.path.basename(os.path.dirname(root))
    version = tree.removeprefix("mamba_ssm-") if tree.startswith("mamba_ssm-") else "not recorded"
    return {"mamba_ssm": f"{version} (its source tree: ops.triton.selective_state_update; "
                         "ops.triton.mamba3.mamba3_siso_combined with its full autotune)"}


def save(run, argv, out_dir):
    from bench.gpu.record import record

    return record("peers", run.rows, command="python3 -m bench.gpu.peers " + " ".join(argv),
                  peers=peers_meta(run), out_dir=out_dir, method=METHOD, baseline="mamba_ssm")


def table(rows):
    """The short table printed last: every timed row, then the checks that failed and errors."""
    lines = [f"{'op':<16}{'shape':<30}{'z / tuned on':<14}{'backend':<11}{'ms':>10}{'ratio':>8}"
             f"{'±':>7}"]
    for r in rows:
        if "ms" not in r:
            continue
        f = lambda k, fmt, r=r: fmt.format(r[k]) if r.get(k) is not None else "-"
        lines.append(f"{r['op']:<16}{r.get('shape', ''):<30}{r.get('z', r.get('tuned_on', '')):<14}"
                     f"{r['backend'][:10]:<11}{r['ms']:>10.5f}{f('ratio', '{:.3f}'):>8}"
                     f"{f('spread', '{:.3f}'):>7}")
    for r in rows:
        if "error" in r or str(r.get("check", "ok")) != "ok":
            lines.append(json.dumps(r, ensure_ascii=False)[:400])
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=300.0, help="seconds for the whole run")
    ap.add_argument("--parts", default="step,mamba3", help="step, mamba3 (with its prewarm)")
    ap.add_argument("--prewarm", type=float, default=110.0, help="seconds for the prewarm at most")
    ap.add_argument("--workers", type=int, default=min(15, max(1, (os.cpu_count() or 2) - 1)),
                    help="prewarm processes")
    ap.add_argument("--points", default=M3_POINTS, help="mamba3: b x l, e.g. 8x2048,1x32768",
                    type=lambda v: [tuple(int(x) for x in p.split("x")) for p in v.split(",")])
    ap.add_argument("--paths", default=M3_PATHS, type=lambda v: tuple(v.split(",")),
                    help="mamba3: fwd, fwd+bwd (each at every point, in this order)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"), help="results folder")
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes, interpreter: a test")
    ap.add_argument("--m3-child", default=None, help=argparse.SUPPRESS)  # "b,l": one process
    ap.add_argument("--path", default=None, choices=M3_PATHS, help=argparse.SUPPRESS)
    ap.add_argument("--rows", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if set(args.paths) - set(M3_PATHS):
        ap.error(f"--paths: each of {', '.join(M3_PATHS)}, got {','.join(args.paths)}")
    # every process of this run tunes mamba_ssm for itself, no autotune result read from disk
    # (the b1 l32768 process would reuse what the b8 l2048 one chose: the key holds neither);
    # the timing processes and the prewarm workers inherit it
    os.environ["TRITON_CACHE_AUTOTUNING"] = "0"
    if args.m3_child:
        return m3_child(args)
    if not torch.cuda.is_available() and not args.cpu_smoke:
        raise SystemExit("no GPU: run with --cpu-smoke for the control flow at toy sizes")
    global T0
    T0 = time.time()
    run = Run(args.limit, args.cpu_smoke)
    log(torch.cuda.get_device_name() if run.gpu else "CPU smoke run (Triton's interpreter)")
    parts = args.parts.split(",")
    if "step" in parts:
        step_part(run)
    if "mamba3" in parts:
        points = SMOKE["m3"] if run.smoke else args.points
        cases = [(pt, path) for path in args.paths for pt in points]  # the forwards first
        if run.has_time("prewarm") and args.prewarm > 0:
            prewarm(run, cases, args.workers if run.gpu else 1,
                    min(args.prewarm, run.left() - RESERVE[0 if run.gpu else 1]))
        else:
            run.keep(op="prewarm", error="skipped: time limit")
        m3_part(run, cases)
    path = save(run, argv, args.out)
    print(f"\n== {time.time() - T0:.0f} s, {len(run.rows)} rows: {path}\n" + table(run.rows),
          flush=True)
    return run.rows


if __name__ == "__main__":
    main()
