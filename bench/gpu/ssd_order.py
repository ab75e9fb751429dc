"""Device script, chapter 11: does the fused SSD forward's time depend on what ran before it?

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.ssd_order bench | backward

Times the default fused forward and its three launches alone (chunk cumsum, states, outputs),
with chapter 10's unfused forward as the control: ``backward`` at three shapes first, after our
fwd+bwd at b4 and after mamba_ssm's; ``bench`` at b1 along ``mambalearn bench ssd``'s own order
(``bench_order``). Why (one slow run of the bench topic): bench/NOTES_ssd.md. A table last.
"""

import argparse

import torch

from bench.gpu.ssd_fused import part_fn
from course.bench import time_ms
from course.bench.ssd import HEADS, fwd_bwd, load_mamba_ssm_ssd, make_inputs
from mambalearn.mamba2 import mamba_chunk_scan_combined as ours
from mambalearn.mamba2.chunk import ssd_forward

SHAPES = [dict(b=16, l=1024), dict(b=4, l=4096), dict(b=1, l=16384)]


def parts(args, kw):
    """ms of the fused forward, its launches alone (as it configures them), and the unfused
    forward, at one shape."""
    q = 256
    launch = lambda kernel: time_ms(part_fn(kernel, q, {}, args, kw))
    return dict(fused=time_ms(lambda: ours(*args, q, **kw)), cumsum=launch("cumsum"),
                states=launch("states"), outputs=launch("outputs"),
                unfused=time_ms(lambda: ssd_forward(*args, q, **kw)[0]))


def sweep(label, table):
    for s in SHAPES:
        args, kw = make_inputs(**s, **HEADS)
        row = parts(args, kw)
        table.append((label, f"b{s['b']} l{s['l']}", row))
        print(label, s, {k: round(v, 3) for k, v in row.items()}, flush=True)
        del args, kw


def bench_order(table):
    """The order of ``mambalearn bench ssd`` (forward rows at b4, its fwd+bwd rows with the oracle,
    then the forward rows at b1), the b1 fused forward and launches probed after each step."""
    from course.bench import ssd

    theirs, fla = ssd.load_mamba_ssm_ssd(), ssd.load_fla()
    b1 = make_inputs(b=1, l=16384, **HEADS)
    probe = lambda label: table.append((label, "b1 l16384", parts(*b1))) or print(
        label, {k: round(v, 3) for k, v in table[-1][2].items()}, flush=True)
    probe("bench order: first")
    args, kw = make_inputs(b=4, l=4096, **HEADS)
    name = ssd.shape_name(b=4, l=4096, q=256, dtype=torch.bfloat16, **HEADS)
    for r in ssd._forward_rows(args, kw, 256, (), name, theirs, fla, None):
        print(r["backend"], round(r["ms"], 3), flush=True)
    probe("after b4 forward rows")
    for r in ssd._fwd_bwd_rows(args, kw, 256, name, theirs, oracle=True):
        print(r["backend"], round(r["ms"], 3), flush=True)
    probe("after b4 fwd+bwd rows")
    del args, kw
    name = ssd.shape_name(b=1, l=16384, q=256, dtype=torch.bfloat16, **HEADS)
    for r in ssd._forward_rows(*b1, 256, (), name, theirs, fla, None):
        print(r["backend"], round(r["ms"], 3), flush=True)
    probe("after b1 forward rows")


def after_backward(table):
    """The three shapes first, after our fwd+bwd at b4, after mamba_ssm's (call 4)."""
    sweep("first", table)
    args, kw = make_inputs(b=4, l=4096, **HEADS)
    dout = torch.randn_like(args[0])
    go = fwd_bwd(lambda *a, **k: ours(*a, 256, **k), args, kw, dout)
    print("ours fwd+bwd b4", round(time_ms(go), 3), flush=True)
    sweep("after ours fwd+bwd", table)
    theirs = load_mamba_ssm_ssd()
    go = fwd_bwd(lambda *a, **k: theirs(*a, 256, **k), args, kw, dout)
    print("mamba_ssm fwd+bwd b4", round(time_ms(go), 3), flush=True)
    del args, kw, go
    sweep("after mamba_ssm fwd+bwd", table)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("order", choices=["bench", "backward"], help="bench: bench_order (call 5); "
                    "backward: after_backward (call 4)")
    table = []
    (bench_order if ap.parse_args().order == "bench" else after_backward)(table)
    keys = list(table[0][2])
    print(f"{'when':26} {'shape':10} " + " ".join(f"{k:>8}" for k in keys))
    for label, shape, row in table:
        print(f"{label:26} {shape:10} " + " ".join(f"{row[k]:8.3f}" for k in keys))


if __name__ == "__main__":
    main()
