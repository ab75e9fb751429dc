"""Device script: SSD and Mamba-3 from batch 64 down to batch one against the peers, one H200 run.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.batch_one_ssd [--limit S] [--json FILE] [--commit C]
    python3 -m bench.gpu.batch_one_ssd --cpu-smoke     (the control flow at toy sizes, interpreter)

0. **prewarm**, ``--prewarm`` seconds at most, in ``--workers`` spawned processes: Triton
   compiles our kernels and every config of every peer autotuner at the shape classes this run
   times (each worker a slice of each autotuner's configs; the disk cache is shared), while one
   worker runs the GPU tests (``pytest -m gpu``: tests/test_past_2_31.py first, alone, then the
   SSD and Mamba-3 files). Nothing is timed there; their rows come back to this process.
1. **Mamba-3**: ``mamba3_siso_combined`` at b8 l2048 and b1 l32768 (h32 g1 n128 p64 na32, chunk
   64, bf16, D and Z): forward and fwd+bwd, ours against mamba_ssm **with its full autotune**
   (tuned in this process at the first shape, b8 l2048: its key holds neither batch nor length,
   so the second shape runs what the first chose, as in any process that runs both), our forward
   at the settings of ``M3_DESIGNS``, a kernel profile of both sides, our launches alone.
2. **SSD**: the fused forward (h80 p64 n128 g1 bf16, fp32 A/D/dt_bias, softplus) at the points of
   ``SSD_POINTS``: mamba_ssm's ``mamba_chunk_scan_combined`` (and with ``--fla`` FLA's
   ``chunk_simple_gla``, no D, inputs prepared outside the timing) at chunk 256, ours through
   the public path at chunk 256
   and at chunk 128 (its default config for each; each checked against chapter 10's kernels at
   the same chunk), at ``PART_POINTS`` the states launches of ``STATE_PARTS`` alone; fwd+bwd at
   ``BWD_POINTS`` (ours against mamba_ssm, chunk 256) after the first ``FIRST`` points.

Every ratio is ``timing.compare``'s: warm ≥ 1 s each, 5 interleaved rounds, the median of the
per-round ratios with its spread. Rows are printed as they come (JSON lines), a table last;
``--json`` writes them with the run's meta (device, date, command, commit, peers' versions).
A part starts only while ``--limit`` leaves it time (a row says what was skipped).
"""

import argparse
import concurrent.futures as cf
import datetime
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

import torch

T0 = time.time()
SSD_HEADS = dict(h=80, p=64, g=1, n=128)
SSD_CHUNK = 256  # what mamba_ssm's users pass (Mamba-2's chunk_size)
# the fixed-token sweep (b·l = 32 768 and 262 144) and b1 l16384, b1 l131072: the points nearest
# the target or not reached by the first run first; FIRST of them before the fwd+bwd rows
SSD_POINTS = [(1, 16384), (1, 32768), (2, 16384), (1, 131072), (2, 131072), (4, 65536),
              (8, 32768), (16, 16384), (64, 4096), (1, 262144), (4, 8192), (8, 4096), (16, 2048),
              (64, 512)]
FIRST = 4
PART_POINTS = [(1, 131072), (2, 131072)]  # (the states launch's tiles at small b·h)
BWD_POINTS = [(1, 16384), (16, 1024), (4, 4096)]
M3_SHAPE = dict(h=32, g=1, n=128, p=64, na=32)
M3_POINTS = [(8, 2048), (1, 32768)]
M3_CHUNK = 64
# the shape classes the prewarm compiles (Triton specialises an int on being 1 and on dividing by
# 16: mamba_ssm's SSD kernels take the batch, ours take chunk counts; Mamba-3's take neither)
SSD_WARM = [(1, 4096), (2, 4096)]  # every SSD point of the run but b16 l2048 and b64 l512
OURS_SSD_WARM = SSD_WARM + [(2, 1024)]  # + the fwd+bwd at b16 l1024 (4 chunks of 256)
M3_WARM = [(2, 2048)]
# our public path at these chunks (default config of each; chunk 256 is mamba_ssm's argument)
SSD_DESIGNS = {"ours q256": 256, "ours q128": 128}
# the states kernel alone at PART_POINTS: (name, chunk, changes of the default ``config.States``)
STATE_PARTS = [("states default", 256, {}), ("states 32x64 tiles", 256, dict(block_p=32)),
               ("states default", 128, {}), ("states 32x64 tiles", 128, dict(block_p=32))]
# Mamba-3 forward settings (``config.Config.replace`` changes)
M3_DESIGNS = {"ours": {}, "ours state_stages 1": dict(state_stages=1),
              "ours state_rows 4": dict(state_rows=4)}
ROWS = []


def row(**r):
    ROWS.append(r)
    print(json.dumps({k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()},
                     default=str), flush=True)
    return r


def left(limit):
    return limit - (time.time() - T0)


def gpu():
    return torch.cuda.is_available()


def dev():
    return "cuda" if gpu() else "cpu"


# --------------------------------------------------------------------------------------------
# sizes: on a CPU (``--cpu-smoke``) every point becomes a toy one
def ssd_heads():
    return SSD_HEADS if gpu() else dict(h=2, p=8, g=1, n=8)


def ssd_point(b, l):
    return (b, l) if gpu() else (min(b, 2), 64)


def chunks(q):
    return q if gpu() else q // 16  # the toy chunk


def m3_point(b, l):
    return dict(M3_SHAPE, b=b, l=l) if gpu() else dict(b=1, l=40, h=2, g=1, n=16, p=16, na=4)


def m3_chunk():
    return M3_CHUNK if gpu() else 16


def ssd_inputs(b, l, seed=0):
    from course.bench.ssd import make_inputs

    b, l = ssd_point(b, l)
    return make_inputs(b, l, **ssd_heads(), dtype=torch.bfloat16 if gpu() else torch.float32,
                       device=dev(), seed=seed)


def ssd_config(args, q, **changes):
    """The default SSD config for the inputs' shape at chunk ``q``, ``changes`` applied."""
    from mambalearn.mamba2.config import default_config

    (b, l, h, p), (g, n) = args[0].shape, args[3].shape[2:]
    return default_config((b, l, h, p, g, n, q), args[0].device).replace(**changes)


def m3_inputs(b, l, grad):
    from course.bench import mamba3 as M

    return M.inputs(**m3_point(b, l), dtype=torch.bfloat16 if gpu() else torch.float32,
                    device=dev(), grad=grad)


# --------------------------------------------------------------------------------------------
# the peers
def autotuners(prefix):
    """Every Triton autotuner of the loaded modules under ``prefix`` (module names)."""
    from triton.runtime.autotuner import Autotuner

    found = {}
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith(prefix):
            continue
        for obj in vars(mod).values():
            for _ in range(4):  # autotune / heuristics / jit wrappers
                if isinstance(obj, Autotuner):
                    found[id(obj)] = obj
                obj = getattr(obj, "fn", None)
    return list(found.values())


def slice_autotuners(prefix, i, n):
    """Keep configs i, i + n, … of every autotuner (a prewarm worker compiles its share)."""
    for at in autotuners(prefix):
        at.configs = at.configs[i::n] or at.configs[i % len(at.configs):][:1]


def clear_autotuners(prefix):
    """Forget every tuning result: the next call tunes again (a new shape, as a user's)."""
    for at in autotuners(prefix):
        at.cache.clear()


PREFIX = {"ssd": "mamba_ssm.ops.triton.ssd", "fla": "fla.", "m3": "mamba_ssm.ops.triton.mamba3"}


def peers():
    """(mamba_ssm SSD, FLA chunk_simple_gla, mamba_ssm mamba3_siso_combined, versions), None where
    absent (on a CPU: all)."""
    if not gpu():
        return None, None, None, {}
    from course.bench import mamba3 as M
    from course.bench.ssd import load_fla, load_mamba_ssm_ssd

    versions = {"mamba_ssm": "2.3.2.post1 (source, .mamba_ref)"}
    fla = load_fla()
    if fla is not None:
        import fla as fla_pkg

        versions["fla"] = getattr(fla_pkg, "__version__", "?")
    return load_mamba_ssm_ssd(), fla, M.load(autotune="full"), versions


# --------------------------------------------------------------------------------------------
# 0. prewarm jobs (each runs in a worker process and returns rows)
def job_pytest(seconds):
    """The GPU tests, in subprocesses of at most ``seconds`` in all: the launches past 2³¹ (SSD,
    then Mamba-3; their failures printed in full), then the SSD and Mamba-3 files; a row each.
    (The defaults' agreement at the timed shapes is checked in the timing rows themselves.)"""
    rows, t0 = [], time.time()
    for files in (["tests/test_past_2_31.py::test_gpu_ssd_past_2_31"],
                  ["tests/test_past_2_31.py::test_gpu_mamba3_past_2_31"],
                  ["tests/test_ssd_fused.py", "tests/test_mamba3_triton.py"]):
        budget = seconds - (time.time() - t0)
        if budget < 10:
            rows.append(dict(section="gpu tests", files=" ".join(files), rc="not run: time"))
            continue
        cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "--tb=short", "-m", "gpu",
               "-p", "no:cacheprovider", *files]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=budget)
            out, rc = r.stdout + r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc = f"cut at {budget:.0f} s"
        keep = [x for x in out.splitlines() if x.startswith(("FAILED", "ERROR", "E "))
                or " passed" in x or " failed" in x or x.startswith(".") or "Error" in x]
        rows.append(dict(section="gpu tests", files=" ".join(files), rc=rc, lines=keep[-60:]))
    return rows


def job_ours_ssd(shape):
    """Compile our SSD forward (both chunks, fused and chapter 10's) and fwd+bwd at one shape
    class."""
    from course.bench.ssd import fwd_bwd
    from mambalearn.mamba2 import mamba_chunk_scan_combined as ours

    args, kw = ssd_inputs(*shape)
    for q in SSD_DESIGNS.values():
        ours(*args, chunks(q), **kw)
        ours(*args, chunks(q), fused=False, **kw)
        for _, qp, changes in STATE_PARTS:
            if qp == q:
                _states_fn(args, kw, chunks(q), changes)()
    fwd_bwd(lambda *a, **k: ours(*a, chunks(SSD_CHUNK), **k), args, kw,
            torch.randn_like(args[0]))()
    return []


def job_ours_m3(shape):
    from course.bench import mamba3 as M
    from mambalearn.mamba3 import mamba3_siso_combined

    kw = m3_inputs(*shape, grad=True)
    M._fwd_bwd(mamba3_siso_combined, kw, m3_chunk())()
    for changes in M3_DESIGNS.values():
        _m3_forward(kw, changes)()
    for f in _m3_parts(kw).values():
        f()
    return []


def job_peer(kind, i, n):
    """Compile slice i of n of a peer's autotuned configs at every shape class of the run."""
    mamba, fla, m3, _ = peers()
    slice_autotuners(PREFIX[kind], i, n)
    if kind == "ssd" and mamba is not None:
        from course.bench.ssd import fwd_bwd

        for shape in SSD_WARM:
            clear_autotuners(PREFIX[kind])
            args, kw = ssd_inputs(*shape)
            mamba(*args, SSD_CHUNK, **kw)
            fwd_bwd(lambda *a, **k: mamba(*a, SSD_CHUNK, **k), args, kw,
                    torch.randn_like(args[0]))()
    if kind == "fla" and fla is not None:
        from course.bench.ssd import fla_fn

        for shape in SSD_WARM:
            clear_autotuners(PREFIX[kind])
            fla_fn(fla, *ssd_inputs(*shape))()
    if kind == "m3" and m3 is not None:
        from course.bench import mamba3 as M

        for shape in M3_WARM:
            clear_autotuners(PREFIX[kind])
            kw = m3_inputs(*shape, grad=True)
            M._fwd_bwd(m3, kw, M3_CHUNK)()
            _no_grad(m3, kw, M3_CHUNK)  # the forward alone keeps less: its own compiles
    torch.cuda.synchronize()
    return []


def _worker(job, arg):
    """Entry point of a prewarm worker: (job name, its rows or an error row)."""
    try:
        return job, globals()[f"job_{job}"](*arg)
    except Exception as e:  # noqa: BLE001 - a failing job is a row, not the end of the run
        return job, [dict(section="prewarm", job=job, arg=str(arg),
                          error=f"{type(e).__name__}: {str(e)[:400]}")]


def prewarm(workers, seconds, with_fla):
    """Run the prewarm jobs in ``workers`` spawned processes for at most ``seconds`` (then the
    workers are ended and this process compiles what is left); their rows. Mamba-3's peer, whose
    234 configs cost the most, gets the most slices and goes first."""
    jobs = [("pytest", (seconds - 5,))] if gpu() else []
    if gpu():
        jobs += [("peer", ("m3", i, 8)) for i in range(8)]
        jobs += [("peer", ("ssd", i, 4)) for i in range(4)]
        jobs += [("peer", ("fla", i, 2)) for i in range(2) if with_fla]
    jobs += [("ours_m3", (s,)) for s in M3_WARM]
    jobs += [("ours_ssd", (s,)) for s in OURS_SSD_WARM]
    t = time.time()
    done = 0
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    futures = [pool.submit(_worker, job, arg) for job, arg in jobs]
    try:
        for f in cf.as_completed(futures, timeout=seconds):
            job, rows = f.result()
            done += 1
            for r in rows:
                row(**r)
        pool.shutdown()
    except cf.TimeoutError:  # end the workers this run started (they would share the GPU)
        for proc in list(pool._processes.values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        row(section="prewarm", error=f"cut at {seconds:.0f} s: {len(jobs) - done} jobs unfinished")
    row(section="prewarm", jobs=len(jobs), done=done, workers=workers, seconds=time.time() - t)


# --------------------------------------------------------------------------------------------
# timing helpers
def _time(fn):
    from mambalearn.timing import time_ms

    return time_ms(fn, warmup=10, rep=30)


def kernel_times(fn, reps=3):
    """{kernel: ms per call} of ``fn`` under torch's profiler (CUDA kernels, every library's):
    where each side's time goes. Empty on a CPU."""
    if not gpu():
        return {}
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            times[e.key[:70]] = round(t / reps / 1000, 4)
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def profiled(section, shape, fns):
    for name, fn in fns.items():
        try:
            row(section=section, shape=shape, backend=name, kernels=kernel_times(fn))
        except Exception as e:  # noqa: BLE001 - the profile is extra evidence, not a result
            row(section=section, shape=shape, backend=name, error=f"{type(e).__name__}: {e}"[:300])


def _compared(section, shape, fns, base, other=None, floor_ms=None):
    """Time ``fns`` interleaved (``timing.compare``); a row each with ms, the median ratio of the
    rounds to ``base`` (and ``other``) and its spread."""
    from mambalearn.timing import compare

    warm, rounds, rep = (1.0, 5, 40) if gpu() else (0.0, 1, 1)
    try:
        res = compare(fns, warm_s=warm, rounds=rounds, rep=rep)
    except Exception as e:  # noqa: BLE001 - e.g. out of memory at one point: a row, go on
        return row(section=section, shape=shape, error=f"{type(e).__name__}: {str(e)[:300]}")
    for name in fns:
        r = dict(section=section, shape=shape, backend=name, ms=res.ms(name))
        for key, ref in (("vs", base), ("vs_other", other)):
            if ref in fns and name != ref:
                r[key], r[f"{key}_spread"] = res.ratio(name, ref)
                r[f"{key}_peer"] = ref
        if floor_ms:
            r["floor_pct"] = 100 * floor_ms / r["ms"]
        row(**r)


# --------------------------------------------------------------------------------------------
# 1. Mamba-3
def _m3_forward(kw, changes):
    """Our forward's three launches with the default config changed by ``changes``."""
    from mambalearn.mamba3 import api as interface
    from mambalearn.mamba3 import chunk as forward
    from mambalearn.mamba3.config import DEFAULT

    x = interface._prepare([kw[k] for k in interface._NAMES], None)
    c = DEFAULT.replace(**changes)
    return lambda: forward.launch_forward(x, m3_chunk(), save=False, return_final=False,
                                          cfg=c)["out"]


def _m3_parts(kw):
    """Our forward's first two launches alone: chunk states, state passing (pipeline depths)."""
    from mambalearn.mamba3 import api as interface
    from mambalearn.mamba3 import chunk_state, state_passing
    from mambalearn.mamba3.config import DEFAULT

    x = interface._prepare([kw[k] for k in interface._NAMES], None)
    q = m3_chunk()
    S, steps = chunk_state.chunk_states(x, q, DEFAULT)
    parts = {"chunk states": lambda: chunk_state.chunk_states(x, q, DEFAULT)}
    for stages in (1, 2, 3, 4):
        c = DEFAULT.replace(state_stages=stages)
        parts[f"state passing, {stages} stages"] = lambda c=c: state_passing.pass_states(
            S, steps["Turn"], steps["Cend"], None, None, c)
    return parts


def _m3_agreement(shape, kw, m3, q):
    """Our default forward against our forward at other settings (the same arithmetic: 0
    expected) and against mamba_ssm's (bf16 rounding apart)."""
    from mambalearn.mamba3 import mamba3_siso_combined
    from mambalearn.testing import rel_error

    ours = _no_grad(mamba3_siso_combined, kw, q).float()
    r = {name: rel_error(_m3_forward(kw, changes)().float(), ours)
         for name, changes in M3_DESIGNS.items() if changes}
    if m3 is not None:
        r["mamba_ssm"] = rel_error(_no_grad(m3, kw, q).float(), ours)
    row(section="mamba3 agreement", shape=shape, rel_to_ours_default=r)


def _no_grad(fn, kw, q):
    with torch.no_grad():
        return fn(**kw, chunk_size=q)


def mamba3(limit, m3):
    from course.bench import mamba3 as M
    from mambalearn import roofline
    from mambalearn.mamba3 import mamba3_siso_combined

    q = m3_chunk()
    for b, l in M3_POINTS if gpu() else M3_POINTS[:1]:
        shape = f"b{b} l{l}"
        if gpu() and left(limit) < 45:
            row(section="mamba3", shape=shape, error="skipped: time limit")
            continue
        kw = m3_inputs(b, l, grad=True)
        floors = {w: roofline.floor(M.mamba3_cost(**m3_point(b, l), backward=w == "fwd+bwd"))
                  for w in ("fwd", "fwd+bwd")}
        both = {} if m3 is None else {"mamba_ssm": M._fwd_bwd(m3, kw, q)}
        both["ours"] = M._fwd_bwd(mamba3_siso_combined, kw, q)
        _compared("mamba3 fwd+bwd", shape, both, "mamba_ssm",
                  floor_ms=floors["fwd+bwd"]["floor_ms"])
        fwd = {} if m3 is None else {"mamba_ssm": lambda kw=kw: _no_grad(m3, kw, q)}
        fwd.update({name: _m3_forward(kw, changes) for name, changes in M3_DESIGNS.items()})
        _compared("mamba3 fwd", shape, fwd, "mamba_ssm", floor_ms=floors["fwd"]["floor_ms"])
        _m3_agreement(shape, kw, m3, q)
        if left(limit) > 20:
            profiled("mamba3 fwd+bwd profile", shape, both)
        for name, f in _m3_parts(kw).items():
            row(section="mamba3 part", shape=shape, backend=name, ms=_time(f))
        del kw, both, fwd
        if gpu():
            torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------
# 2. SSD
def _states_fn(args, kw, q, changes):
    """A closure running the states launch (with ``config.States`` changes) alone."""
    from mambalearn.mamba2 import chunk as unfused
    from mambalearn.mamba2.config import defaults
    from mambalearn.mamba2.fused import states

    x, dt, A, B, C = args
    dt_c, dA_cs = unfused.chunk_cumsum(dt, A, q, kw["dt_bias"], True,
                                       heads=defaults(x.device).stages.cumsum_heads)
    cfg = ssd_config(args, q, states=changes).states
    return lambda: states.chunk_states(x, B, dt_c, dA_cs, config=cfg)


def _ssd_agreement(shape, args, kw):
    """Our public default forward at each chunk against chapter 10's five kernels at the same
    chunk (the same roundings: ≤ 1e-4 expected, float32 summation order)."""
    from mambalearn.mamba2 import mamba_chunk_scan_combined as ours
    from mambalearn.testing import rel_error

    try:
        r = {name: rel_error(ours(*args, chunks(q), **kw).float(),
                             ours(*args, chunks(q), fused=False, **kw).float())
             for name, q in SSD_DESIGNS.items()}
        row(section="ssd agreement", shape=shape, rel_to_unfused_same_chunk=r)
    except Exception as e:  # noqa: BLE001
        row(section="ssd agreement", shape=shape, error=f"{type(e).__name__}: {str(e)[:300]}")


def ssd_sweep(limit, mamba, fla, points):
    from course.bench.ssd import fla_fn
    from mambalearn import roofline
    from mambalearn.mamba2 import mamba_chunk_scan_combined as ours

    for b, l in points if gpu() else points[:1]:
        shape = f"b{b} l{l}"
        if left(limit) < 8 + 1.5 * (len(SSD_DESIGNS) + 2):
            row(section="ssd fwd", shape=shape, error="skipped: time limit")
            continue
        args, kw = ssd_inputs(b, l)
        fns = {}
        if mamba is not None:
            fns["mamba_ssm"] = lambda a=args, k=kw: mamba(*a, SSD_CHUNK, **k)
        if fla is not None:
            fns["fla (no D)"] = fla_fn(fla, args, kw)
        for name, q in SSD_DESIGNS.items():
            fns[name] = lambda q=q, a=args, k=kw: ours(*a, chunks(q), **k)
        h, p, g, n = (ssd_heads()[k] for k in "hpgn")
        fl = roofline.floor(roofline.ssd_cost(*ssd_point(b, l), h, p, n, SSD_CHUNK, g))
        _compared("ssd fwd", shape, fns, "mamba_ssm", "fla (no D)", fl["floor_ms"])
        _ssd_agreement(shape, args, kw)
        if (b, l) in PART_POINTS or not gpu():
            for name, q, changes in STATE_PARTS:
                row(section="ssd part", shape=shape, backend=f"{name} q{q}",
                    ms=_time(_states_fn(args, kw, chunks(q), changes)))
        del args, kw, fns
        if gpu():
            torch.cuda.empty_cache()


def ssd_backward(limit, mamba):
    from course.bench.ssd import fwd_bwd
    from mambalearn.mamba2 import mamba_chunk_scan_combined as ours

    for b, l in BWD_POINTS if gpu() else BWD_POINTS[:1]:
        shape = f"b{b} l{l}"
        if left(limit) < 10:
            row(section="ssd fwd+bwd", shape=shape, error="skipped: time limit")
            continue
        args, kw = ssd_inputs(b, l)
        dout = torch.randn_like(args[0])
        fns = {"ours": fwd_bwd(lambda *a, **k: ours(*a, chunks(SSD_CHUNK), **k), args, kw, dout)}
        if mamba is not None:
            fns = {"mamba_ssm": fwd_bwd(lambda *a, **k: mamba(*a, SSD_CHUNK, **k), args, kw,
                                        dout), **fns}
        _compared("ssd fwd+bwd", shape, fns, "mamba_ssm")
        if (b, l) == BWD_POINTS[0] and left(limit) > 15:
            profiled("ssd fwd+bwd profile", shape, fns)
        del args, kw, fns, dout


# --------------------------------------------------------------------------------------------
def meta(args, versions):
    import triton

    return dict(device=torch.cuda.get_device_name() if gpu() else "cpu (interpreter)",
                date=datetime.date.today().isoformat(), command=" ".join(sys.argv),
                commit=args.commit, torch=torch.__version__, triton=triton.__version__,
                peers=versions, seconds=round(time.time() - T0, 1))


def table():
    """The short table printed last: every timed row, then the tests and the errors."""
    lines = [f"{'section':<15}{'shape':<12}{'backend':<34}{'ms':>9}{'vs':>7}{'±':>6}"
             f"{'vs2':>7}{'floor%':>7}"]
    for r in ROWS:
        if "ms" not in r:
            continue
        f = lambda k, fmt, r=r: fmt.format(r[k]) if r.get(k) is not None else "-"
        lines.append(f"{r['section']:<15}{r.get('shape', ''):<12}{r['backend'][:33]:<34}"
                     f"{r['ms']:>9.4f}{f('vs', '{:.3f}'):>7}{f('vs_spread', '{:.2f}'):>6}"
                     f"{f('vs_other', '{:.3f}'):>7}{f('floor_pct', '{:.0f}'):>7}")
    for r in ROWS:
        if r.get("section") in ("gpu tests", "prewarm") or "error" in r:
            lines.append(json.dumps(r, default=str)[:1500])
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=198.0, help="seconds for the whole run")
    ap.add_argument("--prewarm", type=float, default=95.0, help="seconds for the prewarm")
    ap.add_argument("--fla", action="store_true", help="FLA too (its first run had 7 points)")
    ap.add_argument("--workers", type=int, default=14, help="prewarm processes")
    ap.add_argument("--json", default=None)
    ap.add_argument("--commit", default=os.environ.get("COMMIT", "unknown"))
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes on a CPU")
    args = ap.parse_args()
    if not gpu() and not args.cpu_smoke:
        raise SystemExit("no GPU: run with --cpu-smoke for the control flow at toy sizes")
    print(torch.cuda.get_device_name() if gpu() else "no GPU (interpreter)", flush=True)
    if args.prewarm > 0:
        prewarm(args.workers if gpu() else 2, min(args.prewarm, args.limit - 30), args.fla)
    mamba, fla, m3, versions = peers()
    fla = fla if args.fla else None
    mamba3(args.limit, m3)
    ssd_sweep(args.limit, mamba, fla, SSD_POINTS[:FIRST])
    ssd_backward(args.limit, mamba)
    ssd_sweep(args.limit, mamba, fla, SSD_POINTS[FIRST:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta(args, versions), rows=ROWS), f, indent=1, default=str)
    print(f"\n== {time.time() - T0:.0f} s\n" + table(), flush=True)


if __name__ == "__main__":
    main()
