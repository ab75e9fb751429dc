"""Device script: SSD and Mamba-3 from batch 64 down to batch one, against the peers, one H200 run.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.batch_one [--parts ssd,mamba3] [--limit S]
        [--json FILE] [--commit SHA]
    python3 -m bench.gpu.batch_one --cpu-smoke      (the control flow at toy sizes, interpreter)

0. **prewarm** (``--workers`` processes, spawned): Triton compiles every kernel of ours and every
   config of every peer autotuner (each worker takes a slice of each autotuner's configs at every
   shape class of the run; the disk cache is shared), while one worker runs the GPU tests
   (``pytest -m gpu``: the launches past 2³¹ of tests/test_past_2_31.py and the families' GPU
   tests) and another the agreement of every design with chapter 10's kernels. Their rows come
   back to this process; nothing is timed there.
1. ``ssd``: the fused forward, h80 p64 n128 g1 bf16, fp32 A/D/dt_bias, softplus, chunk 256, at
   every point of the fixed-token sweep (b·l = 32 768 and 262 144, b ∈ {1, 2, 4, 8, 16, 64}, and
   b1 l16384, b1 l131072): mamba_ssm's ``mamba_chunk_scan_combined``, FLA's ``chunk_simple_gla``
   (no D; inputs prepared outside the timing) and the designs of ``SSD_DESIGNS``, interleaved
   (``timing.compare``); at ``PART_POINTS`` the launches of each design alone (``time_ms``:
   where the time goes); then fwd+bwd at b4 l4096, b1 l16384, b16 l1024, ours against
   mamba_ssm, and the backward's steps at b4 l4096.
2. ``mamba3``: ``mamba3_siso_combined`` at b8 l2048 and b1 l32768 (h32 g1 n128 p64 na32, chunk
   64, bf16, D and Z): forward and fwd+bwd, ours against mamba_ssm **with its full autotune**
   (cleared before each shape, so each shape is tuned as a user at that shape would tune it),
   our forward's settings of ``M3_DESIGNS``, and our launches alone.

Rows are printed as they come (JSON lines), a short table last; ``--json`` writes every row with
the run's meta (device, date, command, commit, peers' versions). Each part starts only while
``--limit`` leaves it time; a row says what was skipped.
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
SSD_POINTS = [(b, t // b) for t in (32768, 262144) for b in (1, 2, 4, 8, 16, 64)] + \
    [(1, 16384), (1, 131072)]
PART_POINTS = [(1, 32768), (2, 16384), (1, 262144), (64, 512)]
BWD_POINTS = [(4, 4096), (1, 16384), (16, 1024)]
M3_SHAPE = dict(h=32, g=1, n=128, p=64, na=32)
M3_POINTS = [(8, 2048), (1, 32768)]
M3_CHUNK = 64
SUB = dict(TMA_BLOCK_K=64, TMA_STAGES=2, TMA_MAXNREG=None)  # states: 64-step trips, 2 stages
# the fused forward's designs (``ssd_fused_forward(config=...)``; chunk: the one it runs at)
SSD_DESIGNS = {
    "ours q128 states sub64": dict(states=SUB),
    "ours q256 states sub64": dict(chunk=256, states=SUB),
}
# more designs at PART_POINTS only (the whole forward, interleaved with the ones above)
SSD_MORE = {
    "ours q128 (today's default)": dict(),
    "ours q128 sub64, outputs LOOP": dict(states=SUB, outputs=dict(LOOP=True)),
    "ours q128 sub64, outputs LOOP K32 s3": dict(states=SUB, outputs=dict(
        LOOP=True, BLOCK_K=32, num_stages=3)),
    "ours q256 sub64, outputs LOOP K32 s3": dict(chunk=256, states=SUB, outputs=dict(
        LOOP=True, BLOCK_K=32, num_stages=3)),
}
# launches alone at PART_POINTS: (name, chunk, "states" | "outputs" | "cumsum", config)
SSD_PARTS = [("cumsum", 128, "cumsum", None), ("cumsum", 256, "cumsum", None)] + [
    (f"states {name}", q, "states", dict(TMA=True, **cfg)) for q in (128, 256) for name, cfg in (
        ("1 stage, auto split", {}), ("1 stage, no split", dict(SPLIT=1)),
        ("sub64 s2, auto split", SUB), ("sub64 s2, no split", dict(SUB, SPLIT=1)),
        ("sub64 s2, split 2", dict(SUB, SPLIT=2)), ("sub64 s2, split 4", dict(SUB, SPLIT=4)),
        ("sub64 s2, split 8", dict(SUB, SPLIT=8)), ("sub64 s2, split 16", dict(SUB, SPLIT=16)),
        ("sub32 s3, auto split", dict(TMA_BLOCK_K=32, TMA_STAGES=3, TMA_MAXNREG=None)))] + [
    (f"outputs {name}", q, "outputs", cfg) for q in (128, 256) for name, cfg in (
        ("default", {}), ("LOOP", dict(LOOP=True)),
        ("LOOP K32 s3", dict(LOOP=True, BLOCK_K=32, num_stages=3)))]
# Mamba-3 forward settings (``forward.launch_forward(cfg=...)``, ``common.CONFIG``'s keys)
M3_DESIGNS = {"ours": {}, "ours state_rows 4": dict(state_rows=4),
              "ours state_rows 2": dict(state_rows=2), "ours state_rows 2, 1 warp": dict(
                  state_rows=2, state_warps=1)}
ROWS = []
SMOKE = False


def row(**r):
    ROWS.append(r)
    print(json.dumps({k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()}),
          flush=True)
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
    return q if gpu() else 16  # the toy chunk


def m3_point(b, l):
    return dict(M3_SHAPE, b=b, l=l) if gpu() else dict(b=1, l=40, h=2, g=1, n=16, p=16, na=4)


def warm_shapes(points):
    """The shapes that compile what ``points`` compile, small: Triton specialises an int on
    being 1 and on dividing by 16, so a point's class is (b = 1, l capped at 4096: chunk counts
    of 128 and 256 steps stay multiples of 16 from there on)."""
    return sorted({(1 if b == 1 else 2, min(l, 4096)) for b, l in points})


def ssd_inputs(b, l, seed=0):
    from mambalearn.bench.ssd import make_inputs

    b, l = ssd_point(b, l)
    return make_inputs(b, l, **ssd_heads(), dtype=torch.bfloat16 if gpu() else torch.float32,
                       device=dev(), seed=seed)


def m3_inputs(b, l, grad):
    from mambalearn.bench import mamba3 as M

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


def peers():
    """(mamba_ssm SSD, FLA chunk_simple_gla, mamba_ssm mamba3_siso_combined, versions), None where
    absent (on a CPU: all)."""
    if not gpu():
        return None, None, None, {}
    from mambalearn.bench import mamba3 as M
    from mambalearn.bench.ssd import load_fla, load_mamba_ssm_ssd

    versions = {"mamba_ssm": "2.3.2.post1 (source, .mamba_ref)"}
    fla = load_fla()
    if fla is not None:
        import fla as fla_pkg

        versions["fla"] = getattr(fla_pkg, "__version__", "?")
    return load_mamba_ssm_ssd(), fla, M.load(autotune="full"), versions


# --------------------------------------------------------------------------------------------
# 0. prewarm jobs (each runs in a worker process and returns rows)
def job_pytest(files, seconds):
    """The GPU tests (``-m gpu``) of ``files``, in a subprocess of at most ``seconds``: a row
    with pytest's summary lines (and its progress line when cut short)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-m", "gpu", "-p", "no:cacheprovider",
           *files]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), \
            f"cut at {seconds:.0f} s"
    keep = [x for x in out.splitlines() if x.startswith(("FAILED", "ERROR", "tests/"))
            or " passed" in x or " failed" in x]
    return [dict(section="gpu tests", files=" ".join(files), rc=rc,
                 lines=keep[-40:] or out.splitlines()[-15:])]


def job_ours_ssd(shape):
    """Run (compile) every design of ours at one shape; their agreement with chapter 10."""
    from mambalearn.testing import rel_error
    from mambalearn.triton.ssd import forward as unfused
    from mambalearn.triton.ssd.fused import ssd_fused_forward

    args, kw = ssd_inputs(*shape)
    rows = []
    refs = {q: unfused.ssd_forward(*args, chunks(q), **kw)[0].float() for q in (128, 256)}
    for name, cfg in {**SSD_DESIGNS, **SSD_MORE}.items():
        q = cfg.get("chunk", 128)
        cfg = dict(cfg, chunk=chunks(q))
        out = ssd_fused_forward(*args, chunks(SSD_CHUNK), config=cfg, **kw)[0]
        rows.append(dict(section="agreement", shape=f"b{shape[0]} l{shape[1]}", design=name,
                         rel_unfused_same_chunk=rel_error(out.float(), refs[q])))
    for _, q, kernel, cfg in SSD_PARTS:
        _part_fn(kernel, chunks(q), cfg, args, kw)()
    return rows


def job_ours_ssd_bwd(shape):
    from mambalearn.bench.ssd import backward_steps, fwd_bwd
    from mambalearn.triton.ssd import mamba_chunk_scan_combined as ours

    args, kw = ssd_inputs(*shape)
    fwd_bwd(lambda *a, **k: ours(*a, chunks(SSD_CHUNK), **k), args, kw,
            torch.randn_like(args[0]))()
    if shape == (2, 4096) or not gpu():
        b, l = ssd_point(4, 4096)
        backward_steps(gpu(), shape=dict(b=b, l=l, **ssd_heads()), chunk=chunks(SSD_CHUNK),
                       sweep=True)
    return []


def job_ours_m3(shape):
    from mambalearn.bench import mamba3 as M
    from mambalearn.triton.mamba3 import mamba3_siso_combined

    kw = m3_inputs(*shape, grad=True)
    M._fwd_bwd(mamba3_siso_combined, kw, M3_CHUNK if gpu() else 16)()
    for cfg in M3_DESIGNS.values():
        _m3_forward(kw, cfg)()
    for f in _m3_parts(kw).values():
        f()
    return []


def job_peer(kind, i, n):
    """Compile slice i of n of a peer's autotuned configs at every shape class of the run."""
    mamba, fla, m3, _ = peers()
    prefix = {"ssd": "mamba_ssm.ops.triton.ssd", "fla": "fla.", "m3": "mamba_ssm.ops.triton.mamba3"}
    slice_autotuners(prefix[kind], i, n)
    if kind in ("ssd", "fla") and (mamba if kind == "ssd" else fla) is not None:
        from mambalearn.bench.ssd import fla_fn, fwd_bwd

        for shape in warm_shapes(SSD_POINTS):
            clear_autotuners(prefix[kind])
            args, kw = ssd_inputs(*shape)
            if kind == "ssd":
                mamba(*args, SSD_CHUNK, **kw)
            else:
                fla_fn(fla, args, kw)()
        if kind == "ssd":
            for shape in warm_shapes(BWD_POINTS):
                clear_autotuners(prefix[kind])
                args, kw = ssd_inputs(*shape)
                fwd_bwd(lambda *a, **k: mamba(*a, SSD_CHUNK, **k), args, kw,
                        torch.randn_like(args[0]))()
    if kind == "m3" and m3 is not None:
        from mambalearn.bench import mamba3 as M

        for shape in warm_shapes(M3_POINTS):
            clear_autotuners(prefix[kind])
            M._fwd_bwd(m3, m3_inputs(*shape, grad=True), M3_CHUNK)()
    torch.cuda.synchronize()
    return []


def _worker(job, arg):
    """Entry point of a prewarm worker: (job name, its rows or an error row)."""
    try:
        return job, globals()[f"job_{job}"](*arg)
    except Exception as e:  # noqa: BLE001 - a failing job is a row, not the end of the run
        return job, [dict(section="prewarm", job=job, arg=str(arg),
                          error=f"{type(e).__name__}: {str(e)[:400]}")]


def prewarm(parts, workers, seconds):
    """Run the prewarm jobs of ``parts`` in ``workers`` spawned processes for at most
    ``seconds`` (then the workers are ended and this process compiles what is left); their rows."""
    jobs = []
    tests = {"ssd": ["tests/test_past_2_31.py", "tests/test_ssd_fused.py",
                     "tests/test_ssd_triton.py", "tests/test_ssd_backward.py"],
             "mamba3": ["tests/test_mamba3_triton.py"]}
    files = [f for p in parts for f in tests[p]]
    if gpu() and files:
        jobs.append(("pytest", (files, seconds - 10)))
    n = max(1, workers - 2)  # slices per peer
    if "ssd" in parts:
        jobs += [("peer", ("ssd", i, n)) for i in range(n) if gpu()]
        jobs += [("peer", ("fla", i, n)) for i in range(n) if gpu()]
        jobs += [("ours_ssd", (s,)) for s in warm_shapes(SSD_POINTS + PART_POINTS)]
        jobs += [("ours_ssd_bwd", (s,)) for s in warm_shapes(BWD_POINTS)]
    if "mamba3" in parts:
        jobs += [("peer", ("m3", i, n)) for i in range(n) if gpu()]
        jobs += [("ours_m3", (s,)) for s in warm_shapes(M3_POINTS)]
    t = time.time()
    out, done = [], 0
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    futures = [pool.submit(_worker, job, arg) for job, arg in jobs]
    try:
        for f in cf.as_completed(futures, timeout=seconds):
            job, rows = f.result()
            done += 1
            for r in rows:
                out.append(row(**r))
        pool.shutdown()
    except cf.TimeoutError:  # end the workers this run started (they would share the GPU)
        for proc in list(pool._processes.values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        row(section="prewarm", error=f"cut at {seconds:.0f} s: {len(jobs) - done} jobs unfinished")
    row(section="prewarm", jobs=len(jobs), done=done, workers=workers, seconds=time.time() - t)
    return out


# --------------------------------------------------------------------------------------------
# 1. SSD
def _part_fn(kernel, q, cfg, args, kw):
    """A closure running one launch of the fused forward on prepared inputs."""
    from mambalearn.triton.ssd import forward as unfused
    from mambalearn.triton.ssd import outputs, states

    x, dt, A, B, C = args
    dt_c, dA_cs = unfused.chunk_cumsum(dt, A, q, kw["dt_bias"], True)
    if kernel == "cumsum":
        return lambda: unfused.chunk_cumsum(dt, A, q, kw["dt_bias"], True)
    if kernel == "states":
        return lambda: states.chunk_states(x, B, dt_c, dA_cs, config=cfg)
    H, _ = states.chunk_states(x, B, dt_c, dA_cs, config=dict(TMA=True))
    return lambda: outputs.chunk_outputs(x, C, B, dt_c, dA_cs, H, kw["D"], config=cfg)


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


def _timing():
    """(warm seconds, rounds, ms per do_bench): the interleaved measurement; toy on a CPU."""
    return (1.0, 5, 40) if gpu() else (0.0, 1, 1)


def _compared(section, shape, fns, base, other=None, floor_ms=None):
    """Time ``fns`` interleaved (``timing.compare``); a row each with ms, the median ratio of the
    rounds to ``base`` (and ``other``) and its spread."""
    from mambalearn.timing import compare

    warm, rounds, rep = _timing()
    res = compare(fns, warm_s=warm, rounds=rounds, rep=rep)
    for name in fns:
        r = dict(section=section, shape=shape, backend=name, ms=res.ms(name))
        for key, ref in (("vs", base), ("vs_other", other)):
            if ref in fns and name != ref:
                r[key], r[f"{key}_spread"] = res.ratio(name, ref)
                r[f"{key}_peer"] = ref
        if floor_ms:
            r["floor_pct"] = 100 * floor_ms / r["ms"]
        row(**r)


def ssd_sweep(limit, mamba, fla):
    from mambalearn import roofline
    from mambalearn.bench.ssd import fla_fn
    from mambalearn.triton.ssd.fused import ssd_fused_forward

    points = SSD_POINTS if gpu() else SSD_POINTS[:1] + PART_POINTS[-1:]
    for b, l in points:
        shape = f"b{b} l{l}"
        more = SSD_MORE if (b, l) in PART_POINTS and gpu() else {}
        if left(limit) < 8 + 1.5 * (5 + len(more)):
            row(section="ssd fwd", shape=shape, error="skipped: time limit")
            continue
        args, kw = ssd_inputs(b, l)
        fns = {}
        if mamba is not None:
            fns["mamba_ssm"] = lambda a=args, k=kw: mamba(*a, SSD_CHUNK, **k)
        if fla is not None:
            fns["fla (no D)"] = fla_fn(fla, args, kw)
        for name, cfg in {**SSD_DESIGNS, **more}.items():
            cfg = dict(cfg, chunk=chunks(cfg.get("chunk", 128)))
            fns[name] = lambda c=cfg, a=args, k=kw: ssd_fused_forward(
                *a, chunks(SSD_CHUNK), config=c, **k)[0]
        h, p, g, n = (ssd_heads()[k] for k in "hpgn")
        fl = roofline.floor(roofline.ssd_cost(*ssd_point(b, l), h, p, n, SSD_CHUNK, g))
        _compared("ssd fwd", shape, fns, "mamba_ssm", "fla (no D)", fl["floor_ms"])
        if (b, l) in PART_POINTS:
            ssd_parts(limit, shape, args, kw)
            if (b, l) == PART_POINTS[0] and left(limit) > 20:
                profiled("ssd fwd profile", shape, {k: v for k, v in fns.items()
                                                    if k in ("mamba_ssm", *SSD_DESIGNS)})
        del args, kw, fns
        if gpu():
            torch.cuda.empty_cache()


def ssd_parts(limit, shape, args, kw):
    for name, q, kernel, cfg in SSD_PARTS if gpu() else SSD_PARTS[::9]:
        if left(limit) < 5:
            return row(section="ssd part", shape=shape, error="skipped: time limit")
        try:
            ms = _time(_part_fn(kernel, chunks(q), cfg, args, kw))
            row(section="ssd part", shape=shape, backend=f"{name} q{q}", ms=ms)
        except Exception as e:  # noqa: BLE001 - a failing variant is a row
            row(section="ssd part", shape=shape, backend=f"{name} q{q}",
                error=f"{type(e).__name__}: {str(e)[:300]}")


def ssd_backward(limit, mamba):
    from mambalearn.bench.ssd import backward_steps, fwd_bwd
    from mambalearn.triton.ssd import mamba_chunk_scan_combined as ours

    for b, l in BWD_POINTS if gpu() else BWD_POINTS[:1]:
        shape = f"b{b} l{l}"
        if left(limit) < 12:
            row(section="ssd fwd+bwd", shape=shape, error="skipped: time limit")
            continue
        args, kw = ssd_inputs(b, l)
        dout = torch.randn_like(args[0])
        fns = {"ours": fwd_bwd(lambda *a, **k: ours(*a, chunks(SSD_CHUNK), **k), args, kw, dout)}
        if mamba is not None:
            fns = {"mamba_ssm": fwd_bwd(lambda *a, **k: mamba(*a, SSD_CHUNK, **k), args, kw,
                                        dout), **fns}
        _compared("ssd fwd+bwd", shape, fns, "mamba_ssm")
        if (b, l) == BWD_POINTS[0] and left(limit) > 20:
            profiled("ssd fwd+bwd profile", shape, fns)
        if left(limit) > 10:  # the backward's recompute of the states: today's kernel, and TMA
            for name, cfg in (("states pointer loads (the backward's)", None),
                              ("states TMA sub64 s2, auto split", dict(TMA=True, **SUB))):
                row(section="ssd part", shape=shape, backend=f"{name} q{SSD_CHUNK}",
                    ms=_time(_part_fn("states", chunks(SSD_CHUNK), cfg, args, kw)))
        del args, kw, fns, dout
    if left(limit) > 15:
        b, l = ssd_point(4, 4096)
        for r in backward_steps(gpu(), shape=dict(b=b, l=l, **ssd_heads()),
                                chunk=chunks(SSD_CHUNK), sweep=True):
            row(section="ssd bwd step", **r)


# --------------------------------------------------------------------------------------------
# 2. Mamba-3
def _m3_forward(kw, cfg):
    """Our forward's three launches with ``common.CONFIG`` changed by ``cfg``."""
    from mambalearn.triton.mamba3 import common, forward, interface

    x = interface._prepare([kw[k] for k in interface._NAMES], None)
    c = dict(common.CONFIG, **cfg)
    q = M3_CHUNK if gpu() else 16
    return lambda: forward.launch_forward(x, q, save=False, return_final=False, cfg=c)["out"]


def _m3_parts(kw):
    """Our forward's launches alone: chunk states, state passing (each ``state_rows``)."""
    from mambalearn.triton.mamba3 import chunk_state, common, interface, state_passing

    x = interface._prepare([kw[k] for k in interface._NAMES], None)
    q = M3_CHUNK if gpu() else 16
    S, steps = chunk_state.chunk_states(x, q)
    parts = {"chunk states": lambda: chunk_state.chunk_states(x, q)}
    for rows_ in (8, 4, 2):
        c = dict(common.CONFIG, state_rows=rows_)
        parts[f"state passing rows {rows_}"] = lambda c=c: state_passing.pass_states(
            S, steps["Turn"], steps["Cend"], cfg=c)
    return parts


def mamba3(limit, m3):
    from mambalearn import roofline
    from mambalearn.bench import mamba3 as M
    from mambalearn.triton.mamba3 import mamba3_siso_combined

    q = M3_CHUNK if gpu() else 16
    for b, l in M3_POINTS if gpu() else M3_POINTS[:1]:
        shape = f"b{b} l{l}"
        if gpu() and left(limit) < 40:
            row(section="mamba3", shape=shape, error="skipped: time limit")
            continue
        if m3 is not None:
            clear_autotuners("mamba_ssm.ops.triton.mamba3")  # tuned again at this shape
        kw = m3_inputs(b, l, grad=True)
        floors = {w: roofline.floor(M.mamba3_cost(**m3_point(b, l), backward=w == "fwd+bwd"))
                  for w in ("fwd", "fwd+bwd")}
        fwd = {} if m3 is None else {"mamba_ssm": lambda kw=kw: _no_grad(m3, kw, q)}
        fwd.update({name: _m3_forward(kw, cfg) for name, cfg in M3_DESIGNS.items()})
        both = {} if m3 is None else {"mamba_ssm": M._fwd_bwd(m3, kw, q)}
        both["ours"] = M._fwd_bwd(mamba3_siso_combined, kw, q)
        _compared("mamba3 fwd+bwd", shape, both, "mamba_ssm",
                  floor_ms=floors["fwd+bwd"]["floor_ms"])
        _compared("mamba3 fwd", shape, fwd, "mamba_ssm", floor_ms=floors["fwd"]["floor_ms"])
        for name, f in _m3_parts(kw).items():
            row(section="mamba3 part", shape=shape, backend=name, ms=_time(f))
        if left(limit) > 15:
            profiled("mamba3 fwd+bwd profile", shape, both)
        del kw
        if gpu():
            torch.cuda.empty_cache()


def _time(fn):
    from mambalearn.timing import time_ms

    return time_ms(fn, warmup=10, rep=30)


def _no_grad(fn, kw, q):
    with torch.no_grad():
        return fn(**kw, chunk_size=q)


# --------------------------------------------------------------------------------------------
def meta(args, versions):
    import triton

    return dict(device=torch.cuda.get_device_name() if gpu() else "cpu (interpreter)",
                date=datetime.date.today().isoformat(), command=" ".join(sys.argv),
                commit=args.commit, torch=torch.__version__, triton=triton.__version__,
                peers=versions, parts=args.parts, seconds=round(time.time() - T0, 1))


def table():
    """The short table printed last: every timed row."""
    lines = [f"{'section':<15}{'shape':<12}{'backend':<40}{'ms':>9}{'vs':>7}{'±':>6}"
             f"{'vs2':>7}{'floor%':>7}"]
    for r in ROWS:
        if "ms" not in r:
            continue
        f = lambda k, fmt, r=r: fmt.format(r[k]) if r.get(k) is not None else "-"
        lines.append(f"{r['section']:<15}{r.get('shape', ''):<12}{r['backend'][:39]:<40}"
                     f"{r['ms']:>9.4f}{f('vs', '{:.3f}'):>7}{f('vs_spread', '{:.2f}'):>6}"
                     f"{f('vs_other', '{:.3f}'):>7}{f('floor_pct', '{:.0f}'):>7}")
    for r in ROWS:
        if r.get("section") in ("gpu tests", "prewarm") or "error" in r:
            lines.append(json.dumps(r)[:600])
    return "\n".join(lines)


def main():
    global SMOKE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="ssd,mamba3")
    ap.add_argument("--limit", type=float, default=235.0, help="seconds for the whole run")
    ap.add_argument("--workers", type=int, default=14, help="prewarm processes")
    ap.add_argument("--prewarm", type=float, default=110.0, help="seconds for the prewarm")
    ap.add_argument("--json", default=None)
    ap.add_argument("--commit", default=os.environ.get("COMMIT", "unknown"))
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes on a CPU")
    args = ap.parse_args()
    SMOKE = args.cpu_smoke
    if not gpu() and not SMOKE:
        raise SystemExit("no GPU: run with --cpu-smoke for the control flow at toy sizes")
    parts = [p for p in args.parts.split(",") if p]
    for p in parts:
        if p not in ("ssd", "mamba3"):
            raise SystemExit(f"--parts: unknown part {p!r} (ssd, mamba3)")
    print(torch.cuda.get_device_name() if gpu() else "no GPU (interpreter)", flush=True)
    if args.prewarm > 0:
        prewarm(parts, args.workers if gpu() else 2, min(args.prewarm, args.limit - 30))
    mamba, fla, m3, versions = peers()
    if "ssd" in parts:
        ssd_sweep(args.limit, mamba, fla)
        ssd_backward(args.limit, mamba)
    if "mamba3" in parts:
        mamba3(args.limit, m3)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta(args, versions), rows=ROWS), f, indent=1, default=str)
    print(f"\n== {time.time() - T0:.0f} s\n" + table(), flush=True)


if __name__ == "__main__":
    main()
