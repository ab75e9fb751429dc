"""Chapter 11's single-launch SSD forward: its launch options side by side on the GPU (one call).

    PYTHONUNBUFFERED=1 python3 mambalearn/bench/gpu/ssd_fused.py [--limit S] [--json FILE]

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
from mambalearn.triton.ssd import forward as unfused
from mambalearn.triton.ssd.fused import ssd_fused_forward

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


NB11_CASE = """
import time, torch
from mambalearn import ssd
from mambalearn.testing import assert_close, dot_dtype
from mambalearn.triton.ssd import fused as ssd_fused
dev = "cuda" if torch.cuda.is_available() else "cpu"
b, l, h, p, n, q = (2, 1000, 8, 64, 128, 256) if dev == "cuda" else (1, 70, 2, 16, 16, 32)
gen = torch.Generator(device=dev).manual_seed(1)
r = lambda *s: torch.randn(*s, generator=gen, device=dev)
x, B, C = r(b, l, h, p), r(b, l, 1, n), r(b, l, 1, n)
dt, A, D = r(b, l, h) - 1, -torch.rand(h, generator=gen, device=dev) - 0.5, r(h)
h0 = r(b, h, p, n)
want, want_f = ssd.mamba_chunk_scan_ref(*(t.double() for t in (x, dt, A, B, C)), q, D=D.double(),
                                        initial_states=h0.double(), dt_softplus=True,
                                        return_final_states=True)
for rep in range(3):
    t0 = time.time()
    out, final = ssd_fused.ssd_fused_forward(x, dt, A, B, C, q, D=D, initial_states=h0,
                                             dt_softplus=True, chunk_major=CHUNK_MAJOR)
    torch.cuda.synchronize() if dev == "cuda" else None
    print(f"chunk_major={CHUNK_MAJOR} call {rep}: {time.time() - t0:.2f} s", flush=True)
assert_close(out, want, dtype=dot_dtype(out), norm=True)
assert_close(final, want_f, dtype=dot_dtype(final), norm=True)
print(f"chunk_major={CHUNK_MAJOR}: notebook 11's check passes", flush=True)
"""


def check_nb11(timeout=45):
    """Notebook 11's correctness cell (fp32, g 1, D, initial states) for both ticket orders,
    each in its own process under a timeout: a kernel that never returns shows as a timeout."""
    import subprocess
    import sys

    for cm in (True, False):
        try:
            r = subprocess.run([sys.executable, "-c", NB11_CASE.replace("CHUNK_MAJOR", str(cm))],
                               capture_output=True, text=True, timeout=timeout)
            print(r.stdout + r.stderr[-1500:], f"rc={r.returncode}", flush=True)
        except subprocess.TimeoutExpired:
            print(f"chunk_major={cm}: TIMEOUT after {timeout} s (hung)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=110)
    ap.add_argument("--json", default=None)
    ap.add_argument("--check-nb11", action="store_true")
    a = ap.parse_args()
    if a.check_nb11:
        return check_nb11()
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
