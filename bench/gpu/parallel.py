"""Device script for chapter 14: the work of one rank at realistic shard sizes, on one GPU.

What a rank of ``selective_scan_cp`` / ``mamba_chunk_scan_combined_cp`` computes besides the
communication, timed with CUDA events at the cost model's shapes (bf16, fp32 states):

    Mamba-1 b2 d2048 n16 (z, D, delta_bias, softplus) and SSD b1 h80 p64 n128 g1 chunk 256,
    8k, 16k, 32k and 64k tokens per shard:
      fwd         the scan from zero (rank 0's pass; the summary pass of the others)
      fwd_h0      the fix-up: the same scan from a given initial state
      fwd_bwd     forward + backward from zero
      fwd_bwd_h0  forward + backward from an initial state, with a gradient on the last state
    plus the local ⊗-scan of R summaries of the all-gather algorithm (R = 8 … 1024), and the
    initial-state kernels checked against the PyTorch scans (relative error) at 8k tokens.

Run from the repo root on the GPU machine (≤ 60 s on one H200):

    python3 -m bench.gpu.parallel OUTDIR

Prints one row per measurement and a table last; records OUTDIR/<device>_parallel_<date>.json
(``bench.gpu.record``; ``mambalearn.parallel.cost`` reads its tables from docs/results).
"""

import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

from bench.gpu.record import record  # noqa: E402
from mambalearn.parallel.selective import takes_initial_state  # noqa: E402
from mambalearn.parallel.summary import rank_scan  # noqa: E402
from mambalearn.testing import rel_error  # noqa: E402
from mambalearn.timing import time_ms  # noqa: E402

METHOD = ("CUDA events (mambalearn.timing.time_ms); bf16 inputs, fp32 states; ms per shard: fwd = "
          "the scan from zero, fwd_h0 = from a given state (the fix-up), fwd_bwd(_h0) = forward + "
          "backward; rank_scan = the local ⊗-scan of R summaries (summary.rank_scan)")
BUDGET_S = 55.0  # stop timing new rows after this (the call's limit is the lead's)
LENGTHS = (8192, 16384, 32768, 65536)
MAMBA1 = dict(b=2, d=2048, n=16)
SSD = dict(b=1, h=80, p=64, n=128, g=1, chunk=256)
T0 = time.monotonic()


def _mamba1_inputs(l, b=2, d=2048, n=16, dev="cuda", dtype=torch.bfloat16):
    bf = dict(device=dev, dtype=dtype)
    f32 = dict(device=dev, dtype=torch.float32)
    x = dict(u=torch.randn(b, d, l, **bf), delta=torch.randn(b, d, l, **bf) * 0.5,
             A=-torch.rand(d, n, **f32) - 0.5, B=torch.randn(b, n, l, **bf),
             C=torch.randn(b, n, l, **bf), D=torch.randn(d, **f32), z=torch.randn(b, d, l, **bf),
             delta_bias=torch.randn(d, **f32) * 0.1)
    return x, torch.randn(b, d, n, **f32)


def _ssd_inputs(l, b=1, h=80, p=64, n=128, g=1, chunk=256, dev="cuda", dtype=torch.bfloat16):
    bf = dict(device=dev, dtype=dtype)
    f32 = dict(device=dev, dtype=torch.float32)
    x = dict(x=torch.randn(b, l, h, p, **bf), dt=torch.randn(b, l, h, **bf) * 0.5,
             A=-torch.rand(h, **f32) - 0.5, B=torch.randn(b, l, g, n, **bf),
             C=torch.randn(b, l, g, n, **bf), D=torch.randn(h, **f32),
             z=torch.randn(b, l, h, p, **bf), dt_bias=torch.randn(h, **f32) * 0.1)
    return x, torch.randn(b, h, p, n, **f32)


def _leaves(x):
    return {k: v.detach().clone().requires_grad_() for k, v in x.items()}


def _fwd_bwd(call, x, h0):
    def run():
        leaves = _leaves(x)
        h = None if h0 is None else h0.detach().clone().requires_grad_()
        out, last = call(leaves, h)
        (out.float().sum() + last.sum()).backward()
    return run


def _times(call, x, h0, with_h0=True):
    """fwd, fwd_h0, fwd_bwd, fwd_bwd_h0 (ms) of ``call(leaves, h0) -> (out, last)``."""
    t = {}
    with torch.no_grad():
        t["fwd"] = time_ms(lambda: call(x, None), warmup=5, rep=50)
        if with_h0:
            t["fwd_h0"] = time_ms(lambda: call(x, h0), warmup=5, rep=50)
    t["fwd_bwd"] = time_ms(_fwd_bwd(call, x, None), warmup=5, rep=50)
    if with_h0:
        t["fwd_bwd_h0"] = time_ms(_fwd_bwd(call, x, h0), warmup=5, rep=50)
    return t


def mamba1_rows(rows, lengths=LENGTHS, dims=MAMBA1, dev="cuda"):
    from mambalearn.mamba1 import selective_scan_fn

    has_h0 = takes_initial_state(selective_scan_fn)

    def call(x, h0):
        kw = {} if h0 is None else dict(initial_state=h0)
        return selective_scan_fn(**x, delta_softplus=True, return_last_state=True, **kw)

    for l in lengths:
        x, h0 = _mamba1_inputs(l, dev=dev, **dims)
        _emit(rows, dict(model="mamba1", shape=_name(dims), tokens=l,
                         initial_state_supported=has_h0, **_times(call, x, h0, has_h0)))
        if _late():
            break


def ssd_rows(rows, lengths=LENGTHS, dims=SSD, dev="cuda"):
    from mambalearn.mamba2 import mamba_chunk_scan_combined

    def call(x, h0):
        return mamba_chunk_scan_combined(**x, chunk_size=dims["chunk"], initial_states=h0,
                                         dt_softplus=True, return_final_states=True)

    for l in lengths:
        x, h0 = _ssd_inputs(l, dev=dev, **dims)
        _emit(rows, dict(model="ssd", shape=_name(dims), tokens=l,
                         **_times(call, x, h0)))
        if _late():
            break


def rank_scan_rows(rows, ranks=(8, 64, 1024), m1=MAMBA1, s=SSD, dev="cuda"):
    """The all-gather algorithm's local step: rank_scan over R summaries (R−1 ⊗ applications)."""
    for model, state, decay in (
            ("mamba1", (m1["b"], m1["d"], m1["n"]), (m1["b"], m1["d"], m1["n"])),
            ("ssd", (s["b"], s["h"], s["p"], s["n"]), (s["b"], s["h"], 1, 1))):
        for R in ranks:
            P = torch.rand(R, *decay, device=dev)
            h = torch.randn(R, *state, device=dev)
            ms = time_ms(lambda P=P, h=h: rank_scan(P, h), warmup=5, rep=50)
            _emit(rows, dict(model=model, what="rank_scan", R=R, ms=ms))
            if _late():
                return


def accuracy_rows(rows, l=8192, m1=MAMBA1, s=SSD, dev="cuda"):
    """The initial-state kernels against the PyTorch scans, 8k tokens (relative errors)."""
    from mambalearn.mamba1 import selective_scan_fn
    from mambalearn.mamba2 import mamba_chunk_scan_combined
    from mambalearn.mamba2.reference import mamba_chunk_scan_ref
    from mambalearn.scan.chunked import selective_scan_chunked

    x, h0 = _ssd_inputs(l, dev=dev, **s)
    with torch.no_grad():
        out, fin = mamba_chunk_scan_combined(**x, chunk_size=s["chunk"], initial_states=h0,
                                             dt_softplus=True, return_final_states=True)
        ref, ref_fin = mamba_chunk_scan_ref(**{k: v.float() for k, v in x.items()},
                                            chunk_size=s["chunk"], initial_states=h0,
                                            dt_softplus=True, return_final_states=True)
    _emit(rows, dict(model="ssd", what=f"initial_states vs oracle (fp32), {l} tokens",
                     out=rel_error(out, ref), final=rel_error(fin, ref_fin)))
    if takes_initial_state(selective_scan_fn):
        x, h0 = _mamba1_inputs(l, dev=dev, **m1)
        with torch.no_grad():
            out, last = selective_scan_fn(**x, delta_softplus=True, return_last_state=True,
                                          initial_state=h0)
            ref, ref_last = selective_scan_chunked(**{k: v.float() for k, v in x.items()},
                                                   delta_softplus=True, return_last_state=True,
                                                   initial_state=h0, chunk_size=256)
        _emit(rows, dict(model="mamba1", what=f"initial_state vs chunked (fp32), {l} tokens",
                         out=rel_error(out, ref), last=rel_error(last, ref_last)))


def _name(dims):
    dtype = str(dims.get("dtype", torch.bfloat16)).replace("torch.", "")
    return " ".join(f"{k}{v}" for k, v in dims.items() if k != "dtype") + f" {dtype}"


def _late():
    return time.monotonic() - T0 > BUDGET_S


def _emit(rows, row):
    row["elapsed_s"] = round(time.monotonic() - T0, 1)
    rows.append(row)
    print(json.dumps(row), flush=True)


def main(out_dir):
    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return
    rows = []
    try:
        for part in (accuracy_rows, ssd_rows, mamba1_rows, rank_scan_rows):
            if _late():
                rows.append(dict(skipped=part.__name__, reason="time budget"))
                continue
            try:
                part(rows)
            except Exception as e:  # noqa: BLE001 - record and go on: one failure must not lose all
                rows.append(dict(failed=part.__name__, error=f"{type(e).__name__}: {e}"))
                print(rows[-1], flush=True)
    finally:  # what was measured is recorded, even when a part was cut short
        record("parallel", rows, f"python3 -m bench.gpu.parallel {out_dir}", peers={},
               out_dir=out_dir, method=METHOD)
    print(table(rows))


def table(rows):
    """The timing rows as a text table (ms; n/a: the kernel has no initial-state input)."""
    keys = ("fwd", "fwd_h0", "fwd_bwd", "fwd_bwd_h0")
    lines = [f"{'model':7} {'tokens':>7} " + " ".join(f"{k:>10}" for k in keys)]
    for r in (r for r in rows if "tokens" in r):
        cells = " ".join(f"{r[k]:10.3f}" if k in r else f"{'n/a':>10}" for k in keys)
        lines.append(f"{r['model']:7} {r['tokens']:7d} {cells}")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp"))
