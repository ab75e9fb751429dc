"""What a tl.dot over a d × d matrix costs a program on an sm_90 GPU, compiled on the CPU.

Article 000 (§ 4) writes a scan step whose program loads the whole d × d matrix A and multiplies it
with ``tl.dot(A, h)``, and says shared memory limits d to 384. Two kernels, compiled for sm_90
with ``mambalearn.compiled`` (Triton's code generator and ptxas, no GPU), at d = 256 … 8192:

* the article's shape: one program holds the whole (d × d) block of A (masked to the next power of
  two) and a (d × 16) block of states (16: the narrowest operand tl.dot takes), fp32;
* tiled: a program holds a (64 × 64) tile of A and a (64 × 16) tile of states per step of a loop
  over d (what a matmul kernel does), fp32.

Per configuration it records shared memory per program, registers and spilled bytes per thread,
or why it did not compile. Writes docs/results/sm90_dot_footprint_<date>.json:

    python3 bench/dot_footprint.py
"""

import datetime
import json
import subprocess
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mambalearn import compiled  # noqa: E402

DS = (256, 384, 512, 1024, 2048, 4096, 8192)
N = 16


@triton.jit
def whole_block(A_ptr, h_ptr, out_ptr, D: tl.constexpr, BLOCK: tl.constexpr, N: tl.constexpr):
    i = tl.arange(0, BLOCK)
    j = tl.arange(0, N)
    A = tl.load(A_ptr + i[:, None] * D + i[None, :], mask=(i[:, None] < D) & (i[None, :] < D),
                other=0.0)
    h = tl.load(h_ptr + i[:, None] * N + j[None, :], mask=i[:, None] < D, other=0.0)
    tl.store(out_ptr + i[:, None] * N + j[None, :], tl.dot(A, h), mask=i[:, None] < D)


@triton.jit
def tiled(A_ptr, h_ptr, out_ptr, D: tl.constexpr, N: tl.constexpr, BM: tl.constexpr,
          BK: tl.constexpr):
    m = tl.program_id(0) * BM + tl.arange(0, BM)
    j = tl.arange(0, N)
    acc = tl.zeros((BM, N), dtype=tl.float32)
    for k in range(0, D, BK):
        kk = k + tl.arange(0, BK)
        a = tl.load(A_ptr + m[:, None] * D + kk[None, :], mask=(m[:, None] < D) & (kk[None, :] < D),
                    other=0.0)
        h = tl.load(h_ptr + kk[:, None] * N + j[None, :], mask=kk[:, None] < D, other=0.0)
        acc = tl.dot(a, h, acc)
    tl.store(out_ptr + m[:, None] * N + j[None, :], acc, mask=m[:, None] < D)


SIG = {"A_ptr": "*fp32", "h_ptr": "*fp32", "out_ptr": "*fp32", "D": "constexpr", "N": "constexpr"}


def one(kernel, signature, constexprs):
    try:
        c = compiled.compile_for(kernel, signature, constexprs, num_warps=4, num_stages=3)
    except RuntimeError as e:
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        why = next((x for x in reversed(lines) if "Error" in x or "error" in x), lines[-1])
        return {"error": why[:200]}
    return {"shared_kb": c.shared_bytes / 1024, "registers": float(c.registers),
            "spill_bytes": float(c.spill_bytes)}


def main():
    rows = []
    for d in DS:
        block = triton.next_power_of_2(d)
        r = one(whole_block, SIG | {"BLOCK": "constexpr"}, dict(D=d, BLOCK=block, N=N))
        rows.append({"op": "tl.dot(A, h), one program",
                     "backend": "whole d × d block (article 000)", "d": d,
                     "shape": f"A {block}x{block}, h {block}x{N}, fp32", **r})
        print(rows[-1], flush=True)
        r = one(tiled, SIG | {"BM": "constexpr", "BK": "constexpr"}, dict(D=d, N=N, BM=64, BK=64))
        rows.append({"op": "tl.dot(A, h), one program", "backend": "tiles 64 x 64 over d",
                     "d": d, "shape": f"A 64x64, h 64x{N}, fp32, loop over d", **r})
        print(rows[-1], flush=True)
    date = datetime.date.today().isoformat()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "not recorded"
    meta = {"device": "sm_90 compile on CPU", "date": date,
            "command": "python3 bench/dot_footprint.py", "commit": commit,
            "torch": torch.__version__, "triton": triton.__version__, "peers": {},
            "method": "computed, not timed: each kernel compiled for sm_90 by Triton's code "
                      "generator and ptxas on the CPU (mambalearn.compiled.compile_for, 4 warps, "
                      "3 stages); shared_kb = the program's shared memory (Triton's metadata), "
                      "registers and spill_bytes per thread (cuobjdump -res-usage); error = why "
                      "it did not compile",
            "kind": "computed"}
    out = ROOT / "docs" / "results" / f"sm90_dot_footprint_{date}.json"
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, ensure_ascii=False) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
