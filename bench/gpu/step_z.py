"""Device script: the decode step with and without z — its load order and tiles, against mamba_ssm.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.step_z --limit 120 --out $OUT
    python3 -m bench.gpu.step_z --cpu-smoke --out /tmp/step_z   (the control flow, toy sizes, CPU)
    python3 -m bench.gpu.step_z --waits --out /tmp/step_z   (no GPU: every variant and mamba_ssm's
        kernel built for sm_90, each program's waits for memory counted in its SASS)

The question: how close the decode step comes to its floor at b64 (bandwidth) and how much faster
it can be at b1 (latency), h80 p64 n128, fp32 state, against mamba_ssm in one process. The floors
and the expectations per variant: ``bench/NOTES_step.md``. Timed here, in one process:

- **the default**: whatever ``_tile`` chooses (b1: 4 × 128 tiles over one warp; b64: 32 × 128
  over 8 warps, the state streamed past L2) on the one-axis grid;
- **the 3-D grid** (``StepConfig(grid_3d=True)``): the hardware numbers the (tile, head, batch)
  blocks, so the program does not divide its number back into the three (the sm_90 build of the
  default issues its first load after ~100 instructions of integer division, the 3-D grid's
  after 25), on a sweep of tiles (block_p × warps; the n axis is never split);
- **the floor**: ``state.mul_(1.0)``, torch's in-place elementwise kernel over the same state —
  the same bytes read and written with no math: what touching the state costs at all (not a
  variant, not checked; it bounds what any tile can reach);
- **mamba_ssm**'s ``selective_state_update`` (its source tree, ``course.bench.step``; it has no
  autotuner: its tile is fixed by hand), called with the same arguments.

Inputs: ``bench.gpu.peers.step_inputs`` (``mamba2_step_inputs``: fp32 state, bf16 x/B/C, fp32
A/D/dt_bias broadcast per head as Mamba-2's step passes them, softplus; with z: (b, h, p) bf16).
Each variant is first checked against the float64 oracle ``inference.decode_step`` (output and
new state); a variant that fails is reported and not timed. Then, per (shape, z), every variant
and mamba_ssm as one call per CUDA graph and as 20 calls per graph (each graph with its own copy
of the state) in one ``mambalearn.timing.compare`` (each callable warmed ≥ 1 s, 5 interleaved
rounds of ``do_bench``; ratio = median of the per-round ratios to mamba_ssm, spread = (max −
min)/median), and at b1 each kernel's own device time from ``torch.profiler`` over replays of its
one-call graph (``bench.gpu.peers.kernel_ms``). The cases run in the order of what matters most
(b1 with z, b64 without, b1 without; b64 with z is not run); each starts only while ``--limit``
leaves it the time it needs, dropping the last variants of its list first (a row says so).

Last, ``choose``: for each shape the variant with the lowest geometric mean of its ratios to
mamba_ssm (over z and both graph sizes), and the settings of ``step`` (FILL, VALUES_PER_WARP,
TILE_SMALL, TILE_LARGE) under which ``_tile`` picks it — what the lead sets. Results:
``$OUT/<device>_step_z_<date>.json`` (``bench.gpu.record``), then a short table.

Expected on an H200 (before the run, from the sm_90 builds; bench/NOTES_step.md): the 3-D grid
takes the integer divisions (≈ 150–200 dependent cycles) off the path to the first load: ≈ 0.1 µs
off the b1 kernel (≈ 2.8 µs), a few per cent; nothing measurable at b64, which is bound by DRAM
(default ≈ 94 % of the copy bandwidth). At b64 the floor row says what is left: 0.85× of
mamba_ssm needs ≈ 97 % of the copy bandwidth. At b1 the floor row says how much of one call a
graph is the launch and the cold L2 rather than the kernel.
"""

import argparse
import json
import math
import os
import re
import sys
import time
import traceback

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
if __name__ == "__main__" and {"--cpu-smoke", "--waits"} & set(sys.argv):  # the interpreter
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

import mambalearn.device  # noqa: E402,F401  (on a CPU: TRITON_INTERPRET=1 before Triton)
from bench.gpu.record import Run  # noqa: E402

T0 = time.time()
SHAPES = {"b1": (1, 80, 64, 128), "b64": (64, 80, 64, 128)}  # (b, h, p, n)
# --cpu-smoke: toy sizes with the GPU's n (so every launch has the GPU run's constexprs)
SMOKE_SHAPES = {"b1": (1, 2, 5, 128), "b64": (2, 2, 5, 128)}
# (shape, with z), in order; b64 with z (0.82-0.86x of mamba_ssm in the last sweep, no target)
# is left out for the time limit
CASES = [("b1", True), ("b64", False), ("b1", False)]
CALLS = (1, 20)  # calls a CUDA graph
# the variants of each shape, most wanted first (the time limit drops from the end): name ->
# StepConfig fields; "default" is whatever _tile picks now (a listed tile equal to it is not
# timed twice); "3d" = the 3-D grid
G3 = dict(grid_3d=True)  # the (tiles, heads, batch) grid: no division before the first load
# "new": the 3-D grid, D one scalar a head, the softplus from ex2/lg2 (StepConfig's fields);
# "+pdl": launched with programmatic dependent launch too
NEW = dict(grid_3d=True, scalar_d=True, fast_softplus=True)
NEWP = dict(NEW, pdl=True)
VARIANTS = {
    "b1": [("default", {}),  # 4x1 (TILE_SMALL)
           ("4x1 new+pdl", dict(block_p=4, num_warps=1, **NEWP)),
           ("4x1 new", dict(block_p=4, num_warps=1, **NEW)),
           ("4x1 3d D1", dict(block_p=4, num_warps=1, grid_3d=True, scalar_d=True)),
           ("2x1 new+pdl", dict(block_p=2, num_warps=1, **NEWP)),  # every load in one round
           ("8x1 new+pdl", dict(block_p=8, num_warps=1, **NEWP)),  # 32 values a thread
           ("4x1 3d", dict(block_p=4, num_warps=1, **G3))],
    "b64": [("default", {}),  # 32x8 stream (TILE_LARGE)
            ("32x8 new", dict(block_p=32, num_warps=8, **NEW)),
            ("32x8 new+pdl", dict(block_p=32, num_warps=8, **NEWP)),
            ("8x2 new", dict(block_p=8, num_warps=2, **NEW)),  # 32 blocks an SM: 64 warps
            ("4x1 new", dict(block_p=4, num_warps=1, **NEW)),
            ("16x4 new", dict(block_p=16, num_warps=4, **NEW))],
}
EXTRA = ("grid_3d", "scalar_d", "fast_softplus", "pdl")  # StepConfig fields _tile does not choose
MIN_VARIANTS = 2  # a case runs with at least the default and the first candidate, or not at all
FLOOR = "state.mul_ (floor)"  # torch's in-place multiply of the state: the same bytes, no math
SECONDS_A_CALLABLE = (1.3, 0.2)  # (GPU, CPU): warm-up 1 s + 5 rounds of do_bench (30 ms)
SECONDS_COMPILE = (1.0, 0.3)  # a variant's Triton build (each (shape, z) builds its own)
SECONDS_FIXED = (4.0, 1.0)  # a case's inputs, oracle and graph captures
SECONDS_PROFILE = 0.5  # one kernel's profile (b1 only)
TOL = {"out": 1e-2, "state": 1e-4}  # rel. error vs the float64 oracle (out is bf16, state fp32)
METHOD = (
    "mambalearn.timing.compare per (shape, z): every callable warmed >= 1 s, then 5 interleaved "
    "rounds of triton.testing.do_bench (median, 30 ms each; do_bench clears L2 before each "
    "replay); ms = ms a call (graph time / calls), the median over the rounds; ratio = the median "
    "of the per-round ratios ours / mamba_ssm at the same calls a graph, spread = (max - min) / "
    "median of them; vs_default = the same against the default. 'graph1' = one call a CUDA "
    "graph, 'graph20' = 20 calls a graph, each graph on its own copy of the state. Inputs: "
    "bench.gpu.peers.step_inputs (fp32 state, bf16 x/B/C, fp32 A/D/dt_bias broadcast per head "
    "as Mamba-2's step passes them, softplus; 'with z': z (b, h, p) bf16). 'kernel' = the "
    "kernel's own device time under torch.profiler over 200 replays of the one-call graph. "
    "'check' = rel. error of the output and the new state against inference.decode_step in "
    "float64 (a variant that fails is not timed). Variants: StepConfig fields (block_p x "
    "num_warps, stream, grid_3d: '3d' = a (tiles, heads, batch) grid instead of one axis "
    "divided back into the three). 'state.mul_ (floor)' = torch's in-place state.mul_(1.0) on "
    "the same state, graphed and timed the same way (not a variant, not checked): the cost of "
    "reading and writing the state with no math. 'choose' = per shape, the variant with the "
    "lowest geometric mean of its ratios to mamba_ssm over z and both graph sizes.")

WAITS_METHOD = (
    "--waits: each variant launched once in Triton's interpreter at b1 (b64's tiles: b2) h8 p64 "
    "n128 with the GPU run's constexprs, the launch recorded (mambalearn.launches, integer "
    "arguments divisible by 16 marked so, as the GPU specialises them), built for sm_90 "
    "(mambalearn.compiled: Triton 3.6's ptxas, no GPU); waits = rounds of global loads in the "
    "straight-line SASS: a round ends at the first instruction that reads a register an LDG of "
    "the round wrote, or at a barrier while loads are in flight; loads_after_first_wait = LDGs "
    "issued after the first such wait.")



def resolved(shape, fields):
    """The launch a variant makes at ``shape``: StepConfig fields with _tile's choice filled in
    (block_p, num_warps, stream, loads_first)."""
    from mambalearn.mamba2 import step

    b, h, p, n = shape
    bp, nw, st = step._tile(p, n, b * h * p * n)
    return dict(block_p=fields.get("block_p", bp), num_warps=fields.get("num_warps", nw),
                stream=fields.get("stream", st), loads_first=fields.get("loads_first", True),
                grid_3d=fields.get("grid_3d", False), scalar_d=fields.get("scalar_d", False),
                fast_softplus=fields.get("fast_softplus", False), pdl=fields.get("pdl", False))


def describe_tile(tile):
    return (f"{tile['block_p']}x{tile['num_warps']}" + (" stream" if tile["stream"] else "")
            + ("" if tile["loads_first"] else " late D,z") + (" 3d" if tile["grid_3d"] else "")
            + (" D1" if tile["scalar_d"] else "") + (" fsp" if tile["fast_softplus"] else "")
            + (" pdl" if tile["pdl"] else ""))


def variants_at(name):
    """[(variant name, resolved tile)] of a shape, a tile listed twice kept once (first name).
    The tiles are those of the GPU's shape even in a smoke run, so that the smoke run launches
    (and records, for the sm_90 build check) exactly the GPU run's builds."""
    out, seen = [], set()
    for label, fields in VARIANTS[name]:
        tile = resolved(SHAPES[name], fields)
        key = tuple(sorted(tile.items()))
        if key not in seen:
            seen.add(key)
            out.append((label, tile))
    return out


def check(run, fn, inp, want, s64, label, backend, tile=None, twice=None):
    """The variant's output and new state against the oracle, and on a GPU the state after two
    calls replayed from one CUDA graph against ``twice`` (two oracle steps: the second call must
    wait for the first, which a launch that overlaps its predecessor could get wrong): True if
    all within TOL; an exception is a failed check."""
    from bench.gpu.peers import rel

    a = {k: v for k, v in inp.items() if k != "state"}
    s = inp["state"].clone()
    try:
        out = fn(s, **a)
        errs = dict(rel_err=rel(out, want), state_rel_err=rel(s, s64))
        if run.gpu and twice is not None:
            s2 = inp["state"].clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn(s2, **a)
                fn(s2, **a)
            graph.replay()
            torch.cuda.synchronize()
            errs["graph2_state_rel_err"] = rel(s2, twice)
    except Exception as e:  # noqa: BLE001 - reported, and the variant is not timed
        run.keep(op="step_z check", **label, backend=backend, check="FAILED",
                 tile=describe_tile(tile) if tile else None,
                 error=f"{type(e).__name__}: {str(e)[:200]}")
        return False
    ok = errs["rel_err"] < TOL["out"] and all(
        v < TOL["state"] for k, v in errs.items() if k != "rel_err")
    run.keep(op="step_z check", **label, backend=backend, **errs,
             tile=describe_tile(tile) if tile else None, check="ok" if ok else "FAILED")
    return ok


def case(run, name, with_z, peer, variants):
    """One (shape, z): checks, then every variant and mamba_ssm graphed and timed together."""
    from bench.gpu.peers import graphs_compared, kernel_ms, step_inputs
    from course.bench.step import floor_ms
    from mambalearn import inference
    from mambalearn.mamba2.step import StepConfig, selective_state_update

    shape = (SMOKE_SHAPES if run.smoke else SHAPES)[name]
    b, h, p, n = shape
    inp = step_inputs(b, h, p, n, with_z, "cuda" if run.gpu else "cpu")
    a = {k: v for k, v in inp.items() if k != "state"}
    label = dict(shape=f"b{b} h{h} p{p} n{n} fp32 state", z="with z" if with_z else "without z")
    s64 = inp["state"].double()
    want = inference.decode_step(s64, *(a[k].double() for k in ("x", "dt", "A", "B", "C", "D")),
                                 a["z"].double() if with_z else None, a["dt_bias"].double(), True)
    twice = s64.clone()  # the state after two steps
    inference.decode_step(twice, *(a[k].double() for k in ("x", "dt", "A", "B", "C", "D")),
                          a["z"].double() if with_z else None, a["dt_bias"].double(), True)
    sides = {}  # backend name -> callable(state, **args)
    tiles = {}
    for label_v, tile in variants:
        cfg = StepConfig(**tile)
        fn = lambda s, cfg=cfg, **kw: selective_state_update(s, **kw, config=cfg)  # noqa: E731
        if check(run, fn, inp, want, s64, label, label_v, tile, twice):
            sides[label_v], tiles[label_v] = fn, tile
    if peer is not None and check(run, peer, inp, want, s64, label, "mamba_ssm", twice=twice):
        sides["mamba_ssm"] = peer
    # not a variant (its output is not the step's): what touching the state costs at all
    sides[FLOOR] = lambda s, **kw: s.mul_(1.0)
    calls = CALLS if run.gpu else (1, 2)
    eager, fns, c = graphs_compared(sides, inp, calls, run.gpu, rep=30)
    floor = floor_ms(b, h, p, n, torch.float32)
    base = "default" if "default" in sides else None
    for k in calls:
        for side in sides:
            r = c.ratio(f"{side} graph{k}", f"mamba_ssm graph{k}") \
                if side != "mamba_ssm" and "mamba_ssm" in sides else (None, None)
            vs = c.ratio(f"{side} graph{k}", f"{base} graph{k}")[0] \
                if base and side != base else None
            run.keep(op=f"step_z graph{k}", **label, backend=side,
                     tile=describe_tile(tiles[side]) if side in tiles else None,
                     ms=c.ms(f"{side} graph{k}") / k, ratio=r[0], spread=r[1], vs_default=vs,
                     floor_ms=floor)
    if not run.gpu or name != "b1":
        return
    alone = {}
    for side in sides:  # the kernel alone: its device time in the profile
        if run.left() < SECONDS_PROFILE + 1:
            run.keep(op="step_z kernel", **label, backend=side, error="skipped: time limit")
            continue
        alone[side] = kernel_ms(fns[f"{side} graph1"])[0]
        if alone[side] is None:  # (a profiler that sees no kernel inside a graph: eager calls)
            alone[side] = kernel_ms(eager[side, 1])[0]
    theirs = alone.get("mamba_ssm")
    for side, ms in alone.items():
        if ms is None:
            run.keep(op="step_z kernel", **label, backend=side, error="no kernel in the profile")
            continue
        run.keep(op="step_z kernel", **label, backend=side,
                 tile=describe_tile(tiles[side]) if side in tiles else None, ms=ms,
                 ratio=ms / theirs if theirs and side != "mamba_ssm" else None)


def need(run, name, count):
    """Seconds a case of ``count`` variants (and the peer and the floor) needs at ``name``."""
    i = 0 if run.gpu else 1
    seconds = (SECONDS_FIXED[i] + 2 * (count + 2) * SECONDS_A_CALLABLE[i]
               + count * SECONDS_COMPILE[i])
    return seconds + ((count + 2) * SECONDS_PROFILE if name == "b1" and run.gpu else 0)


def cases(run, peer):
    for name, with_z in CASES:
        shape = (SMOKE_SHAPES if run.smoke else SHAPES)[name]
        label = dict(shape="b{} h{} p{} n{} fp32 state".format(*shape),
                     z="with z" if with_z else "without z")
        variants = variants_at(name)
        # the cases still to come get at least their minimum: this one takes what is left
        later = sum(need(run, nm, MIN_VARIANTS)
                    for nm, _ in CASES[CASES.index((name, with_z)) + 1:])
        fit = len(variants)
        while fit > MIN_VARIANTS and need(run, name, fit) > run.left() - later:
            fit -= 1
        if need(run, name, fit) > run.left():
            run.keep(op="step_z", **label, error="skipped: time limit")
            continue
        if fit < len(variants):
            run.keep(op="step_z", **label, note="left out for the time limit: " + ", ".join(
                v for v, _ in variants[fit:]))
        try:
            with torch.no_grad():
                case(run, name, with_z, peer, variants[:fit])
        except Exception as e:  # noqa: BLE001 - a row says what failed; the next case runs
            traceback.print_exc()
            run.keep(op="step_z", **label, error=f"{type(e).__name__}: {str(e)[:300]}")
        if run.gpu:
            torch.cuda.empty_cache()


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def settings_for(targets):
    """Settings of ``mambalearn.mamba2.step`` under which ``_tile`` picks each target
    ({shape name: (block_p, num_warps, stream)}): a dict of the module's names to set (the fewest
    changes first), or None if no candidate does."""
    import itertools

    from mambalearn.mamba2 import step

    names = ("FILL", "VALUES_PER_WARP", "TILE_SMALL", "TILE_LARGE")
    now = {k: getattr(step, k) for k in names}
    cand = {"FILL": [now["FILL"], 0, 1, 2, 4, 8, 16, 32],
            "VALUES_PER_WARP": [now["VALUES_PER_WARP"], 32, 64, 128, 256, 512, 1024]}
    small = [now["TILE_SMALL"]] + [(v, w, False) for v in (8192, 4096, 2048, 1024, 512, 256)
                                   for w in (1, 2, 4, 8, 16)]
    large = [now["TILE_LARGE"]] + [(v, w, s) for v in (8192, 4096, 2048, 1024, 512, 256)
                                   for w in (1, 2, 4, 8, 16) for s in (True, False)]
    best = None
    try:
        for combo in itertools.product(cand["FILL"], cand["VALUES_PER_WARP"], small, large):
            setting = dict(zip(names, combo, strict=True))
            for k, v in setting.items():
                setattr(step, k, v)
            if all(step._tile(p, n, b * h * p * n) == want
                   for (b, h, p, n), want in targets.values()):
                changed = {k: v for k, v in setting.items() if v != now[k]}
                if best is None or len(changed) < len(best):
                    best = changed
                    if not changed:
                        break
    finally:
        for k, v in now.items():
            setattr(step, k, v)
    return best


def choose(run):
    """Per shape, the variant with the lowest geometric mean of its ratios to mamba_ssm, and the
    step settings that make _tile pick it at the GPU's shape (b1 and b64 h80 p64 n128)."""
    targets, extra = {}, {}
    for name, shape in (SMOKE_SHAPES if run.smoke else SHAPES).items():
        label = "b{} h{} p{} n{} fp32 state".format(*shape)
        ratios, tiles = {}, {}
        for r in run.rows:
            if r["op"].startswith("step_z graph") and r.get("shape") == label and "tile" in r:
                key = r["backend"]
                ratios.setdefault(key, []).append(r.get("ratio", r["ms"]))  # (CPU: ms)
                tiles[key] = r["tile"]
        if not ratios:
            run.keep(op="step_z choose", shape=label, error="nothing timed at this shape")
            continue
        most = max(len(v) for v in ratios.values())  # only variants timed in every case
        scores = {k: geomean(v) for k, v in ratios.items() if len(v) == most}
        win = min(scores, key=scores.get)
        default = scores.get("default")
        run.keep(op="step_z choose", shape=label, backend=win, tile=tiles[win],
                 score=scores[win], default_score=default,
                 over="geometric mean of " + ("ratios to mamba_ssm" if run.gpu else "ms (CPU)")
                 + f" over {most} timings (z, graph1/graph20)")
        for _, tile in variants_at(name):
            if describe_tile(tile) == tiles[win]:
                if tile["loads_first"]:
                    targets[name] = (SHAPES[name], (tile["block_p"], tile["num_warps"],
                                                    tile["stream"]))
                    extra[name] = [k for k in EXTRA if tile[k]]
                break
    if targets:
        setting = settings_for(targets)
        # the StepConfig fields every winner has on: the launcher should take None as on
        on = set.intersection(*(set(v) for v in extra.values())) if extra else set()
        run.keep(op="step_z choose", backend="mambalearn.mamba2.step settings",
                 shapes=", ".join(targets),
                 set="nothing: _tile already picks the winners" if setting == {} else
                 json.dumps(setting) if setting else "no FILL/VALUES_PER_WARP/TILE_* setting "
                 "picks them all: change _tile",
                 on_by_default=", ".join(k for k in EXTRA if k in on) or "none",
                 fields=json.dumps(extra))


def table(rows):
    """The short table printed last: a line per (shape, backend) — µs a call and the ratio to
    mamba_ssm, one call and 20 calls a graph, and the kernel alone, with z and without — then
    the choice and whatever failed."""
    cells = {}
    for r in rows:
        if "ms" in r and r["op"].startswith("step_z ") and r["op"] != "step_z check":
            key = (r["shape"].split()[0], r["backend"])
            cell = cells.setdefault(key, {"tile": r.get("tile", "")})
            ratio = f"{r['ratio']:.2f}" if r.get("ratio") is not None else "-"
            cell[r["z"], r["op"][7:]] = f"{r['ms'] * 1e3:.2f} {ratio}"
    kinds = sorted({key[1] for cell in cells.values() for key in cell if key != "tile"},
                   key=lambda k: (k == "kernel", len(k), k))  # graph1, graph20, kernel
    head = "".join(f"{z + ' ' + k:>15}" for z in ("z", "no z") for k in kinds)
    lines = ["µs a call and ratio to mamba_ssm", f"{'':<4}{'backend':<15}{'tile':<27}{head}"]
    for (shape, backend), cell in cells.items():
        lines.append(f"{shape:<4}{backend[:14]:<15}{cell['tile'][:26]:<27}" + "".join(
            f"{cell.get((z, k), '-'):>15}" for z in ("with z", "without z") for k in kinds))
    for r in rows:
        if r["op"] == "step_z choose" or "error" in r or str(r.get("check", "ok")) != "ok":
            lines.append(json.dumps(r, ensure_ascii=False)[:300])
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# --waits: how often each variant's program waits for memory, from its sm_90 build (no GPU)
INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
REG = re.compile(r"\bR(\d+)(\.64)?")


def _registers(operand):
    return [int(m.group(1)) + i for m in REG.finditer(operand)
            for i in range(2 if m.group(2) else 1)]


def load_waits(sass):
    """(waits, loads issued after the first wait, loads) of a straight-line SASS listing: a wait
    is the first instruction that reads a register a global load (LDG) wrote since the last wait,
    or a barrier while loads are in flight; the waits that end a round of loads are counted."""
    pending, rounds, in_round, loads, late, waited = set(), 0, False, 0, 0, False
    for m in INS.finditer(sass):
        op, ops = m.group(2), [a.strip() for a in m.group(3).split(",") if a.strip()]
        writes = not op.startswith(("ST", "RED", "ATOM", "BAR", "EXIT", "BRA", "MEMBAR"))
        dst = _registers(ops[0]) if writes and ops else []
        src = [r for a in (ops[1:] if writes else ops) for r in _registers(a)]
        if pending and (pending & set(src) or op.startswith("BAR")):
            rounds += in_round
            pending, in_round, waited = set(), False, True
        if op.startswith("LDG"):
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            pending |= set(range(dst[0], dst[0] + width))
            in_round, loads, late = True, loads + 1, late + waited
        else:
            pending -= set(dst)
    return rounds + in_round, late, loads


def waits(run, out_dir):
    """Every variant of both shapes (with and without z) launched once in the interpreter at
    b1/b2 h8 p64 n128 (the GPU run's constexprs; integers divisible by 16 marked so, as the GPU
    specialises them), built for sm_90, and its waits for memory counted in the SASS (each
    listing written to ``out_dir``/sass/)."""
    import inspect
    import tempfile

    from bench.gpu.peers import step_inputs
    from mambalearn import compiled, launches
    from mambalearn.mamba2.step import StepConfig, selective_state_update

    if os.environ.get(launches.ENV):
        raise SystemExit(f"--waits records launches itself: unset {launches.ENV}")
    folder = tempfile.mkdtemp()
    plain = launches.describe

    def describe(kernel, args, kwargs, grid):  # + the integers the GPU would take as ≡ 0 mod 16
        la = plain(kernel, args, kwargs, grid)
        if la and "unreadable" not in la:
            bound = inspect.signature(kernel.fn).bind_partial(
                *args, **{k: v for k, v in kwargs.items() if k not in launches.OPTIONS})

            def value(path):  # the argument "n", or a tuple's element "x_strides[1]"
                name, *index = re.findall(r"\w+", path)
                v = bound.arguments.get(name)
                for j in index:
                    v = v[int(j)]
                return v

            la["divisible"] = sorted(set(la["divisible"]) | {
                path for k, ty in la["signature"].items() for path, t in launches.leaves(k, ty)
                if t.startswith(("i", "u")) and isinstance(value(path), int)
                and value(path) % 16 == 0})
        return la

    launches.describe = describe
    launches.record(folder)
    names = {}
    for name, b in (("b1", 1), ("b64", 2)):
        for with_z in (True, False):
            for label, tile in variants_at(name):
                inp = step_inputs(b, 8, 64, 128, with_z, "cpu")
                selective_state_update(**inp, config=StepConfig(**tile))
                names[tuple(sorted(tile.items())), with_z] = name, label, describe_tile(tile)
    launches.describe = plain
    found = list(launches.load(folder).values())
    configs = [{"constexprs": la["constexprs"], "signature": la["signature"],
                "divisible": la["divisible"], **la["options"]} for la in found]
    built = compiled.compile_many(found[0]["module"], found[0]["name"], found[0]["source"],
                                  configs)
    for la, res in zip(found, built, strict=True):
        cx, opt = la["constexprs"], la["options"]
        tile = dict(block_p=cx["BLOCK_P"], num_warps=opt.get("num_warps"), stream=cx["STREAM"],
                    loads_first=cx["LOADS_FIRST"], grid_3d=cx["GRID_3D"],
                    scalar_d=cx["SCALAR_D"], fast_softplus=cx["FAST_SP"], pdl=cx["PDL"])
        shape, label, text = names.get((tuple(sorted(tile.items())), cx["HAS_Z"]), ("?", "?", "?"))
        z = "with z" if cx["HAS_Z"] else "without z"
        if isinstance(res, str):
            run.keep(op="step_z waits", shape=shape, z=z, backend=label, tile=text, error=res[:300])
            continue
        w, late, loads = load_waits(res.sass)
        os.makedirs(os.path.join(out_dir, "sass"), exist_ok=True)
        with open(os.path.join(out_dir, "sass", re.sub(r"\W+", "_", f"{shape} {z} {text}")
                               + ".sass"), "w") as f:
            f.write(res.sass)
        run.keep(op="step_z waits", shape=shape, z=z, backend=label, tile=text, waits=w,
                 loads_after_first_wait=late, loads=loads, registers=res.registers,
                 spill_bytes=res.spill_bytes)


def peer_waits(run):
    """mamba_ssm's kernel from its source tree built the same way at b1 h80 p64 n128 (its tile
    at n128: 4 rows, 4 warps; its heuristics' values passed as constexprs, its softplus inlined),
    or a row saying why not."""
    from course.bench import _reference
    from mambalearn import compiled

    root = os.path.abspath(os.environ.get("MAMBA_SSM_PATH") or _reference.DEFAULT)
    path = os.path.join(root, "ops", "triton", "selective_state_update.py")
    if not os.path.exists(path):
        run.keep(op="step_z waits", backend="mamba_ssm", error=f"no source tree at {root}")
        return
    src = open(path).read()
    start = src.index("@triton.jit\ndef _selective_scan_update_kernel")
    kernel = src[start:src.index("\ndef ", start + 20)]
    source = ("@triton.jit\ndef softplus(dt):\n    return tl.math.log(tl.math.exp(dt) + 1)\n\n\n"
              + kernel)  # (its ops/triton/softplus.py under Triton 3)
    params = re.search(r"def _selective_scan_update_kernel\((.*?)\):", kernel, re.S).group(1)
    names = [a.split(":")[0].strip() for a in re.sub(r"#.*", "", params).split(",") if a.strip()]
    b, h, p, n = SHAPES["b1"]
    pointers = dict(state_ptr="*fp32", x_ptr="*bf16", dt_ptr="*bf16", dt_bias_ptr="*fp32",
                    A_ptr="*fp32", B_ptr="*bf16", C_ptr="*bf16", D_ptr="*fp32", z_ptr="*bf16",
                    out_ptr="*bf16")
    # the integers of the call with mamba2_step_inputs' layout (per-head scalars with stride 0)
    ints = dict(batch=b, nheads=h, dim=p, dstate=n, nheads_ngroups_ratio=h,
                stride_state_batch=h * p * n, stride_state_head=p * n, stride_state_dim=n,
                stride_state_dstate=1, stride_x_batch=h * p, stride_x_head=p, stride_x_dim=1,
                stride_dt_batch=h, stride_dt_head=1, stride_dt_dim=0, stride_dt_bias_head=1,
                stride_dt_bias_dim=0, stride_A_head=1, stride_A_dim=0, stride_A_dstate=0,
                stride_B_batch=n, stride_B_group=n, stride_B_dstate=1, stride_C_batch=n,
                stride_C_group=n, stride_C_dstate=1, stride_D_head=1, stride_D_dim=0,
                stride_z_batch=h * p, stride_z_head=p, stride_z_dim=1, stride_out_batch=h * p,
                stride_out_head=p, stride_out_dim=1)
    for with_z in (True, False):
        sig, cx, div = {}, {}, []
        for name in names:
            if name in pointers and (with_z or name != "z_ptr"):
                sig[name] = pointers[name]
                div.append(name)
            elif name in ints and ints[name] != 1:
                sig[name] = "i32"
                div += [name] if ints[name] % 16 == 0 else []
            else:  # None pointers, integers 1 (Triton folds both), the constexprs
                sig[name] = "constexpr"
                cx[name] = 1 if name in ints else None
        cx.update(DT_SOFTPLUS=True, TIE_HDIM=True, BLOCK_SIZE_M=4, HAS_DT_BIAS=True, HAS_D=True,
                  HAS_Z=with_z, HAS_STATE_BATCH_INDICES=False, BLOCK_SIZE_DSTATE=n)
        res = compiled.compile_many("mamba_ssm_step", "_selective_scan_update_kernel", source,
                                    [dict(constexprs=cx, signature=sig, divisible=div,
                                          num_warps=4, num_stages=3)])[0]
        z = "with z" if with_z else "without z"
        if isinstance(res, str):
            run.keep(op="step_z waits", shape="b1", z=z, backend="mamba_ssm", error=res[-300:])
            continue
        w, late, loads = load_waits(res.sass)
        run.keep(op="step_z waits", shape="b1", z=z, backend="mamba_ssm", tile="4x4", waits=w,
                 loads_after_first_wait=late, loads=loads, registers=res.registers,
                 spill_bytes=res.spill_bytes)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=120.0, help="seconds for the whole run")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"), help="results folder")
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes, interpreter: a test")
    ap.add_argument("--waits", action="store_true",
                    help="no timing: each variant built for sm_90 here, its waits for memory "
                         "counted in the SASS (a CPU is enough)")
    args = ap.parse_args(argv)
    global T0  # (the timed run's clock starts here)
    if args.waits:
        run = Run(args.limit, True, T0)
        waits(run, args.out)
        peer_waits(run)
        from bench.gpu.record import record

        record("step_z_waits", run.rows, command="python3 -m bench.gpu.step_z " + " ".join(argv),
               peers={}, out_dir=args.out, method=WAITS_METHOD)
        return run.rows
    if not torch.cuda.is_available() and not args.cpu_smoke:
        raise SystemExit("no GPU: run with --cpu-smoke for the control flow at toy sizes")
    T0 = time.time()
    run = Run(args.limit, args.cpu_smoke, T0)
    from bench.gpu.peers import log

    log(torch.cuda.get_device_name() if run.gpu else "CPU smoke run (Triton's interpreter)")
    peer = None
    if run.gpu:
        from course.bench.step import load_mamba_ssm_step

        peer = load_mamba_ssm_step()
    if peer is None:
        run.keep(op="step_z", backend="mamba_ssm", error="not timed: " + (
            "its source tree did not load (course.bench._reference printed why)" if run.gpu
            else "its launcher needs CUDA (torch.cuda.device)"))
    cases(run, peer)
    choose(run)
    from bench.gpu.record import record

    peers = {}
    if any(r.get("backend") == "mamba_ssm" and "ms" in r for r in run.rows):
        from bench.gpu.peers import peers_meta

        peers = {"mamba_ssm": peers_meta(run)["mamba_ssm"].split(" (")[0]
                 + " (its source tree: ops.triton.selective_state_update)"}
    path = record("step_z", run.rows, command="python3 -m bench.gpu.step_z " + " ".join(argv),
                  peers=peers, out_dir=args.out, method=METHOD, baseline="mamba_ssm")
    print(f"\n== {time.time() - T0:.0f} s, {len(run.rows)} rows: {path}\n" + table(run.rows),
          flush=True)
    return run.rows


if __name__ == "__main__":
    main()
