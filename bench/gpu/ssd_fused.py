"""Device script, chapter 11: the fused SSD forward's designs side by side, decode tiles.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.ssd_fused [--limit S] [--ncu] [--json F]

1. correctness at b2 l1024 h16 p64 n128 g1 (bf16; fp32 for the default; D, z, dt_bias, initial
   states): every design of ``DESIGNS`` against the float32 oracle and chapter 10's unfused kernel
2. speed at b4 l4096 / b1 l16384 / b16 l1024 (h80 p64 n128 g1, bf16, D, dt_bias, softplus):
   mamba_ssm (chunk 256), FLA's ``chunk_simple_gla`` (inputs prepared outside the timing, no D),
   our unfused kernel and every design; ms, ratio to each peer, relative difference to the unfused
   kernel at the same chunk size, % of the floor; also our launches alone (cumsum, states, outputs)
3. the decode step: tiles at b1 (CUDA-graph replay) and b64 (eager and graph), fp32 state, vs
   mamba_ssm's ``selective_state_update``
4. ``--ncu``: one Nsight Compute pass over the default fused forward at b4 l4096 (if time is left)
5. ``compare``: the designs of ``NEW`` through the public path
   ``mamba_chunk_scan_combined(..., q, fused=True, config=...)`` (each design's chunk and
   config), first at each shape (b1 l16384, b4 l4096, b16 l1024), then our unfused kernel,
   mamba_ssm and FLA; each new design's
   relative difference to the unfused kernel at its chunk; then the launches alone (``PARTS``)

Stops starting new work when --limit seconds are used; rows are printed as they come and a short
table last. On a CPU: a tiny smoke run of sections 1–3 through the interpreter.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from course.bench import step as bstep
from course.bench import time_ms
from course.bench.ssd import fla_fn, load_fla, load_mamba_ssm_ssd, make_inputs
from mambalearn import roofline
from mambalearn.mamba2 import chunk as unfused
from mambalearn.mamba2 import reference as ssd
from mambalearn.mamba2.config import default_config, defaults
from mambalearn.mamba2.fused import outputs, states
from mambalearn.mamba2.fused.forward import ssd_fused_forward
from mambalearn.mamba2.step import StepConfig, selective_state_update
from mambalearn.testing import rel_error

# name -> (chunk, ``Config.replace`` changes of the default); the sm_90 registers of each kernel
# are in bench/NOTES_ssd.md
DESIGNS = {
    "2L q256": (256, {}),
    "2L q128": (128, {}),
    "2L q64": (64, {}),
    "2L q256 K32 r128": (256, dict(outputs=dict(block_k=32, maxnreg=128))),
    "2L q128 K32 r128": (128, dict(outputs=dict(block_k=32, maxnreg=128))),
    "2L q64 K32 r128": (64, dict(outputs=dict(block_k=32, maxnreg=128))),
    "2L q128 exp2": (128, dict(outputs=dict(exp2=True))),
    "2L q128 r128": (128, dict(outputs=dict(maxnreg=128))),
}


def design(args, q, changes):
    """The keyword arguments of ``ssd_fused_forward`` for a design at the inputs' shape."""
    (b, l, h, p), (g, n) = args[0].shape, args[3].shape[2:]
    return dict(config=default_config((b, l, h, p, g, n, q), args[0].device).replace(**changes))
SHAPES = [(4, 4096), (1, 16384), (16, 1024)]  # (b, l), h80 p64 n128 g1
T0 = time.time()
ROWS = []


def row(**r):
    ROWS.append(r)
    print(json.dumps({k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()}),
          flush=True)


def left(limit):
    return limit - (time.time() - T0)


def correctness(gpu):
    """Section 1: every design against the float32 oracle and the unfused kernel."""
    dev = "cuda" if gpu else "cpu"
    b, l, h, p, g, n = (2, 1024, 16, 64, 1, 128) if gpu else (1, 40, 2, 8, 2, 8)
    for dtype in ((torch.bfloat16, torch.float32) if gpu else (torch.float32,)):
        (x, dt, A, B, C), kw = make_inputs(b, l, h, p, g, n, dtype=dtype, device=dev, seed=3)
        kw.update(z=torch.randn_like(x), initial_states=torch.randn(b, h, p, n, device=dev))
        want, want_f = ssd.mamba_chunk_scan_ref(x.float(), dt, A, B, C, 256 if gpu else 16,
                                                return_final_states=True, **kw)
        for name, (q, opts) in DESIGNS.items():
            q = q if gpu else 16
            if dtype == torch.float32 and name != "2L q256":
                continue  # one float32 row: each dtype is a new compile
            try:
                out, fin = ssd_fused_forward(x, dt, A, B, C, q, **design((x, dt, A, B, C), q,
                                                                         opts), **kw)
                ref, _ = unfused.ssd_forward(x, dt, A, B, C, q, **kw)
                row(section="correct", design=name, dtype=str(dtype)[6:],
                    rel_oracle=rel_error(out.float(), want), rel_final=rel_error(fin, want_f),
                    rel_unfused=rel_error(out.float(), ref.float()), nan=bool(out.isnan().any()))
            except Exception as e:  # noqa: BLE001 - a design that fails is a row too
                row(section="correct", design=name, error=f"{type(e).__name__}: {e}"[:300])


def _at_shapes(section, gpu, limit, shapes, margin):
    """(shape label, args, kw) at each (b, l) of ``shapes`` (on a CPU one tiny shape), h80 p64
    n128 g1 bf16 on the GPU; a row "skipped" where fewer than ``margin`` seconds are left."""
    dev = "cuda" if gpu else "cpu"
    h, p, g, n = (80, 64, 1, 128) if gpu else (2, 8, 1, 8)
    for b, l in shapes if gpu else [(1, 64)]:
        if left(limit) < margin:
            row(section=section, shape=f"b{b} l{l}", error="skipped: time limit")
            continue
        args, kw = make_inputs(b, l, h, p, g, n, dtype=torch.bfloat16 if gpu else torch.float32,
                               device=dev)
        yield f"b{b} l{l}", args, kw
        del args, kw
        if gpu:
            torch.cuda.empty_cache()


def speed(gpu, limit):
    """Section 2: designs and peers at the three shapes."""
    theirs = load_mamba_ssm_ssd() if gpu else None
    fla = load_fla() if gpu else None
    for shape, args, kw in _at_shapes("speed", gpu, limit, SHAPES, 30):
        (b, l, h, p), (g, n) = args[0].shape, args[3].shape[2:]
        fl = roofline.floor(roofline.ssd_cost(b, l, h, p, n, 256, g, in_bytes=2))["floor_ms"]
        peers = {}
        if theirs is not None:
            peers["mamba_ssm"] = time_ms(lambda a=args, k=kw: theirs(*a, 256, **k))
        if fla is not None:
            try:
                peers["fla"] = time_ms(fla_fn(fla, args, kw))
                fo = fla_fn(fla, args, kw)()
                ref_nod = unfused.ssd_forward(*args, 64, **{k: v for k, v in kw.items()
                                                            if k != "D"})[0]
                peers["fla_rel_vs_ours_noD"] = rel_error(fo.float(), ref_nod.float())
            except Exception as e:  # noqa: BLE001
                row(section="speed", shape=shape, design="fla", error=str(e)[:300])
        row(section="speed", shape=shape, design="peers", **peers, floor_ms=fl)
        refs = {}
        for q in (256, 128, 64):
            refs[q] = unfused.ssd_forward(*args, q, **kw)[0]
            if q == 256:
                ms = time_ms(lambda q=q, a=args, k=kw: unfused.ssd_forward(*a, q, **k))
                _speed_row(shape, f"unfused q{q}", ms, peers, fl, None)
        _parts(args, kw, shape, peers, fl)
        for name, (q, opts) in DESIGNS.items():
            if left(limit) < 20:
                row(section="speed", shape=shape, design=name, error="skipped: time limit")
                continue
            try:
                o = design(args, q, opts)
                f = lambda q=q, o=o, a=args, k=kw: ssd_fused_forward(*a, q, **o, **k)[0]
                rel = rel_error(f().float(), refs[q].float())
                _speed_row(shape, name, time_ms(f), peers, fl, rel)
            except Exception as e:  # noqa: BLE001
                row(section="speed", shape=shape, design=name,
                    error=f"{type(e).__name__}: {e}"[:300])


def _speed_row(shape, name, ms, peers, floor_ms, rel):
    row(section="speed", shape=shape, design=name, ms=ms, rel_unfused=rel,
        vs_mamba=ms / peers["mamba_ssm"] if "mamba_ssm" in peers else None,
        vs_fla=ms / peers["fla"] if "fla" in peers else None, floor_pct=100 * floor_ms / ms)


def _parts(args, kw, shape, peers, floor_ms):
    """The default two-launch design's pieces alone: chunk cumsum, chunk states, chunk outputs."""
    x, dt, A, B, C = args
    five = defaults(x.device).stages  # chapter 10's kernels, as ssd_forward runs them
    cumsum = lambda q: unfused.chunk_cumsum(dt, A, q, kw["dt_bias"], True,
                                            heads=five.cumsum_heads)
    dt_c, dA_cs = cumsum(256)
    st = design(args, 256, {})["config"].states
    out_cfg = defaults(x.device).outputs
    H, _ = states.chunk_states(x, B, dt_c, dA_cs, config=st)
    d128, a128 = cumsum(128)
    H128, _ = states.chunk_states(x, B, d128, a128, config=st)
    parts = {"part chunk_cumsum": lambda: cumsum(256),
             "part chunk_states": lambda: states.chunk_states(x, B, dt_c, dA_cs, config=st),
             "part chunk_outputs": lambda: outputs.chunk_outputs(x, C, B, dt_c, dA_cs, H, kw["D"],
                                                                 config=out_cfg),
             "part chunk_states q128": lambda: states.chunk_states(x, B, d128, a128, config=st),
             "part chunk_outputs q128": lambda: outputs.chunk_outputs(x, C, B, d128, a128, H128,
                                                                      kw["D"], config=out_cfg),
             "part unfused chunk_state+state_passing": lambda: unfused.state_passing(
                 unfused.chunk_state(x, B, dt_c, dA_cs, None, five), dA_cs, out_dtype=x.dtype,
                 cfg=five),
             "part unfused bmm+chunk_scan": lambda: unfused.chunk_scan(
                 x, C, unfused.bmm_chunk(C, B, 256, five), dt_c, dA_cs, H, kw["D"], None, None,
                 five)}
    for name, f in parts.items():
        _speed_row(shape, name, time_ms(f), peers, floor_ms, None)


# the fused designs of section 5: name -> (chunk, ``Config.replace`` changes), new first (what
# each call timed: bench/NOTES_ssd.md)
NEW = {
    "fused q128 outputs LOOP": (128, dict(outputs=dict(loop=True))),
    "fused default q128": (128, {}),
}


def _fused_public(q, changes):
    """The public path at chunk ``q`` with the default config changed by ``changes``."""
    from mambalearn.mamba2.api import mamba_chunk_scan_combined

    return lambda args, kw: mamba_chunk_scan_combined(*args, q, fused=True,
                                                      **design(args, q, changes), **kw)


def compare(gpu, limit):
    """Section 5: the new designs, first, then unfused, mamba_ssm, FLA."""
    theirs = load_mamba_ssm_ssd() if gpu else None
    fla = load_fla() if gpu else None
    for shape, args, kw in _at_shapes("compare", gpu, limit, [(1, 16384), (4, 4096), (16, 1024)],
                                      25):
        fns = {}
        for name, (q, changes) in NEW.items():
            go = _fused_public(q, changes)
            fns[name] = lambda go=go, a=args, k=kw: go(a, k)
        fns["unfused q256"] = lambda a=args, k=kw: unfused.ssd_forward(*a, 256, **k)[0]
        if theirs is not None:
            fns["mamba_ssm"] = lambda a=args, k=kw: theirs(*a, 256, **k)
        if fla is not None:
            fns["fla (no D)"] = fla_fn(fla, args, kw)
        ms = {}
        for name, f in fns.items():
            if left(limit) < 15:
                row(section="compare", shape=shape, design=name, error="skipped: time limit")
                continue
            try:
                ms[name] = time_ms(f)
                r = dict(section="compare", shape=shape, design=name, ms=ms[name])
                if name in NEW:  # the 1e-4 criterion: vs the unfused kernel at the same chunk
                    q = NEW[name][0]
                    r["rel_unfused"] = rel_error(f().float(),
                                                 unfused.ssd_forward(*args, q, **kw)[0].float())
                row(**r)
            except Exception as e:  # noqa: BLE001 - a design that fails is a row too
                row(section="compare", shape=shape, design=name,
                    error=f"{type(e).__name__}: {e}"[:300])
        for r in ROWS:  # ratios once the peers are in
            if r.get("section") == "compare" and r.get("shape") == shape and "ms" in r:
                r["vs_mamba"] = r["ms"] / ms["mamba_ssm"] if "mamba_ssm" in ms else None
                r["vs_fla"] = r["ms"] / ms["fla (no D)"] if "fla (no D)" in ms else None
        _compare_parts(args, kw, shape, limit)


# launches alone in section 5: (name, chunk, kernel "cumsum" | "states" | "outputs", changes of
# that part of the default config)
PARTS = [
    ("cumsum", 128, "cumsum", {}),
    ("states TMA 1 stage (auto split)", 128, "states", {}),
    ("states TMA 1 stage no split", 128, "states", dict(split=1)),
    ("states pointer loads", 128, "states", dict(tma=False)),
    ("outputs rows1", 128, "outputs", {}),
    ("outputs LOOP", 128, "outputs", dict(loop=True)),
]


def part_fn(kernel, q, changes, args, kw):
    """A closure running one launch of ``PARTS`` on prepared inputs."""
    x, dt, A, B, C = args
    cfg = design(args, q, {kernel: changes} if kernel != "cumsum" else {})["config"]
    heads = defaults(x.device).stages.cumsum_heads
    dt_c, dA_cs = unfused.chunk_cumsum(dt, A, q, kw["dt_bias"], True, heads=heads)
    if kernel == "cumsum":
        return lambda: unfused.chunk_cumsum(dt, A, q, kw["dt_bias"], True, heads=heads)
    if kernel == "states":
        return lambda: states.chunk_states(x, B, dt_c, dA_cs, config=cfg.states)
    H, _ = states.chunk_states(x, B, dt_c, dA_cs, config=cfg.states)
    return lambda: outputs.chunk_outputs(x, C, B, dt_c, dA_cs, H, kw["D"], config=cfg.outputs)


def _compare_parts(args, kw, shape, limit):
    for name, q, kernel, changes in PARTS:
        if left(limit) < 8:
            continue
        try:
            f = part_fn(kernel, q, changes, args, kw)
            row(section="part", shape=shape, design=f"{name} q{q}", ms=time_ms(f))
        except Exception as e:  # noqa: BLE001
            row(section="part", shape=shape, design=f"{name} q{q}",
                error=f"{type(e).__name__}: {e}"[:300])


def decode(gpu, limit):
    """Section 3: the decode step's tiles at b1 (graph) and b64 (eager, graph), fp32 state."""
    theirs = bstep.load_mamba_ssm_step() if gpu else None
    dev = "cuda" if gpu else "cpu"
    tiles = [None, (4, 4, False), (16, 4, False), (16, 4, True), (8, 4, False), (32, 8, True),
             (32, 8, False), (64, 8, True), (16, 8, True)]
    for b in ((1, 64) if gpu else (2,)):
        if left(limit) < 15:
            row(section="step", b=b, error="skipped: time limit")
            continue
        h, p, n = (80, 64, 128) if gpu else (2, 4, 8)
        inp = bstep.mamba2_step_inputs(b, h, p, n, torch.float32, device=dev)
        fl = bstep.floor_ms(b, h, p, n, torch.float32)
        fns = {"mamba_ssm": (lambda i=inp: theirs(**i))} if theirs is not None else {}
        for t in tiles:
            tune = {} if t is None else dict(block_p=t[0], num_warps=t[1], stream=t[2])
            fns[f"ours {t or 'default'}"] = (lambda tune=tune, i=inp:
                                             selective_state_update(
                                                 **i, config=StepConfig(**tune)))
        for name, f in fns.items():
            r = dict(eager=time_ms(f))
            if gpu:
                r["graph"] = bstep.graph_ms(f)
            row(section="step", b=b, backend=name, floor_ms=fl, **r)


def ncu(limit):
    """Section 4: Nsight Compute over the default fused forward (two kernels) at b4 l4096."""
    if left(limit) < 45:
        return row(section="ncu", error="skipped: time limit")
    metrics = ",".join([
        "gpu__time_duration.sum", "launch__registers_per_thread", "launch__grid_size",
        "launch__occupancy_limit_registers", "sm__warps_active.avg.pct_of_peak_sustained_active",
        "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum",
        "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio"])
    code = ("import torch; from course.bench.ssd import make_inputs; "
            "from mambalearn.mamba2.fused.forward import ssd_fused_forward as f; "
            "a, kw = make_inputs(4, 4096, 80, 64, 1, 128); "
            "[f(*a, 256, **kw) for _ in range(3)]; torch.cuda.synchronize()")
    cmd = ["ncu", "--clock-control", "none", "--csv", "--page", "raw", "--metrics", metrics,
           "-k", "regex:_chunk_(states|outputs|cumsum)_kernel", "--launch-skip", "6",
           "--launch-count", "3", sys.executable, "-c", code]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(20, left(limit) - 10))
        out = os.path.join(os.environ.get("OUT", "/tmp"), "ncu_fused.csv")
        open(out, "w").write(r.stdout)
        lines = [x for x in r.stdout.splitlines() if x.startswith('"')]
        row(section="ncu", csv=out, lines=len(lines), stderr=r.stderr[-500:])
        print("\n".join(lines[:8]), flush=True)
    except Exception as e:  # noqa: BLE001
        row(section="ncu", error=f"{type(e).__name__}: {e}"[:300])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=240)
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sections", default="correct,speed,step")
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    run = dict(correct=lambda: correctness(gpu), speed=lambda: speed(gpu, a.limit),
               step=lambda: decode(gpu, a.limit), compare=lambda: compare(gpu, a.limit))
    for name in a.sections.split(","):  # in the order given
        if left(a.limit) > 10:
            run[name]()
    if a.ncu and gpu:
        ncu(a.limit)
    if a.json:
        json.dump(ROWS, open(a.json, "w"), indent=1)
    print(f"\n== {time.time() - T0:.0f} s; speed (ms, vs mamba_ssm, vs FLA, rel to unfused):")
    for r in ROWS:
        if r.get("section") in ("speed", "compare", "part") and "ms" in r:
            f = lambda k, r=r: "-" if r.get(k) is None else f"{r[k]:.3g}"
            print(f"{r['shape']:10s} {r['design']:42s} {r['ms']:7.3f} {f('vs_mamba'):>6s} "
                  f"{f('vs_fla'):>6s} {f('rel_unfused'):>8s}")
        elif r.get("section") in ("peers", "step") or r.get("design") == "peers":
            print(json.dumps(r))


if __name__ == "__main__":
    main()
