"""What the SSD kernels become on an H200, without one: sm_90 builds on a CPU (chapters 10–11).

    TRITON_INTERPRET=0 python -m bench.gpu.ssd_sm90 [KERNEL ...] [--shape b,l,h,p,g,n]
        [--chunk Q] [--config JSON]

KERNEL: states, outputs, one_launch, chunk_scan (default: the first three), at Mamba-2 2.7B's
shape, bf16, with ``config.default_config`` changed by ``--config`` (``Config.replace``'s
arguments as JSON: ``'{"states": {"tma": false}}'`` the pointer-load states kernel,
``'{"states": {"split": 4}}'`` both launches of a split walk). Each
launcher runs with meta tensors and a recorder in place of its kernel; the recorded launch is
compiled with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)``, specialised as Triton's launcher
would (``native_specialize_impl``: 16-divisible ints and pointers marked, ints equal to 1 and None
made constants), and read with the ``cuobjdump`` Triton ships: registers, spill bytes, shared
memory, and the instructions of each loop body (``cuobjdump -sass``). The figures of
bench/NOTES_ssd.md come from this. No GPU is needed; ``TRITON_INTERPRET=0`` keeps the kernels
compilable (``mambalearn.device`` would otherwise switch to the interpreter).
"""

import argparse
import json
import os
import re

import torch
import triton
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.runtime.jit import JITFunction, native_specialize_impl

from mambalearn.compiled import opcode_counts, read_cubin
from mambalearn.mamba2 import chunk as forward
from mambalearn.mamba2.fused import one_launch, outputs, states

STATES_KERNEL = {False: "_chunk_states_kernel", True: "_chunk_states_tma_kernel"}  # by tma
OPS = ("HGMMA", "HMMA", "MUFU", "LDG", "LDGSTS", "UTMALDG", "STG", "LDL", "STL", "BAR", "SHFL")


class _Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kw)`` records the call."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((grid, args, kw))


def record(module, name, launcher, *args, **kw):
    """[(grid, args, kwargs)] of the launches of ``module.name`` that ``launcher`` makes."""
    kernel, rec = getattr(module, name), _Recorder()
    setattr(module, name, rec)
    try:
        launcher(*args, **kw)
    finally:
        setattr(module, name, kernel)
    return kernel, rec.calls


def compile_sm90(kernel, args, kw):
    """Build one recorded launch for sm_90. Returns (resources dict, SASS text)."""
    fn = JITFunction(getattr(kernel, "fn", kernel))
    opts = {k: kw[k] for k in ("num_warps", "num_stages", "maxnreg") if k in kw}
    consts = {k: v for k, v in kw.items() if k not in opts}
    sig, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        a = consts[name] if name in consts else args[i]
        if name in consts or a is None:
            sig[name], constexprs[name] = "constexpr", a
            continue
        ty, spec = native_specialize_impl(BaseBackend, a, False, True, True)
        sig[name] = ty  # a tuple's (of strides): a tuple of its elements' types

        def mark(path, ty, spec):  # each value an argument holds, a tuple's element by element
            if isinstance(ty, tuple):
                for j, (t, s) in enumerate(zip(ty, spec, strict=True)):
                    mark(path + (j,), t, s)
            elif ty == "constexpr":  # an int equal to 1
                constexprs[path] = spec
            elif spec == "D":
                attrs[path] = [["tt.divisibility", 16]]

        mark((i,), ty, spec)
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    usage, sass = read_cubin(k.asm["cubin"])
    res = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", usage))
    ops = opcode_counts(sass)
    return dict(registers=int(res["REG"]), spill_bytes=int(res["STACK"]) + int(res["LOCAL"]),
                shared_kb=round(k.metadata.shared / 1024, 1), instructions=sum(ops.values()),
                loops=loop_bodies(sass), **{o: ops.get(o, 0) for o in OPS}), sass


def loop_bodies(sass):
    """Instruction counts of the loop bodies that contain tensor-core work (a backward branch
    whose range holds an HGMMA/HMMA), smallest first."""
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", sass)
    addr = [(int(a, 16), op, rest) for a, op, rest in lines]
    bodies = []
    for a, op, rest in addr:
        m = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if m and int(m.group(1), 16) < a:
            body = [o for x, o, _ in addr if int(m.group(1), 16) <= x <= a]
            if any(o.startswith(("HGMMA", "HMMA")) for o in body):
                bodies.append(len(body))
    return sorted(set(bodies))


def launches(names, shape, q, changes):
    """{kernel: [(grid, args, kwargs)]} for the chosen kernels at ``shape``, chunk ``q``, with
    the default config changed by ``changes`` (``Config.replace``'s arguments)."""
    from mambalearn.mamba2.config import default_config

    b, l, h, p, g, n = shape
    cfg = default_config((b, l, h, p, g, n, q), "meta").replace(**changes)
    e = lambda *s, dt=torch.bfloat16: torch.empty(*s, dtype=dt, device="meta")
    x, B, C = e(b, l, h, p), e(b, l, g, n), e(b, l, g, n)
    dt, A, D = e(b, l, h, dt=torch.float32), e(h, dt=torch.float32), e(h, dt=torch.float32)
    c = triton.cdiv(l, q)
    dtc, H = e(b, h, c, q, dt=torch.float32), e(b, c, h, p, n)
    jobs = dict(
        states=(states, STATES_KERNEL[cfg.states.tma], states.chunk_states, (x, B, dtc, dtc),
                dict(config=cfg.states)),
        outputs=(outputs, "_chunk_outputs_kernel", outputs.chunk_outputs,
                 (x, C, B, dtc, dtc, H, D), dict(config=cfg.outputs)),
        one_launch=(one_launch, "_ssd_one_launch_kernel", one_launch.ssd_one_launch,
                    (x, dt, A, B, C, q, D, None, A, None, True), dict(config=cfg.one)),
        chunk_scan=(forward, "_chunk_scan_kernel", forward.chunk_scan,
                    (x, C, e(b, c, g, q, q, dt=torch.float32), dtc, dtc, H, D, None, None),
                    dict(cfg=cfg.stages)))
    return {k: record(*jobs[k][:3], *jobs[k][3], **jobs[k][4]) for k in names}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kernels", nargs="*", default=["states", "outputs", "one_launch"])
    ap.add_argument("--shape", default="4,4096,80,64,1,128", help="b,l,h,p,g,n")
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--config", default="{}", help='e.g. {"outputs": {"block_k": 32}}')
    a = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("run with TRITON_INTERPRET=0: interpreted kernels cannot be compiled")
    shape = tuple(int(v) for v in a.shape.split(","))
    for name, (kernel, calls) in launches(a.kernels, shape, a.chunk, json.loads(a.config)).items():
        for grid, args, kw in calls:
            res, _ = compile_sm90(kernel, args, kw)
            print(f"{name:10s} grid={grid} {json.dumps(res)}", flush=True)


if __name__ == "__main__":
    main()
