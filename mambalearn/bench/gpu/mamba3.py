"""Chapter 15 on the H200: agreement with mamba_ssm's ``mamba3_siso_combined`` (fp32, bf16,
forward and every gradient, vs the float64 oracle), forward and forward+backward timings side by
side, SISO and MIMO decode timings for the roofline; a short table last.

    python mambalearn/bench/gpu/mamba3.py --limit 110 --json $OUT/mamba3.json

Each part runs only while the time limit allows (compiling is most of a fresh machine's time);
what ran is printed as it comes, so a run cut short still shows it.
"""

import argparse
import json
import time

import torch

from mambalearn.bench import mamba3 as B

AGREE = B.AGREE


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=110.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    left = lambda: args.limit - (time.perf_counter() - t0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    theirs = B.load()
    theirs_step = B.load("mamba3_siso_step", "mamba3_siso_step")
    out = {"agreement": {}, "rows": []}
    for dtype in (torch.bfloat16, torch.float32):
        if left() < 60:
            break
        rows = B.agreement(AGREE, dtype, theirs)
        out["agreement"][str(dtype)] = rows
        for r in rows:
            print("agree", dtype, r, flush=True)
    parts = [("timings", lambda: B.timings(theirs=theirs), 35),
             ("decode", lambda: B.decode(theirs_step=theirs_step), 10)]
    for name, part, need in parts:
        if left() < need:
            print(f"skipped {name}: {left():.0f} s left", flush=True)
            continue
        for row in part():
            out["rows"].append(row)
            print(name, row, flush=True)
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1, default=str)
    print(f"\n== mamba3 on {torch.cuda.get_device_name()} ({time.perf_counter() - t0:.0f} s)")
    for dtype, rows in out["agreement"].items():
        worst = lambda who, rows=rows: max(r.get(who, 0.0) for r in rows)
        print(f"agreement {dtype}: worst rel. error vs float64 oracle: ours {worst('ours'):.2e}"
              f", mamba_ssm {worst('mamba_ssm'):.2e}")
    print(f"{'backend':<24}{'shape':<24}{'ms':>9}{'ratio':>8}{'floor%':>8}")
    for r in out["rows"]:
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") else "-"
        floor = f"{r['floor_pct']:.0f}" if r.get("floor_pct") else "-"
        print(f"{r['backend']:<24}{r['shape']:<24}{r['ms']:>9.4f}{ratio:>8}{floor:>8}")


if __name__ == "__main__":
    main()
