"""Device script: the MIMO prefill's variants against our SISO, and its deterministic mode.

At b8 l2048 h32 g1 p64 n128 na32, bf16 (the SISO benchmark shape), in one process, these parts
while ``--limit`` allows (the clock is checked before each part, each variant and each timing;
the order: rank 1; rank 4 old launch, p16 and q8; deterministic on the old launch; p32;
deterministic on the fastest variant):

    1. rank 1: SISO (chunk 64) vs MIMO rank 1 on the SISO kernels (``config.rank_one="siso"``,
       the default now) vs on the MIMO kernels (``rank_one="mimo"``, the old path), chunk 64;
    2. rank 4: SISO vs MIMO rank 4 at chunk 16 with the old launch (``MIMO_DEFAULT``) and each
       variant of ``VARIANTS`` (channel blocks, warps, stages, q/k held as dot operands);
    3. deterministic: MIMO rank 4, default vs ``deterministic=True`` with the dQ/dK sum by heads
       (``det_sum="heads"``, new) and by the in-loop tree (``"tree"``, old), on the default launch
       and on the fastest variant of part 2: fwd+bwd 3× each, bitwise against the first run.

Every variant is checked before it is timed: output and every gradient against the float64
chunked oracle at b1 l200 (a partial last chunk; random per-rank weights); a variant over
``TOL`` is reported and not timed. Timings: ``mambalearn.timing.compare`` (each callable warmed
≥ 1 s, 5 interleaved rounds, median; ratios are medians of per-round ratios), forward under
no_grad and forward+backward. Rows go to OUT/<device>_mimo_speed_<date>.json
(``bench.gpu.record``), even when the run is cut short; a short table comes last.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.mimo_speed --limit 120 --out $OUT   (H200)
    python3 -m bench.gpu.mimo_speed --cpu-smoke --out /tmp/out          (any machine, interpreter)
"""

import argparse
import functools
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

SHAPE = dict(b=8, l=2048, h=32, g=1, p=64, n=128, na=32)
SMOKE = dict(b=1, l=40, h=2, g=1, p=32, n=16, na=4)
TOL = {torch.bfloat16: 5e-2, torch.float32: 1e-4}
AGREE_L = 200
NAMES = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "MIMO_V", "MIMO_Z", "MIMO_Out",
         "Angles", "D", "Z")
# rank 4: name → (chunk, the changes to MIMO_DEFAULT), most promising first (each costs its
# compiles). sm_90 builds on the CPU, bf16 p64 n128: registers / spill bytes per thread / shared
# memory a program (bench/NOTES_mimo.md); the old launch: forward 255 / 264 B / 185 KB, backward
# 255 / 6.7 KB / 104 KB, 256 programs, one an SM
VARIANTS = {
    # forward 255 / 96 B / 52 KB (two an SM), backward 8 warps 255 / 2.2 KB / 78 KB; 1024 programs
    "p16": (16, dict(forward_p_block=16, forward_warps=4, forward_stages=1,
                     backward_p_block=16, qk_live="dot")),
    # 32-row tiles (mma.sync), twice the chunks a program walks: forward p32 4 warps 255 / 56 B /
    # 32 KB, backward p16 4 warps 255 / 1.4 KB / 40 KB (two an SM each); 512 / 1024 programs
    "q8": (8, dict(forward_p_block=32, forward_warps=4, forward_stages=1, backward_p_block=16,
                   backward_warps=4, qk_live="dot")),
    # forward 255 / 416 B / 56 KB (two an SM), backward 255 / 4.1 KB / 92 KB; 512 programs
    "p32": (16, dict(forward_p_block=32, forward_warps=4, forward_stages=1,
                     backward_p_block=32, qk_live="dot")),
}
# seconds a step needs at least on an H200 before it starts (compiles, checks, timings), and
# a callable's share of a timing (fwd and fwd+bwd: two warm-ups of 1 s, 2 × 5 rounds)
RESERVE = {"rank 1": 40, "rank 4": 35, "variant": 12, "deterministic": 25}
PER_CALLABLE = 5.0


def inputs(b, l, h, g, p, n, na, r, dtype, device, seed=0):
    """MIMO inputs at rank r (None: SISO's layouts); per-rank weights near mamba_ssm's
    initialisation (Ψ = Φ = 1/r, ζ = 1) with random 10 % spreads, so that a fold of the weights
    that drops one of them shows."""
    gen = torch.Generator().manual_seed(seed)
    rr = lambda *s: torch.randn(*s, generator=gen)
    DT = torch.nn.functional.softplus(rr(b, h, l) - 2.0)  # Δ ≈ 0.1
    A = -torch.nn.functional.softplus(rr(b, h, l))
    qk = (b, l, g, n) if r is None else (b, l, r, g, n)
    bias = (h, n) if r is None else (h, r, n)
    x = dict(Q=rr(*qk) / n ** 0.5, K=rr(*qk) / n ** 0.5, V=rr(b, l, h, p), ADT=A * DT, DT=DT,
             Trap=rr(b, h, l), Q_bias=torch.ones(bias), K_bias=torch.ones(bias),
             Angles=rr(b, l, h, na), D=torch.ones(h), Z=rr(b, l, h, p))
    if r is not None:
        w = lambda: 1 + 0.1 * rr(h, r, p)
        x.update(MIMO_V=w() / r, MIMO_Z=w(), MIMO_Out=w() / r)
    keep32 = {"ADT", "DT", "Q_bias", "K_bias", "Angles", "D", "MIMO_V", "MIMO_Z", "MIMO_Out"}
    return {k: v.to(device, torch.float32 if k in keep32 else dtype) for k, v in x.items()}


def mimo_call(chunk, cfg):
    """x ↦ ``mamba3_mimo_combined(**x)`` at ``chunk`` with the launch settings ``cfg``."""
    from mambalearn.mamba3 import mamba3_mimo_combined

    return lambda x: mamba3_mimo_combined(**x, chunk_size=chunk, config=cfg)


def shape_text(dims, dtype):
    return " ".join(f"{k}{v}" for k, v in dims.items()) + f" {str(dtype).replace('torch.', '')}"


def agreement(r, chunk, cfg, dims, dtype, device):
    """(worst relative error, its name) of the output and every gradient against the float64
    chunked oracle at b1 l200 (``cfg`` None: our SISO against its own oracle is not needed)."""
    from mambalearn.mamba3 import mamba3_mimo_combined
    from mambalearn.mamba3.mimo_reference import mamba3_mimo_chunked
    from mambalearn.testing import rel_error

    x = inputs(**{**dims, "b": 1, "l": min(AGREE_L, dims["l"])}, r=r, dtype=dtype,
               device=device, seed=1)
    ours = {k: v.clone().requires_grad_() for k, v in x.items()}
    ref = {k: v.double().requires_grad_() for k, v in x.items()}
    out = mamba3_mimo_combined(**ours, chunk_size=chunk, config=cfg)
    want = mamba3_mimo_chunked(**ref, chunk_size=16)
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(2)).to(device)
    (out.float() * g).sum().backward()
    (want * g.double()).sum().backward()
    errs = [(rel_error(out, want), "out")]
    errs += [(rel_error(ours[k].grad, ref[k].grad), f"d{k}") for k in NAMES]
    return max(errs)


def timed(fns, timing):
    """``timing.compare`` on a GPU; on the CPU (smoke) one call each."""
    from mambalearn.timing import Compared, compare, time_ms

    return compare(fns, **timing) if timing else Compared({k: [time_ms(f, cpu_calls=1)]
                                                          for k, f in fns.items()})


def compare_rows(part, run, args, labels, base, dims, dtype, device, timing):
    """fwd and fwd+bwd of every callable of ``run`` interleaved; one row per (op, callable)."""
    from bench.gpu.mimo import callables

    grad = torch.randn(dims["b"], dims["l"], dims["h"], dims["p"], device=device, dtype=dtype)
    rows = []
    for op, fns in zip(("fwd", "fwd+bwd"), callables(run, args, grad), strict=True):
        got = timed(fns, timing)
        for name in fns:
            ratio, spread = got.ratio(name, base)
            rows.append(dict(part=part, op=op, variant=name, config=labels[name],
                             shape=shape_text(dims, dtype), ms=got.ms(name),
                             ratio_to_siso=ratio, ratio_spread=spread))
    return rows


def checked(part, r, variants, dims, dtype, device, clock, limit):
    """The variants ({name: (config, label, chunk)}) whose agreement holds, {name: (config,
    chunk)}, and the rows saying so."""
    rows, ok = [], {}
    for name, (cfg, label, chunk) in variants.items():
        if clock() > limit:
            rows.append(dict(part=part, check="skipped", variant=name, why="--limit"))
            continue
        err, what = agreement(r, chunk, cfg, dims, dtype, device)
        good = err < TOL[dtype]
        rows.append(dict(part=part, check="agreement", variant=name, config=label, rank=r,
                         chunk=chunk, worst_rel_err=err, worst=what, tolerance=TOL[dtype],
                         passed=good))
        if good:
            ok[name] = (cfg, chunk)
    return ok, rows


def describe(changes):
    return ", ".join(f"{k}={v}" for k, v in changes.items()) or "MIMO_DEFAULT"


def rank_one(dims, dtype, device, timing, clock, limit):
    from bench.gpu.mimo import inputs as siso_inputs
    from mambalearn.mamba3 import mamba3_siso_combined
    from mambalearn.mamba3.config import MIMO_DEFAULT

    variants = {"mimo r1 on siso": (MIMO_DEFAULT, "rank_one=siso, chunk 64", 64),
                "mimo r1 on mimo": (MIMO_DEFAULT.replace(rank_one="mimo"),
                                    "rank_one=mimo, chunk 64", 64)}
    ok, rows = checked("rank 1", 1, variants, dims, dtype, device, clock,
                       limit - RESERVE["variant"] * (timing is not None))
    siso = siso_inputs(**dims, r=None, dtype=dtype, device=device)
    mimo = inputs(**dims, r=1, dtype=dtype, device=device)
    run = {"siso": lambda x: mamba3_siso_combined(**x, chunk_size=64)}
    run |= {n: mimo_call(chunk, cfg) for n, (cfg, chunk) in ok.items()}
    args = {n: siso if n == "siso" else mimo for n in run}
    labels = {"siso": "SISO chunk 64", **{n: variants[n][1] for n in ok}}
    if clock() > limit - PER_CALLABLE * len(run) * (timing is not None):
        return rows + [dict(part="rank 1", check="skipped", what="timing", why="--limit")]
    return rows + compare_rows("rank 1", run, args, labels, "siso", dims, dtype, device, timing)


def rank_four(names, ok, dims, dtype, device, timing, clock, limit, reserve):
    """SISO and the rank-4 launches ``names`` (keys of `rank4_variants`) timed together; a
    launch not in ``ok`` ({name: (config, chunk)}, updated) is checked first, while time is left.
    Returns the rows."""
    from bench.gpu.mimo import inputs as siso_inputs
    from mambalearn.mamba3 import mamba3_siso_combined

    variants = rank4_variants()
    rows = []
    for name in names:  # each variant's compile and check while time is left
        if name not in ok:
            got, r = checked("rank 4", 4, {name: variants[name]}, dims, dtype, device, clock,
                             limit - reserve)
            ok |= got
            rows += r
    siso = siso_inputs(**dims, r=None, dtype=dtype, device=device)
    mimo = inputs(**dims, r=4, dtype=dtype, device=device)
    run = {"siso": lambda x: mamba3_siso_combined(**x, chunk_size=64)}
    run |= {n: mimo_call(ok[n][1], ok[n][0]) for n in names if n in ok}
    args = {n: siso if n == "siso" else mimo for n in run}
    labels = {"siso": "SISO chunk 64", **{n: variants[n][1] for n in run if n != "siso"}}
    if len(run) < 2 or clock() > limit - PER_CALLABLE * len(run) * (timing is not None):
        return rows + [dict(part="rank 4", check="skipped", variant=", ".join(names),
                            why="--limit or nothing passed its check")]
    return rows + compare_rows("rank 4", run, args, labels, "siso", dims, dtype, device, timing)


def rank4_variants():
    """{name: (config, label, chunk)}: the old launch and each of ``VARIANTS``."""
    from mambalearn.mamba3.config import MIMO_DEFAULT

    out = {"mimo r4": (MIMO_DEFAULT, "MIMO_DEFAULT, chunk 16", 16)}
    out |= {f"mimo r4 {n}": (MIMO_DEFAULT.replace(**c), describe(c) + f", chunk {q}", q)
            for n, (q, c) in VARIANTS.items()}
    return out


def deterministic(cfg, chunk, label, dims, dtype, device, timing, clock, limit, runs):
    """Default vs deterministic (by heads, by the tree) at rank 4 on ``cfg``, ``chunk``: bitwise
    over ``runs`` fwd+bwd, then timed."""
    from mambalearn.mamba3 import mamba3_mimo_combined
    from mambalearn.testing import rel_error

    x = inputs(**dims, r=4, dtype=dtype, device=device)
    grad = torch.randn(dims["b"], dims["l"], dims["h"], dims["p"], device=device, dtype=dtype,
                       generator=torch.Generator(device).manual_seed(3))
    modes = {"default": (cfg, False), "det heads": (cfg.replace(det_sum="heads"), True)}
    if label == "MIMO_DEFAULT":  # the old deterministic sum, for comparison
        modes["det tree"] = (cfg.replace(det_sum="tree"), True)

    def run(c, det):
        xs = {k: v.detach().requires_grad_() for k, v in x.items()}
        out = mamba3_mimo_combined(**xs, chunk_size=chunk, config=c, deterministic=det)
        out.backward(grad)
        return [out.detach()] + [xs[k].grad for k in NAMES]

    rows, fns, ref = [], {}, None
    for mode, (c, det) in modes.items():  # (a mode's first run compiles its backward)
        if clock() > limit - RESERVE["variant"] * (timing is not None):
            rows.append(dict(part="deterministic", check="skipped", variant=mode, why="--limit"))
            continue
        first = run(c, det)
        if ref is None:
            ref = first
        same = 1 + sum(all(torch.equal(a, e) for a, e in zip(first, run(c, det), strict=True))
                       for _ in range(runs - 1))
        err = max(rel_error(a, e) for a, e in zip(first, ref, strict=True))
        rows.append(dict(part="deterministic", check="bitwise", config=label, variant=mode,
                         bitwise_equal_runs=same, runs=runs, rel_err_to_default=err))
        if err < TOL[dtype]:
            fns[mode] = functools.partial(run, c, det)
        del first
    if len(fns) > 1 and clock() <= limit - PER_CALLABLE * len(fns) * (timing is not None):
        got = timed(fns, timing)
        for mode in fns:
            ratio, spread = got.ratio(mode, "default") if "default" in fns else (None, None)
            rows.append(dict(part="deterministic", op="fwd+bwd", config=label, variant=mode,
                             shape=shape_text(dims, dtype), ms=got.ms(mode),
                             ratio_to_default=ratio, ratio_spread=spread))
    return rows


def fastest(rows, ok):
    """The rank-4 launch with the least fwd+bwd time (None: none timed)."""
    timed_rows = [r for r in rows if r.get("op") == "fwd+bwd" and r.get("part") == "rank 4"
                  and r["variant"] in ok]
    return min(timed_rows, key=lambda r: r["ms"])["variant"] if timed_rows else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=120.0, help="seconds for the whole run")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes in the interpreter")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0
    gpu = torch.cuda.is_available() and not args.cpu_smoke
    if not gpu and not args.cpu_smoke:
        print("skipped: no GPU (use --cpu-smoke to test this script)")
        return []
    from bench.gpu.record import record

    dims, dtype, device = (SHAPE, torch.bfloat16, "cuda") if gpu else (SMOKE, torch.float32,
                                                                       "cpu")
    timing = dict(warm_s=1.0, rounds=5, rep=100) if gpu else None
    reserve = RESERVE if gpu else dict.fromkeys(RESERVE, 0)
    limit = args.limit
    print(torch.cuda.get_device_name() if gpu else "CPU (interpreter, smoke run)", flush=True)
    rows = []

    def emit(new):
        for row in new:
            row["elapsed_s"] = round(clock(), 1)
            rows.append(row)
            print(row, flush=True)

    ok = {}  # rank-4 launches that passed their check: {name: (config, chunk)}
    first = ["mimo r4", "mimo r4 p16", "mimo r4 q8"]
    later = [f"mimo r4 {n}" for n in VARIANTS if f"mimo r4 {n}" not in first]
    steps = [  # in order of what the issues ask first; each only while its time is left
        ("rank 1", "rank 1", lambda: rank_one(dims, dtype, device, timing, clock, limit)),
        ("rank 4", "rank 4: old launch, p16, q8",
         lambda: rank_four(first, ok, dims, dtype, device, timing, clock, limit,
                           reserve["variant"])),
        ("deterministic", "deterministic: MIMO_DEFAULT",
         lambda: deterministic(MIMO_DEFAULT, 16, "MIMO_DEFAULT", dims, dtype, device, timing,
                               clock, limit, runs=3)),
        ("rank 4", "rank 4: the other variants",
         lambda: rank_four(["mimo r4", *later], ok, dims, dtype, device, timing, clock, limit,
                           reserve["variant"])),
        ("deterministic", "deterministic: the fastest variant", lambda: deterministic_best()),
    ]

    def deterministic_best():
        best = fastest(rows, ok)
        if best in (None, "mimo r4"):
            return [dict(part="deterministic", check="skipped", why="no variant beat the old "
                         "launch")]
        return deterministic(*ok[best], best, dims, dtype, device, timing, clock, limit, runs=3)

    from mambalearn.mamba3.config import MIMO_DEFAULT

    try:
        for kind, what, step in steps:
            if clock() < limit - reserve[kind]:
                emit(step())
            else:
                emit([dict(part=what, check="skipped", why=f"--limit {limit:.0f} s")])
            if gpu:
                torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001 - record what was measured, then the failure
        emit([dict(check="failed", error=f"{type(e).__name__}: {e}"[:2000])])
    finally:
        record("mimo_speed", rows, command="python3 -m bench.gpu.mimo_speed"
               + (" --cpu-smoke" if not gpu else f" --limit {args.limit:.0f}"), peers={},
               out_dir=args.out,
               method="agreement: worst relative error of out and every gradient vs the "
                      "float64 chunked oracle (b1 l200); timings: mambalearn.timing.compare "
                      "(warm ≥ 1 s, 5 interleaved rounds, median; ratio = median of per-round "
                      "ratios); bf16 inputs, fp32 states; SISO chunk 64; deterministic: fwd+bwd "
                      "3× on the same inputs, torch.equal against the first run"
               if gpu else "CPU smoke run of the script")
    print(table(rows), flush=True)
    return rows


def table(rows):
    """≤ 30 lines: every timing, the worst agreement, the bitwise counts, what was skipped."""
    lines = [f"{'part':<14}{'op':<8}{'variant':<22}{'ms':>9}{'ratio':>8}  base"]
    for r in rows:
        if "ms" in r:
            base = "SISO" if "ratio_to_siso" in r else "default"
            ratio = r.get("ratio_to_siso", r.get("ratio_to_default"))
            lines.append(f"{r['part']:<14}{r['op']:<8}{r['variant'][:21]:<22}{r['ms']:>9.3f}"
                         f"{'-' if ratio is None else f'{ratio:.2f}':>8}  {base}")
    for r in rows:
        if r.get("check") == "agreement" and not r["passed"]:
            lines.append(f"FAILED agreement {r['variant']}: {r['worst']} {r['worst_rel_err']:.2e}")
        elif r.get("check") in ("skipped", "failed"):
            lines.append(f"{r['check']}: {r.get('part', '')} {r.get('variant', '')} "
                         f"{r.get('why') or r.get('error', '')}"[:120])
    bits = {}  # config: "mode n/runs, …"
    for r in rows:
        if r.get("check") == "bitwise":
            bits.setdefault(r["config"], []).append(
                f"{r['variant']} {r['bitwise_equal_runs']}/{r['runs']}")
    lines += [f"bitwise over runs, {c}: {', '.join(v)}" for c, v in bits.items()]
    worst = max((r["worst_rel_err"] for r in rows if r.get("check") == "agreement"), default=None)
    if worst is not None:
        lines.append(f"agreement: worst ‖ours − oracle‖/‖oracle‖ over the variants {worst:.2e}")
    return "\n".join(lines[:29] + lines[-1:] if len(lines) > 30 else lines)


if __name__ == "__main__":
    main()
