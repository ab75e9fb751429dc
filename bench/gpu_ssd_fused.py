"""Chapter 11's single-launch SSD forward: its launch options side by side on the GPU (one call).

    PYTHONUNBUFFERED=1 python3 bench/gpu_ssd_fused.py [--limit S] [--json FILE]

At b4 l4096 h80 p64 n128 g1 bf16 (DESIGN §6), same inputs for all: mamba_ssm's
``mamba_chunk_scan_combined`` (when its source tree is there), our unfused five-stage forward, and
``ssd_fused_forward`` under each entry of ``VARIANTS`` (ticket order, state dtype, chunk, tiles).
Each row: median ms, ratio to mamba_ssm, relative error of the output against the unfused kernel
at the same chunk size. Stops starting new rows when --limit seconds are used. CPU: tiny, smoke.
"""

import argparse
import json
import time

import torch

from mambalearn.bench import time_ms
from mambalearn.bench.ssd import load_mamba_ssm_ssd, make_inputs
from mambalearn.testing import rel_error
from mambalearn.triton import ssd as unfused
from mambalearn.triton.ssd_fused import ssd_fused_forward

F32, F16 = torch.float32, torch.float16
VARIANTS = {  # name -> ssd_fused_forward keyword arguments (chunk_size as "q")
    # sm_90 compile (Triton 3.6 ptxas, on a CPU): registers / spill stack per thread
    "chain-major fp32 q256 w4 (the 2026-11-29 kernel)": dict(q=256, chunk_major=False),  # 255/1360
    "chunk-major fp32 q256 w4": dict(q=256),                                             # 255/1360
    "chunk-major fp16 q256 w4": dict(q=256, state_dtype=F16),
    "chunk-major fp32 q256 w8": dict(q=256, num_warps=8),                                # 255/296
    "share_cb fp32 q256 w8": dict(q=256, num_warps=8, share_cb=True),                    # 255/96
    "share_cb fp32 q256 w8 3 stages": dict(q=256, num_warps=8, share_cb=True,
                                           num_stages=3),                                # 255/64
    "share_cb fp32 q256 block_p 32 w4": dict(q=256, block_p=32, share_cb=True),          # 255/128
    "share_cb fp32 q256 block_p 32 w8": dict(q=256, block_p=32, num_warps=8,
                                             share_cb=True),                              # 245/0
    "share_cb fp16 q256 block_p 32 w8": dict(q=256, block_p=32, num_warps=8, share_cb=True,
                                             state_dtype=F16),
    "share_cb fp32 q128 block_p 32 w8": dict(q=128, block_p=32, num_warps=8, share_cb=True),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=110)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    t0 = time.time()
    gpu = torch.cuda.is_available()
    b, l, h, p, g, n = (4, 4096, 80, 64, 1, 128) if gpu else (1, 64, 2, 8, 1, 16)
    args, kw = make_inputs(b, l, h, p, g, n, dtype=torch.bfloat16 if gpu else torch.float32,
                           device="cuda" if gpu else "cpu")
    rows, refs = [], {}
    theirs = load_mamba_ssm_ssd() if gpu else None
    if theirs is not None:
        rows.append(dict(name="mamba_ssm q256", ms=time_ms(lambda: theirs(*args, 256, **kw))))
    for q in (256, 128):
        qq = q if gpu else q // 16
        refs[q] = unfused.ssd_forward(*args, qq, **kw)[0]
        rows.append(dict(name=f"ours unfused q{q}",
                         ms=time_ms(lambda qq=qq: unfused.ssd_forward(*args, qq, **kw))))
    for name, v in VARIANTS.items():
        if time.time() - t0 > a.limit:
            rows.append(dict(name=name, error="skipped: time limit"))
            continue
        v = dict(v)
        q = v.pop("q")
        qq = q if gpu else q // 16
        if not gpu:
            v.pop("block_p", None)
        f = lambda qq=qq, v=v: ssd_fused_forward(*args, qq, **kw, **v)[0]
        try:
            err = rel_error(f(), refs[q])
            rows.append(dict(name=name, ms=time_ms(f), rel_err_vs_unfused=err))
        except Exception as e:  # noqa: BLE001 - a variant that fails to compile is a row too
            rows.append(dict(name=name, error=f"{type(e).__name__}: {e}"[:200]))
        print(rows[-1], flush=True)
    base = rows[0]["ms"] if theirs is not None else None
    print(f"\nb{b} l{l} h{h} p{p} n{n} g{g}, {'bf16 H200' if gpu else 'fp32 CPU interpreter'}")
    for r in rows:
        ratio = f"{r['ms'] / base:6.2f}" if base and "ms" in r else "     -"
        ms = f"{r['ms']:8.3f}" if "ms" in r else r.get("error", "")
        err = f"  err {r['rel_err_vs_unfused']:.1e}" if "rel_err_vs_unfused" in r else ""
        print(f"{r['name']:48s} {ms} {ratio}{err}")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
