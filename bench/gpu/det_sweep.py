"""Device script: which backward the deterministic mode of Mamba-1 should use (``--sweep``).

The deterministic backward adds the time-varying dB/dC of every channel tile in a fixed order
(``mambalearn.triton.deterministic``): T = d / block_d partials of (2n × chunk) floats a chunk,
T·2n·l floats a batch row (``fused.gradients``: the floor). The deterministic default until now
(16 channels in 8 warps, their warps' channel sums staged and added once a chunk,
``Backward.tree_rows``, then a tree joined every chunk) measured 1.21× the atomic default at b8
and 1.34× at b1 l32768. Its candidates here (``bench/NOTES_determinism.md``: the floor and what
each should move): ``Backward.reg_carry`` (the adjoint carry between chunks in registers: no
shared-memory round trip and barriers a state once the channels span warps) and
``Backward.tree_after`` (the partials added by a second kernel, in tile order: no counter, fence
or last-arriver's sum in the chunk loop, whose delay adds up along a long sequence), alone and
together, on 16 and 32 channels, at 128, 96 and 80 registers (an 8-warp program at 96 leaves a
quarter of the register file unused: two fit at 128 too). This script times, in one process and at
both shapes of ``bench.gpu.determinism`` (b8 d2048 n16 l2048, b1 d2048 n16 l32768; bf16, z, D,
delta_bias, softplus, B/C (b, n, l)):

    1. the default mode (atomics) once: the reference outputs and gradients;
    2. each candidate deterministic config 3× on the same inputs: all 3 bitwise equal, and every
       output within tolerance of the default's (a wrong candidate is reported, never timed);
    3. ``mambalearn.timing.compare`` of the default and every correct candidate (each warmed ≥ 1 s,
       5 interleaved rounds, median; ratio = median of per-round ratios candidate / default).

Last it prints the candidate whose worse ratio over the two shapes is the smallest: the one to make
``config.DETERMINISTIC_BACKWARD``. Rows go to OUT/<device>_det_sweep_<date>.json
(``bench.gpu.record``), even when cut short by ``--limit``.

    python3 -m bench.gpu.det_sweep --sweep --limit 120 --out $OUT   (H200, < 120 s)
    python3 -m bench.gpu.det_sweep --cpu-smoke --out /tmp/out       (any machine: the interpreter)
    python3 -m bench.gpu.det_sweep --sm90     (any machine: every candidate built for sm_90)
"""

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.gpu.determinism import MAMBA1, mamba1_case  # noqa: E402

REGISTERS = 65536  # per SM (sm_90)
CHECK_RUNS = 3
TOL = 2e-2  # max |candidate − default| / max |default| per output (bf16 outputs: ~2⁻⁸ a value)
SMOKE = [dict(b=2, d=16, n=2, l=20)]


def per_sm(block_d, warps, maxnreg=96):
    """Programs of ``warps`` warps at ``maxnreg`` registers one SM holds (the segment plan's)."""
    return max(1, REGISTERS // (maxnreg * 32 * warps))


def candidates():
    """{name: Backward} of the deterministic mode (n ≤ 16, chunk 64). The first is the
    deterministic default until now (16 channels, 8 warps, staged rows, a tree joined every
    chunk, 96 registers); its two changes together (``reg_carry``: the adjoint carry in registers,
    no shared-memory round trip a state; ``after``: the tiles' partials added by a second kernel,
    no tree in the chunk loop) at 128 registers, on 16 channels (also with the staging's sum in
    one pass, ``tree_block``) and on 32 (T = d/32, 16 warps an SM either way); then, at 96
    registers, the two together and alone; at 80 (24 warps an SM, more spills)."""
    from mambalearn.mamba1 import config as cfgs

    base = cfgs.BACKWARD
    tile = lambda bd, w, rows, fan=16, nreg=96, **kw: dataclasses.replace(  # noqa: E731
        base, block_d=bd, num_warps=w, tree_rows=rows, tree_fan=fan, maxnreg=nreg,
        per_sm=per_sm(bd, w, nreg), **kw)
    both = dict(reg_carry=True, tree_after=True)
    return {  # (most telling first: a run cut short by --limit drops the last)
        "16x64w8 r8": tile(16, 8, 8),  # the default until now: T = d/16, 16 warps an SM
        # both changes, at 128 registers: two 8-warp programs an SM still (2 × 256 × 128 = the
        # 65536 registers of an SM; at 96 a third does not fit either), no spill in the loops
        "16x64w8 r8 carry after n128": tile(16, 8, 8, nreg=128, **both),
        # the staging's sum in one pass of 2048 floats (16 loads a thread in flight), not two
        "16x64w8 r8 carry after n128 b2048": tile(16, 8, 8, nreg=128, tree_block=2048, **both),
        "32x64w16 r16 carry after n128": tile(32, 16, 16, nreg=128, **both),  # T = d/32 (and one
        # pass: 2048 floats at 16 warps)
        "16x64w8 r8 carry after": tile(16, 8, 8, **both),  # (each change alone and together, at
        "16x64w8 r8 carry": tile(16, 8, 8, reg_carry=True),  # the old default's 96 registers)
        "16x64w8 r8 after": tile(16, 8, 8, tree_after=True),
        "16x64w8 r8 carry after n80": tile(16, 8, 8, nreg=80, **both),  # 24 warps an SM
    }


def sm90_builds(cands, d=2048, n=16, chunk=64):
    """Each candidate's backward kernel built for sm_90 as the sweep launches it (bf16 u/Δ/z/dout,
    fp32 B/C in the kernel's layout, every option, B and C varying; without and with the fold of a
    cut sequence, whose summary pieces come as run-time integers at b1) and its second kernel's
    sum of d / block_d tiles: {(name, fold): Compiled or the compiler's message}. No GPU needed
    (``mambalearn.compiled``: Triton's ptxas)."""
    import inspect

    from mambalearn import compiled, launches
    from mambalearn.mamba1.fused import state_outer
    from mambalearn.triton import deterministic

    kernel = state_outer._bwd_so_kernel
    bf16 = {"u_ptr", "delta_ptr", "z_ptr", "dout_ptr", "du_ptr", "ddelta_ptr", "dz_ptr"}
    configs, keys, tiles = [], [], set()
    for name, bw in cands.items():
        for fold in (False, True):
            const = dict(g=1, N=n, BLOCK_D=bw.block_d, BLOCK_L=chunk, HAS_D=True, HAS_Z=True,
                         HAS_BIAS=True, SOFTPLUS=True, VAR_B=True, VAR_C=True, HAS_SEQ=False,
                         EVEN_L=True, EVEN_D=True, REV_LOADS=bw.rev_loads, FOLD=fold, DET=True,
                         SLOT=2 * n * chunk, FAN=bw.tree_fan,
                         TREE_BLOCK=min(bw.tree_block or 128 * bw.num_warps, 2 * n * chunk),
                         ROWS=bw.tree_rows,
                         AFTER=bw.tree_after, REG_CARRY=bw.reg_carry)
            if not fold:
                const["pieces"] = 1  # (an int argument equal to 1 is passed as a constant)
            sig = {k: "constexpr" if k in const else
                   ("*i32" if k in ("seq_ptr", "counts_ptr") else "*bf16" if k in bf16
                    else "*fp32") if k.endswith("_ptr") else
                   ("i32",) * 3 if k.endswith("_strides") else "i32"  # (b, g, n) strides
                   for k in inspect.signature(kernel.fn).parameters}
            # (every pointer and integer divisible by 16, as Triton finds them at both shapes)
            configs.append(dict(constexprs=const, signature=sig, num_warps=bw.num_warps,
                                divisible=[p for k, v in sig.items()
                                           for p, t in launches.leaves(k, v) if t != "constexpr"],
                                **({} if bw.maxnreg is None else dict(maxnreg=bw.maxnreg))))
            keys.append((name, fold))
        if bw.tree_after:
            tiles.add(d // bw.block_d)
    built = dict(zip(keys, compiled.compile_many(kernel.fn.__module__, kernel.fn.__name__, None,
                                                  configs, sass=True), strict=True))
    ksum = deterministic._ordered_sum_kernel
    sig = dict(slots_ptr="*fp32", out_ptr="*fp32", size="i32", TILES="constexpr",
               BLOCK="constexpr")
    sums = [dict(constexprs=dict(TILES=t, BLOCK=deterministic.AFTER_BLOCK), signature=sig,
                 num_warps=4, divisible=["slots_ptr", "out_ptr", "size"]) for t in sorted(tiles)]
    built.update({(f"add_after T={t}", False): b for t, b in zip(
        sorted(tiles), compiled.compile_many(ksum.fn.__module__, ksum.fn.__name__, None, sums,
                                             sass=False), strict=True)})
    return built


def check(run, x, grads, ref, runs):
    """(runs bitwise equal to the first, {output: relative error against the default's})."""
    first = run(x, grads)
    equal = 1
    for _ in range(runs - 1):
        again = run(x, grads)
        equal += all(torch.equal(first[k], again[k]) for k in first)
        del again
    err = {k: ((first[k].float() - v.float()).abs().max()
               / v.float().abs().max().clamp_min(1e-6)).item() for k, v in ref.items()}
    return equal, err


def sweep_shape(shape, cands, dtype, device, timing, runs, end):
    """Rows of one shape: each candidate's check, then the correct ones timed with the default
    (by ``end``, a perf_counter time: the checks stop early enough to leave the timing ~1.6 s a
    callable)."""
    from mambalearn.mamba1 import default_config
    from mambalearn.mamba1.config import chunk_size
    from mambalearn.timing import Compared, compare, time_ms

    name = f"b{shape['b']} d{shape['d']} n{shape['n']} l{shape['l']}"
    x, grads, run = mamba1_case(**shape, dtype=dtype, device=device)
    base = default_config(shape["n"], "cuda", shape["l"])  # (the GPU's tiles, on a CPU too)
    assert base.chunk == chunk_size(shape["n"])
    configs = {"default": base}
    configs.update({k: base.replace(backward=bw, deterministic=True) for k, bw in cands.items()})
    call = lambda cfg: lambda x, grads: run_cfg(x, grads, cfg)  # noqa: E731
    run_cfg = lambda x, grads, cfg: run(x, grads, config=cfg)  # noqa: E731

    ref = run_cfg(x, grads, base)
    rows, fns = [], {"default": lambda: run_cfg(x, grads, base)}
    for cname, cfg in configs.items():
        if cname == "default":
            continue
        if timing and time.perf_counter() > end - 1.7 * (len(fns) + 1):
            rows.append(dict(shape=name, variant=cname, check="skipped", why="--limit"))
            print(rows[-1], flush=True)
            continue
        bw = cfg.backward
        row = dict(shape=name, variant=cname, block_d=bw.block_d, num_warps=bw.num_warps,
                   tree_rows=bw.tree_rows, tree_fan=bw.tree_fan, tree_after=bw.tree_after,
                   reg_carry=bw.reg_carry, tree_block=bw.tree_block, maxnreg=bw.maxnreg,
                   chunk=cfg.chunk,
                   tiles=shape["d"] // bw.block_d)
        try:
            equal, err = check(call(cfg), x, grads, ref, runs)
            worst = max(err, key=err.get)
            row.update(bitwise_equal_runs=float(equal), runs=runs, worst_output=worst,
                       max_rel_err=err[worst],
                       correct=equal == runs and err[worst] <= TOL)
            if row["correct"]:
                fns[cname] = (lambda cfg: lambda: run_cfg(x, grads, cfg))(cfg)  # noqa: B023
        except Exception as e:  # noqa: BLE001 - a candidate that fails is a row, not the end
            row.update(correct=False, error=f"{type(e).__name__}: {str(e)[:300]}")
        rows.append(row)
        print(row, flush=True)
    if timing and time.perf_counter() > end - 1.6 * len(fns):
        rows.append(dict(shape=name, check="skipped", why="--limit: no time left to time"))
        return rows
    got = compare(fns, **timing) if timing else Compared({k: [time_ms(f, cpu_calls=1)]
                                                          for k, f in fns.items()})
    rows.append(dict(shape=name, variant="default", ms=got.ms("default"), ratio_to_default=1.0))
    for row in rows:
        if row.get("variant") in fns and row["variant"] != "default":
            ratio, spread = got.ratio(row["variant"], "default")
            row.update(ms=got.ms(row["variant"]), ratio_to_default=ratio, ratio_spread=spread)
    return rows


def pick(rows):
    """(name, worse ratio over the shapes) of the best correct candidate timed at every shape."""
    shapes = {r["shape"] for r in rows if "shape" in r}
    by = {}
    for r in rows:
        if "ratio_to_default" in r and r["variant"] != "default":
            by.setdefault(r["variant"], {})[r["shape"]] = r["ratio_to_default"]
    full = {k: max(v.values()) for k, v in by.items() if set(v) == shapes}
    if not full:
        return None, None
    best = min(full, key=full.get)
    return best, full[best]


def table(rows):
    lines = [f"{'shape':<22}{'variant':<34}{'T':>6}{'equal':>7}{'rel err':>10}{'ms':>9}"
             f"{'× default':>10}"]
    for r in rows:
        if "variant" in r and ("ms" in r or "correct" in r):
            eq = f"{r['bitwise_equal_runs']:.0f}/{r['runs']}" if "runs" in r else "-"
            err = f"{r['max_rel_err']:.1e}" if "max_rel_err" in r else "-"
            ms = f"{r['ms']:.3f}" if "ms" in r else ("WRONG" if not r.get("correct") else "-")
            ratio = f"{r['ratio_to_default']:.3f}" if "ratio_to_default" in r else "-"
            lines.append(f"{r['shape']:<22}{r['variant']:<34}{r.get('tiles', '-'):>6}{eq:>7}"
                         f"{err:>10}{ms:>9}{ratio:>10}")
    lines += [f"{r.get('check')}: {r.get('shape', '')} {r.get('variant', '')} "
              f"{r.get('why') or r.get('error')}" for r in rows
              if r.get("check") in ("skipped", "failed") or "error" in r]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="time every candidate (the GPU run)")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds for the whole run")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes in the interpreter")
    ap.add_argument("--pick", help="write the picked candidate's Backward fields to this JSON file")
    ap.add_argument("--sm90", action="store_true",
                    help="build every candidate for sm_90 (no GPU): registers, spills, problems")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.sm90:
        from mambalearn.compiled import opcode_counts

        bad = 0
        for (name, fold), b in sm90_builds(candidates()).items():
            what = f"{name}{' fold' if fold else ''}"
            if isinstance(b, str):
                bad += 1
                print(f"FAIL {what}: {b[-300:]}")
                continue
            ops = opcode_counts(b.sass) if b.sass else {}
            print(f"{what:<36} registers {b.registers:>3} spill {b.spill_bytes:>4} B  shared "
                  f"{b.shared_bytes:>5} B  " + " ".join(f"{k} {ops.get(k, 0)}" for k in
                                                        ("BAR", "ATOMG", "MEMBAR", "LDL", "STL")
                                                        if ops))
        print(f"{bad} problems")
        return bad
    gpu = torch.cuda.is_available() and not args.cpu_smoke
    if not args.cpu_smoke and not (gpu and args.sweep):
        print("nothing to do: --sweep on a GPU, or --cpu-smoke")
        return []
    from bench.gpu.record import record

    dtype, device = (torch.bfloat16, "cuda") if gpu else (torch.float32, "cpu")
    timing = dict(warm_s=1.0, rounds=5, rep=100) if gpu else None
    runs = CHECK_RUNS if gpu else 2
    print(torch.cuda.get_device_name() if gpu else "CPU (interpreter, smoke run)", flush=True)
    cands = candidates()
    if not gpu:
        cands = {k: cands[k] for k in ("16x64w8 r8", "16x64w8 r8 carry after n128")}
    shapes = MAMBA1 if gpu else SMOKE
    rows = []
    try:
        for i, shape in enumerate(shapes):
            # each shape gets its share of what is left (the last one: all of it)
            left = args.limit - (time.perf_counter() - t0)
            end = time.perf_counter() + left / (len(shapes) - i)
            rows += sweep_shape(shape, cands, dtype, device, timing, runs, end)
            if gpu:
                torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001 - record what was measured, then the failure
        rows.append(dict(check="failed", error=f"{type(e).__name__}: {e}"))
        print(rows[-1], flush=True)
    finally:
        best, worst = pick(rows)
        rows.append(dict(check="pick", variant=best, worse_ratio=worst))
        for r in rows:
            r.setdefault("elapsed_s", round(time.perf_counter() - t0, 1))
        record("det_sweep", rows, command="python3 -m bench.gpu.det_sweep"
               + (" --cpu-smoke" if not gpu else f" --sweep --limit {args.limit:.0f}"), peers={},
               out_dir=args.out,
               method=f"per candidate: {runs} fwd+bwd on the same inputs (torch.equal), max "
                      f"|x − default| / max |default| ≤ {TOL} per output; timings: "
                      "mambalearn.timing.compare (warm ≥ 1 s, 5 interleaved rounds, median; "
                      "ratio = median of per-round ratios candidate / default); bf16 inputs"
               if gpu else "CPU smoke run of the script")
    print(table(rows), flush=True)
    if best is None:
        print("no candidate was checked and timed at every shape")
    else:
        bw = cands[best]
        print(f"make the deterministic default: {best} (worse ratio {worst:.3f}): "
              f"config.DETERMINISTIC_BACKWARD = Backward('state-outer', block_d={bw.block_d}, "
              f"num_warps={bw.num_warps}, maxnreg={bw.maxnreg}, per_sm={bw.per_sm}, "
              f"tree_rows={bw.tree_rows}, tree_fan={bw.tree_fan}, tree_after={bw.tree_after}, "
              f"reg_carry={bw.reg_carry}"
              + (f", tree_block={bw.tree_block}" if bw.tree_block else "") + ")", flush=True)
        if args.pick:  # for `bench.gpu.determinism --mamba1-backward FILE` in the same call
            import json
            Path(args.pick).write_text(json.dumps(dict(dataclasses.asdict(bw), name=best)))
    return rows


if __name__ == "__main__":
    main()
