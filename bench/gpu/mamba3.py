"""Chapter 15 on the H200, one call: agreement first, then timings side by side, a table last.

    python3 -m bench.gpu.mamba3 --limit 90 --json $OUT/mamba3.json

1. agreement: ours and mamba_ssm's ``mamba3_siso_combined`` against the float64 oracle (chunked
   autograd on the GPU), output and every gradient, bf16 (``bench.mamba3.AGREE``: l = 1008, a
   partial last chunk);
2. forward and forward+backward at b8 l2048 h32 p64 n128 bf16, chunk 64, mamba_ssm then ours;
3. decode: SISO mamba_ssm and ours, MIMO ours at ranks 1, 2, 4, 8 (b64 h64 p64 n128);
4. only if time is left: the agreement in float32 (tf32 matmuls) and ours at ``--more-chunks``.

mamba_ssm runs with its full autotune, as its users run it (``bench.mamba3.load``: 27–81 configs
per kernel, minutes of compiling on a fresh machine; ``bench.gpu.batch_one_ssd`` compiles them in
parallel first); ours are not autotuned (``mambalearn.mamba3.common.CONFIG``). Each part
runs only while ``--limit`` allows; rows are printed as they come, so a run cut short still shows
them. ``--tiny`` runs the same steps at toy sizes (on a CPU: Triton's interpreter, fp32, no
mamba_ssm combined — its backward needs CUDA): a test of this script, not a measurement.
"""

import argparse
import json
import time

import torch

from course.bench import mamba3 as B

TINY = dict(shape=dict(b=1, l=40, h=2, g=1, n=16, p=16, na=4),
            agree=dict(b=1, l=20, h=2, g=1, n=16, p=16, na=4), decode=dict(b=1, h=2, p=16, n=16))


def _parts(args, theirs, theirs_step, sizes):
    """(name, seconds it needs at least, function returning rows) in the order they run."""
    dtype = torch.float32 if args.tiny and not torch.cuda.is_available() else torch.bfloat16
    agree = lambda dt: [dict(kind="agreement", dtype=str(dt), **r)
                        for r in B.agreement(sizes["agree"], dt, theirs)]
    more = [int(c) for c in args.more_chunks.split(",") if c]
    return [
        ("agreement", 20, lambda: agree(dtype)),
        ("timings", 30, lambda: B.timings(sizes["shape"], theirs=theirs)),
        ("decode", 8, lambda: B.decode(sizes["decode"], theirs_step=theirs_step)),
        ("agreement fp32", 15, lambda: agree(torch.float32) if dtype != torch.float32 else []),
        ("more chunks", 15, lambda: B.timings(sizes["shape"], chunks=more) if more else []),
    ]


def _table(rows, seconds):
    """The short table printed last: worst agreement per side, then every timing row."""
    lines = [f"== mamba3 on {torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}"
             f" ({seconds:.0f} s)"]
    for dt in sorted({r["dtype"] for r in rows if r.get("kind") == "agreement"}):
        agree = [r for r in rows if r.get("dtype") == dt]
        worst = lambda who, agree=agree: max((r[who], r["what"]) for r in agree if who in r)
        lines.append(f"agreement {dt}: worst ‖a − e‖/‖e‖ vs the float64 oracle: ours "
                     "{:.2e} ({})".format(*worst("ours"))
                     + (", mamba_ssm {:.2e} ({})".format(*worst("mamba_ssm"))
                        if "mamba_ssm" in agree[0] else ""))
    lines.append(f"{'backend':<26}{'shape':<24}{'ms':>9}{'ratio':>8}{'floor%':>8}")
    for r in rows:
        if "ms" in r:
            ratio = f"{r['ratio']:.2f}" if r.get("ratio") else "-"
            floor = f"{r['floor_pct']:.0f}" if r.get("floor_pct") else "-"
            lines.append(f"{r['backend']:<26}{r['shape']:<24}{r['ms']:>9.4f}{ratio:>8}{floor:>8}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=90.0, help="seconds for the whole run")
    ap.add_argument("--json", default=None, help="write every row here")
    ap.add_argument("--more-chunks", default="", help="e.g. 32,128: ours again at these chunks")
    ap.add_argument("--tiny", action="store_true", help="toy sizes: a test of this script")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    left = lambda: args.limit - (time.perf_counter() - t0)
    print(torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU",
          "torch", torch.__version__, flush=True)
    sizes = TINY if args.tiny else dict(shape=B.SHAPE, agree=B.AGREE, decode=B.DECODE)
    theirs = B.load() if torch.cuda.is_available() else None
    theirs_step = B.load("mamba3_siso_step", "mamba3_siso_step")
    rows = []
    for name, need, part in _parts(args, theirs, theirs_step, sizes):
        if left() < need:
            print(f"skipped {name}: {left():.0f} s left", flush=True)
            continue
        for row in part():
            rows.append(row)
            print(name, row, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    print("\n" + _table(rows, time.perf_counter() - t0), flush=True)
    return rows


if __name__ == "__main__":
    main()
