"""Device script for the deterministic mode: same bits on every run, at every batch position, and
what it costs, for the kernels whose backward sums over programs with atomics.

Cases (bf16 inputs): Mamba-1 ``selective_scan_fn`` fwd+bwd at b8 d2048 n16 l2048 and b1 d2048 n16
l32768 (z, D, delta_bias, softplus; B and C (b, n, l) varying with time: the dB/dC atomics), and
Mamba-3 ``mamba3_mimo_combined`` fwd+bwd at ``bench.gpu.mimo``'s shape, rank 4, chunk 16 (dQ/dK
summed over 32 heads). The SSD kernels have no floating-point atomics (their backward owns its
tiles; the one-launch forward's atomics order work): nothing to compare there. For each case and
mode (default, deterministic):

    1. fwd+bwd ``--runs`` times on the same inputs: how many runs give every output and gradient
       bitwise equal to the first run's (the first counts), and per output how many;
    2. batch position (b > 1): the batch rolled by one row, fwd+bwd again: is every per-sequence
       output and gradient of each sequence bitwise the same as at its old position;
    3. one process, both modes timed with ``mambalearn.timing.compare`` (each warmed ≥ 1 s, ≥ 5
       interleaved rounds, median; ratio = median of the per-round ratios deterministic/default).

Rows are printed as they come and recorded (``bench.gpu.record``, topic "determinism") as
OUT/<device>_determinism_<date>.json, even when the run is cut short; a short table comes last.
``--cpu-smoke`` runs every step at toy sizes in Triton's interpreter (float32, two runs, one
call): a test of this script, not a measurement.

    python3 -m bench.gpu.determinism --limit 110 --out $OUT     (H200, < 120 s)
    python3 -m bench.gpu.determinism --mamba1-shapes 64x512,16x2048 --no-mimo --runs 3 --out $OUT
    python3 -m bench.gpu.determinism --cpu-smoke --out /tmp/out  (any machine)
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

MAMBA1 = [dict(b=8, d=2048, n=16, l=2048), dict(b=1, d=2048, n=16, l=32768)]
MAMBA1_SMOKE = [dict(b=2, d=4, n=2, l=8)]
MIMO_R, MIMO_Q = 4, 16  # rank and chunk (64 rows a tile: bench.gpu.mimo's rank-4 timing)
# smoke: rank 2, chunk 8; every per-sequence tensor a multiple of 64 floats (the CPU's PyTorch
# rounds a tensor's last elements in a scalar tail: rows off it keep their bits when they move)
MIMO_SMOKE = dict(b=2, l=16, h=4, g=1, p=16, n=16, na=4, r=2, q=8)
M1_PER_SEQUENCE = ("out", "last", "du", "ddelta", "dz", "dB", "dC")
MIMO_PER_SEQUENCE = ("out", "dQ", "dK", "dV", "dZ", "dADT", "dDT", "dTrap", "dAngles")


def mamba1_case(b, d, n, l, dtype, device, seed=0):
    """(inputs, upstream gradients, run(x, grads, deterministic, config) → {name: tensor}) for
    Mamba-1."""
    from mambalearn.mamba1 import selective_scan_fn

    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    x = dict(u=r(b, d, l), delta=0.5 * r(b, d, l) - 1.0, A=-torch.rand(d, n, generator=gen) - 0.5,
             B=r(b, n, l), C=r(b, n, l), D=r(d), z=r(b, d, l), delta_bias=0.1 * r(d))
    f32 = {"A", "D", "delta_bias"}
    x = {k: v.to(device, torch.float32 if k in f32 else dtype) for k, v in x.items()}
    grads = (r(b, d, l).to(device, dtype), r(b, d, n).to(device))

    def run(x, grads, deterministic=None, config=None):
        xs = {k: v.detach().requires_grad_() for k, v in x.items()}
        out, last = selective_scan_fn(**xs, delta_softplus=True, return_last_state=True,
                                      deterministic=deterministic, config=config)
        torch.autograd.backward([out, last], list(grads))
        return dict(out=out.detach(), last=last.detach(), **{f"d{k}": xs[k].grad for k in xs})

    return x, grads, run


def mimo_case(dims, r, q, dtype, device, seed=0):
    """(inputs, upstream gradient, run) for the Mamba-3 MIMO prefill (``bench.gpu.mimo``'s) at
    rank r, chunk q."""
    from bench.gpu.mimo import inputs
    from mambalearn.mamba3 import mamba3_mimo_combined

    x = inputs(**dims, r=r, dtype=dtype, device=device, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    grads = (torch.randn(dims["b"], dims["l"], dims["h"], dims["p"], generator=gen).to(device,
                                                                                      dtype),)

    def run(x, grads, deterministic):
        xs = {k: v.detach().requires_grad_() for k, v in x.items()}
        out = mamba3_mimo_combined(**xs, chunk_size=q, deterministic=deterministic)
        out.backward(grads[0])
        return dict(out=out.detach(), **{f"d{k}": xs[k].grad for k in xs})

    return x, grads, run


def bitwise(run, x, grads, det, runs):
    """Step 1: (runs whose every output equals the first run's, {output: runs equal to the
    first's}); the first run counts."""
    first = run(x, grads, det)
    same = {k: 1 for k in first}
    whole = 1
    for _ in range(runs - 1):
        again = run(x, grads, det)
        eq = {k: torch.equal(first[k], again[k]) for k in first}
        whole += all(eq.values())
        for k, v in eq.items():
            same[k] += v
        del again
    return whole, same


def position(run, x, grads, det, per_sequence):
    """Step 2: the per-sequence outputs that change bits when the batch is rolled by one row
    (every sequence at a new index, between new neighbours)."""
    b = grads[0].shape[0]
    roll = lambda t: torch.roll(t, 1, 0) if t is not None and t.ndim and t.shape[0] == b else t
    here = run(x, grads, det)
    there = run({k: roll(v) for k, v in x.items()}, tuple(roll(g) for g in grads), det)
    return [k for k in per_sequence if k in here and not torch.equal(roll(here[k]), there[k])]


def timed(fns, timing):
    """{name: ms} and the deterministic/default ratio with its spread: ``timing.compare`` on a
    GPU; on the CPU (smoke, ``timing`` None) one call each, nothing warmed."""
    from mambalearn.timing import Compared, compare, time_ms

    got = compare(fns, **timing) if timing else Compared({k: [time_ms(f, cpu_calls=1)]
                                                          for k, f in fns.items()})
    return {k: got.ms(k) for k in fns}, *got.ratio("deterministic", "default")


def case_rows(family, shape, run, x, grads, per_sequence, runs, timing):
    """One summary row per mode (the fields the chapter reads: family, shape, mode,
    bitwise_equal_runs, runs, ms, ratio_to_default; batch_position_equal where b > 1) and the
    per-output counts (check "per output")."""
    modes = {"default": False, "deterministic": True}
    rows, detail = {}, []
    for mode, det in modes.items():
        whole, same = bitwise(run, x, grads, det, runs)
        differ = [k for k, v in same.items() if v < runs]
        rows[mode] = dict(family=family, shape=shape, mode=mode, bitwise_equal_runs=float(whole),
                          runs=runs, outputs_differing=", ".join(differ) or "none")
        if grads[0].shape[0] > 1:
            moved = position(run, x, grads, det, per_sequence)
            rows[mode].update(batch_position_equal=not moved,
                              outputs_moved=", ".join(moved) or "none")
        detail += [dict(family=family, shape=shape, mode=mode, check="per output", what=k,
                        equal_runs=float(v), runs=runs) for k, v in same.items()]
    # 3. both modes timed interleaved in this process
    ms, ratio, spread = timed({mode: (lambda det: lambda: run(x, grads, det))(det)  # noqa: B023
                               for mode, det in modes.items()}, timing)
    rows["default"].update(ms=ms["default"], ratio_to_default=1.0)
    rows["deterministic"].update(ms=ms["deterministic"], ratio_to_default=ratio,
                                 ratio_spread=spread)
    return list(rows.values()) + detail


def cases(gpu, m1_shapes=None, mimo=True):
    """(family, shape text, builder) in the order they run; ``m1_shapes`` (b, l) pairs at d2048
    n16 instead of ``MAMBA1``."""
    from bench.gpu.mimo import SHAPE

    m1 = MAMBA1 if gpu else MAMBA1_SMOKE
    if m1_shapes and gpu:
        m1 = [dict(b=b, d=2048, n=16, l=l) for b, l in m1_shapes]
    dims = dict(SHAPE, r=MIMO_R, q=MIMO_Q) if gpu else MIMO_SMOKE
    out = [("mamba1", f"b{s['b']} d{s['d']} n{s['n']} l{s['l']}",
            lambda dt, dev, s=s: mamba1_case(**s, dtype=dt, device=dev)) for s in m1]
    if mimo:
        out.append(("mimo", " ".join(f"{k}{v}" for k, v in dims.items()),
                    lambda dt, dev: mimo_case({k: v for k, v in dims.items()
                                               if k not in ("r", "q")}, dims["r"], dims["q"],
                                              dt, dev)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=110.0, help="seconds for the whole run")
    ap.add_argument("--runs", type=int, default=10, help="fwd+bwd runs per mode")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes in the interpreter")
    ap.add_argument("--mamba1-backward", help="a JSON file of Backward fields (det_sweep's "
                    "--pick): Mamba-1's deterministic mode runs that backward, not the default's")
    ap.add_argument("--mamba1-shapes", help="Mamba-1 cases as BxL,BxL (d2048 n16), e.g. "
                    "64x512,8x2048; the default: b8 l2048 and b1 l32768")
    ap.add_argument("--no-mimo", action="store_true", help="Mamba-1's cases only")
    args = ap.parse_args(argv)
    m1_shapes = None if not args.mamba1_shapes else [
        tuple(int(v) for v in bl.split("x")) for bl in args.mamba1_shapes.split(",")]
    extra = {}
    if args.mamba1_backward:
        import json

        from mambalearn.mamba1 import config as m1config
        fields = json.loads(Path(args.mamba1_backward).read_text())
        name = fields.pop("name", "picked")
        m1config.DETERMINISTIC_BACKWARD = m1config.Backward(**fields)  # read by default_config
        extra["mamba1_deterministic_backward"] = f"{name}: {m1config.DETERMINISTIC_BACKWARD}"
        print("Mamba-1 deterministic backward:", extra["mamba1_deterministic_backward"], flush=True)
    t0 = time.perf_counter()
    gpu = torch.cuda.is_available() and not args.cpu_smoke
    if not gpu and not args.cpu_smoke:
        print("skipped: no GPU (use --cpu-smoke to test this script)")
        return []
    from bench.gpu.record import record

    dtype, device = (torch.bfloat16, "cuda") if gpu else (torch.float32, "cpu")
    runs = args.runs if gpu else 2
    timing = dict(warm_s=1.0, rounds=5, rep=100) if gpu else None
    print(torch.cuda.get_device_name() if gpu else "CPU (interpreter, smoke run)", flush=True)
    rows = []
    try:
        for family, shape, build in cases(gpu, m1_shapes, mimo=not args.no_mimo):
            reserve = (45 if family == "mimo" else 25) if gpu else 0  # its compiles and runs
            if time.perf_counter() - t0 > args.limit - reserve:
                rows.append(dict(family=family, shape=shape, check="skipped",
                                 why=f"--limit {args.limit:.0f} s"))
                print(rows[-1], flush=True)
                continue
            x, grads, run = build(dtype, device)
            per = M1_PER_SEQUENCE if family == "mamba1" else MIMO_PER_SEQUENCE
            for row in case_rows(family, shape, run, x, grads, per, runs, timing):
                row["elapsed_s"] = round(time.perf_counter() - t0, 1)
                rows.append(row)
                print(row, flush=True)
            del x, grads, run
            if gpu:
                torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001 - record what was measured, then the failure
        rows.append(dict(check="failed", error=f"{type(e).__name__}: {e}"))
        print(rows[-1], flush=True)
    finally:
        record("determinism", rows, command="python3 -m bench.gpu.determinism"
               + (" --cpu-smoke" if not gpu else f" --limit {args.limit:.0f}")
               + (f" --mamba1-backward {args.mamba1_backward}" if args.mamba1_backward else ""),
               peers={},
               out_dir=args.out,
               method=f"fwd+bwd {runs}× per mode on the same inputs, torch.equal against the "
                      "first run; batch position: the batch rolled by one row; timings: "
                      "mambalearn.timing.compare (warm ≥ 1 s, 5 interleaved rounds, median; "
                      "ratio = median of per-round ratios deterministic / default); bf16 inputs"
               if gpu else "CPU smoke run of the script", **extra)
    print(table(rows), flush=True)
    return rows


def table(rows):
    """The summary rows: runs bitwise equal to the first, batch position, ms and ratio."""
    lines = [f"{'family':<8}{'shape':<38}{'mode':<15}{'equal runs':>11}{'position':>10}"
             f"{'ms':>10}{'× default':>10}"]
    for r in rows:
        if "ms" in r:
            pos = {True: "same", False: "differs"}.get(r.get("batch_position_equal"), "-")
            lines.append(f"{r['family']:<8}{r['shape']:<38}{r['mode']:<15}"
                         f"{r['bitwise_equal_runs']:>8.0f}/{r['runs']:<2}{pos:>10}"
                         f"{r['ms']:>10.3f}{r['ratio_to_default']:>10.3f}")
    lines += [f"{r['check']}: {r.get('why') or r.get('error')}" for r in rows
              if r.get("check") in ("skipped", "failed")]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
