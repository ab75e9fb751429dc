"""Bench topic ``mamba3``: chapter 15's kernels against mamba_ssm's own Mamba-3 Triton kernels.

Rows: forward and forward+backward of ``mamba3_siso_combined`` (ours and theirs at chunk 64,
bf16, b8 l2048 h32 p64 n128, one Q/K head, 32 angles, with D and Z), their agreement with the
float64 oracle, and the decode steps — SISO ours and theirs, MIMO ours at ranks 1–8 (mamba_ssm's
MIMO step is CuTe DSL, not runnable here) — with the floor of each (``mamba3_cost``). Without a
GPU, ``sm90_builds`` compiles every kernel of ours for sm_90 and reports registers and spills
(``TRITON_INTERPRET=0 python -m course.bench.mamba3 --sm90``).

Loading mamba_ssm's kernels (``load``): on a GPU ``_reference.load`` with its **full** autotune
(27–81 configs per kernel: a peer is timed as its users run it; minutes of compiling on a fresh
machine), or with ``autotune="trimmed"`` each autotuner cut to num_stages 2, num_warps 4 or 8, no
maxnreg and chunk 64 (``trim``: for correctness tests, which need any config, not the fastest).
On a CPU three things stand in the way of Triton's interpreter, and each gets a stand-in here:
- its utils use PTX inline assembly (cos.approx, tanh.approx): a stub module with the same names,
  jitted from tl.cos / tl.sin / tl.sigmoid, replaces it;
- its autotuners benchmark configs, which needs a GPU driver: one config is kept;
- the interpreter's ``tl.dot`` multiplies bfloat16 *bit patterns* as integers (mamba_ssm casts
  every input to bf16): ``mambalearn.triton.interpreter`` widens bf16 operands to float32 first,
  for every kernel in the process, as soon as ``mambalearn.triton`` is imported (``load`` does).
einops, imported but unused by the kernels, is stubbed if missing. None if the source is absent.
"""

# ruff: noqa: I001  (mambalearn.device must set TRITON_INTERPRET before triton is imported)
import importlib
import os
import pkgutil
import sys
import types

import torch

from mambalearn import device as _device  # noqa: F401
from course.bench import _reference
from mambalearn.triton import interpreter  # noqa: F401  (bf16 tl.dot right in the interpreter)

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

KERNELS = ("angle_dt", "mamba3_siso_fwd", "mamba3_siso_bwd", "mamba3_siso_step")
PKG = "mamba_ssm.ops.triton.mamba3"


@triton.jit
def cos_approx(x):
    return tl.cos(x)


@triton.jit
def sin_approx(x):
    return tl.sin(x)


@triton.jit
def tanh_approx(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def sech2_approx(x):
    t = 2.0 * tl.sigmoid(2.0 * x) - 1.0
    return 1.0 - t * t


@triton.jit
def sigmoid_approx(x):
    return tl.sigmoid(x)


@triton.jit
def silu(x):
    return x * tl.sigmoid(x)


def _cpu_utils():
    """A stand-in for mamba_ssm's utils module: the same names, no inline assembly."""
    mod = types.ModuleType(f"{PKG}.utils")
    for fn in (cos_approx, sin_approx, tanh_approx, sech2_approx, sigmoid_approx, silu):
        setattr(mod, fn.fn.__name__, fn)
    return mod


def load(name="mamba3_siso_combined", module="mamba3_siso_combined", autotune="full"):
    """mamba_ssm's ``name`` from ``ops/triton/mamba3/<module>``, or None if not importable.
    ``autotune``: "full" (its own, as its users run it) or "trimmed" (``trim``), on a GPU."""
    if autotune not in ("full", "trimmed"):
        raise ValueError(f'autotune must be "full" or "trimmed", got {autotune!r}')
    if torch.cuda.is_available():
        fn = _reference.load(f"ops.triton.mamba3.{module}", name)
        if fn is not None and autotune == "trimmed":
            for kernel_module in KERNELS:
                trim(importlib.import_module(f"{PKG}.{kernel_module}"))
        return fn
    if _reference.load("ops.triton.mamba3.utils", "silu") is None:  # absent: the reason printed
        return None
    sys.modules.setdefault("einops", types.SimpleNamespace(rearrange=None, repeat=None))
    sys.modules[f"{PKG}.utils"] = _cpu_utils()
    for kernel_module in KERNELS:
        trim(importlib.import_module(f"{PKG}.{kernel_module}"), keep=1)
    return getattr(importlib.import_module(f"{PKG}.{module}"), name)


def trim(mod, keep=None):
    """Cut every autotuner of ``mod`` to num_stages 2, num_warps 4/8, no maxnreg, chunk 64
    (or to its first ``keep`` configs: the interpreter cannot benchmark any)."""
    for obj in vars(mod).values():
        if not isinstance(obj, triton.runtime.autotuner.Autotuner):
            continue
        if keep:
            obj.configs = obj.configs[:keep]
            continue
        ok = [c for c in obj.configs if c.num_stages == 2 and c.num_warps in (4, 8)
              and getattr(c, "maxnreg", None) is None and c.kwargs.get("CHUNK_SIZE", 64) == 64]
        obj.configs = ok or obj.configs[:1]


# ---------------------------------------------------------------------------------------------
# shapes, inputs, the floors

SHAPE = dict(b=8, l=2048, h=32, g=1, n=128, p=64, na=32)  # mamba_ssm's tuned case, 32 angles
DECODE = dict(b=64, h=64, p=64, n=128)  # state 134 MB float32
# l = 1008 = 15·64 + 48: a partial last chunk, yet l a multiple of 16 and h, g, n, p, na as in
# SHAPE, so that neither side compiles its kernels again for the timings
AGREE = dict(b=2, l=1008, h=32, g=1, n=128, p=64, na=32)


def inputs(b, l, h, g, n, p, na, dtype=torch.bfloat16, device=None, seed=0, grad=False):
    """Random Mamba-3 SISO inputs in mamba_ssm's layouts, as its Mamba3 module makes them
    (ADT, DT, the biases and D float32; Δ ≈ softplus of a normal, A ≈ −softplus)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, device=device)
    DT = torch.nn.functional.softplus(r(b, h, l) - 3.0)
    kw = dict(Q=r(b, l, g, n).to(dtype), K=r(b, l, g, n).to(dtype), V=r(b, l, h, p).to(dtype),
              ADT=-torch.nn.functional.softplus(r(b, h, l)) * DT, DT=DT, Trap=r(b, h, l).to(dtype),
              Q_bias=1 + 0.1 * r(h, n), K_bias=1 + 0.1 * r(h, n), Angles=r(b, l, h, na).to(dtype),
              D=r(h), Z=r(b, l, h, p).to(dtype))
    return {k: v.requires_grad_(grad) for k, v in kw.items()}


def mamba3_cost(b, l, h, g, n, p, na, chunk=64, backward=False, in_bytes=2):
    """What any Mamba-3 SISO forward (+ backward) must do (bench/NOTES_mamba3.md):

    bytes    Q, K, V, Z, Trap, Angles read once (``in_bytes``), ADT, DT (fp32), out written;
             backward: the inputs and dout read again, dQ, dK, dV, dZ, dAngles, dTrap (and dADT,
             dDT fp32) written — nothing else (a perfect recomputation)
    matmuls  on full (q × q) chunk tiles, per token and head: q kᵀ, (·) v, q Hᵀ and the chunk
             state, 2q(n + p) + 4pn; backward dq, dk, s (q²n), dv, dP (q²p), dq, dk, dv, dS (pn)
    exps     the decays (q per token), cos, sin, tanh of the angles (3 na)
    """
    from mambalearn.roofline import Cost

    tokens = b * l * h
    per_in = 2 * b * l * g * n + 3 * b * l * h * p + b * l * h * na + b * h * l  # in_bytes each
    fwd = Cost(bytes=in_bytes * per_in + 8 * b * h * l,
               matmul_flops=tokens * (2 * chunk * (n + p) + 4 * p * n),
               exps=tokens * (chunk + 3 * na))
    if not backward:
        return fwd
    bwd_bytes = in_bytes * (2 * per_in + b * l * h * p) + 16 * b * h * l
    return Cost(bytes=fwd.bytes + bwd_bytes,
                matmul_flops=fwd.matmul_flops + tokens * 2 * (3 * chunk * n + 2 * chunk * p
                                                              + 4 * p * n),
                exps=2 * fwd.exps)


# ---------------------------------------------------------------------------------------------
# the measurements


def _fwd_bwd(fn, kw, chunk):
    def run():
        out = fn(**kw, chunk_size=chunk)
        out.backward(torch.ones_like(out))
    return run


def timings(shape=SHAPE, chunks=(64,), theirs=None):
    """Rows of forward and forward+backward milliseconds, ours at ``chunks`` and mamba_ssm's at
    64, with the share of the floor (``mamba3_cost``) each reaches."""
    from mambalearn.roofline import floor
    from mambalearn.timing import time_ms
    from mambalearn.mamba3 import mamba3_siso_combined

    kw = inputs(**shape, grad=True)
    name = "b{b} l{l} h{h} p{p} n{n}".format(**shape)
    floors = {what: floor(mamba3_cost(**shape, backward=what == "fwd+bwd"))["floor_ms"]
              for what in ("fwd", "fwd+bwd")}
    rows, ref_ms = [], {}
    backends = [("mamba_ssm", theirs, 64)] if theirs else []
    backends += [(f"ours q{c}", mamba3_siso_combined, c) for c in chunks]
    for backend, fn, chunk in backends:
        with torch.no_grad():
            fwd = time_ms(lambda fn=fn, chunk=chunk: fn(**kw, chunk_size=chunk))
        both = time_ms(_fwd_bwd(fn, kw, chunk))
        for what, ms in (("fwd", fwd), ("fwd+bwd", both)):
            ref_ms.setdefault(what, ms if backend == "mamba_ssm" else None)
            ratio = ms / ref_ms[what] if ref_ms.get(what) else None
            rows.append(dict(topic="mamba3", backend=f"{backend} {what}", shape=name, ms=ms,
                             ratio=ratio, floor_pct=100 * floors[what] / ms))
    return rows


def agreement(shape, dtype, theirs=None, chunk=64):
    """Relative errors (‖a − e‖/‖e‖) of outputs and gradients vs the float64 oracle (chunked
    autograd on the device), ours and mamba_ssm's, on the bf16-rounded inputs in ``dtype``."""
    from mambalearn import mamba3
    from mambalearn.testing import rel_error
    from mambalearn.mamba3 import mamba3_siso_combined

    base = inputs(**shape, dtype=torch.bfloat16)  # rounded once: every side sees the same values
    names = list(base)
    results = {}
    for who, fn, dt in (("oracle", mamba3.mamba3_siso_chunked, torch.float64),
                        ("ours", mamba3_siso_combined, dtype), ("mamba_ssm", theirs, dtype)):
        if fn is None:
            continue
        cast = lambda v, dt=dt: dt if dt == torch.float64 or v.dtype == torch.bfloat16 \
            else torch.float32  # ADT, DT, biases, D stay float32 on the kernels' side
        kw = {k: v.detach().to(cast(v)).requires_grad_() for k, v in base.items()}
        out = fn(**kw, chunk_size=chunk)
        g = torch.Generator(device=out.device).manual_seed(1)
        out.backward(torch.randn(out.shape, generator=g, device=out.device).to(out.dtype))
        results[who] = [out] + [kw[k].grad for k in names]
    rows = []
    for i, what in enumerate(["out"] + [f"d{k}" for k in names]):
        rows.append({"what": what, **{who: rel_error(r[i], results["oracle"][i])
                                      for who, r in results.items() if who != "oracle"}})
    return rows


def decode_inputs(shape=DECODE, rank=None, device=None):
    """Arguments of one decode step: SISO (``rank`` None: mamba3_siso_step's, the cache
    included) or MIMO of ``rank`` (mamba3_mimo_step's but the state)."""
    b, h, p, n = shape["b"], shape["h"], shape["p"], shape["n"]
    na = min(32, n // 2)  # 32 angles, as the scan's shape
    if rank is None:
        kw = inputs(b, 1, h, 1, n, p, na, device=device)
        one = {k: (v[:, 0] if k in ("Q", "K", "V", "Angles", "Z") else
                   v[..., 0] if k in ("ADT", "DT", "Trap") else v) for k, v in kw.items()}
        dev = one["V"].device
        one["Input_States"] = [torch.zeros(b, h, na, device=dev),
                               torch.randn(b, h, p, n, device=dev),
                               torch.randn(b, h, n, device=dev), torch.randn(b, h, p, device=dev)]
        return one
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    m = lambda *s: torch.randn(*s, device=dev, dtype=torch.bfloat16)
    r = rank
    return dict(Bstate=m(b, r, h, n), Xstate=m(b, h, p), A=-torch.rand(b, h, device=dev),
                B=m(b, r, h, n), C=m(b, r, h, n), D=torch.randn(h, device=dev), x=m(b, h, p),
                dt=torch.rand(b, h, device=dev), trap=torch.rand(b, h, device=dev),
                xproj=m(r, h, p), outproj=m(r, h, p), z=m(b, h, p), zproj=m(r, h, p))


def decode(shape=DECODE, ranks=(1, 2, 4, 8), theirs_step=None):
    """Rows of decode-step milliseconds: SISO ours (and mamba_ssm's), MIMO ours at ``ranks``."""
    from mambalearn.mamba3.step_reference import decode_cost
    from mambalearn.roofline import floor
    from mambalearn.timing import time_ms
    from mambalearn.mamba3 import mamba3_mimo_step, mamba3_siso_step

    b, h, p, n = shape["b"], shape["h"], shape["p"], shape["n"]
    name = f"b{b} h{h} p{p} n{n}"
    one = decode_inputs(shape)
    rows = []
    siso = decode_cost(b, h, p, n)
    backends = [("mamba_ssm siso", theirs_step)] if theirs_step else []
    ref = None
    for backend, fn in backends + [("ours siso", mamba3_siso_step)]:
        ms = time_ms(lambda fn=fn: fn(**one))
        ref = ref or ms  # mamba_ssm's, when it ran first
        rows.append(dict(topic="mamba3", backend=backend, shape=name, ms=ms,
                         ratio=ms / ref if theirs_step and backend.startswith("ours") else None,
                         floor_pct=100 * floor(siso)["floor_ms"] / ms,
                         gflops=siso.flops / ms / 1e6, intensity=siso.intensity))
    state = torch.randn(b, h, p, n, device=one["V"].device)
    for r in ranks:
        cost = decode_cost(b, h, p, n, rank=r)
        a = decode_inputs(shape, rank=r)
        ms = time_ms(lambda a=a: mamba3_mimo_step(state, **a))
        rows.append(dict(topic="mamba3", backend=f"ours mimo r{r}", shape=name, ms=ms,
                         floor_pct=100 * floor(cost)["floor_ms"] / ms,
                         gflops=cost.flops / ms / 1e6, intensity=cost.intensity))
    return rows


# ---------------------------------------------------------------------------------------------
# offline sm_90 builds: what each kernel of ours costs in registers, without a GPU

def _kernel_modules():
    """Every module of ``mambalearn.mamba3`` (a kernel is patched where its launcher reads it:
    under the name the launching module imported it by)."""
    import mambalearn.mamba3 as pkg

    return [importlib.import_module(f"{pkg.__name__}.{m.name}")
            for m in pkgutil.iter_modules(pkg.__path__)]


# a kernel as Triton builds it; in the interpreter (TRITON_INTERPRET=1) its stand-in
_KERNEL_TYPES = (triton.runtime.jit.JITFunction, InterpretedFunction)


def _recorded_launches(fn):
    """Run ``fn`` with every kernel of ours replaced by a recorder: [(kernel, args, kwargs)]."""
    calls, saved = [], []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *a, **k: calls.append((self.kernel, a, k))

    for mod in _kernel_modules():
        for name, obj in vars(mod).items():
            if isinstance(obj, _KERNEL_TYPES) and name.endswith("_kernel"):
                saved.append((mod, name, obj))
    mode, patched = os.environ.get("TRITON_INTERPRET"), interpreter.PATCHED
    try:
        for mod, name, obj in saved:
            setattr(mod, name, Recorder(obj))
        # nothing is launched, so the entry points may take CPU tensors (bf16 too) as they do in
        # the interpreter, while this process compiles for the GPU
        os.environ["TRITON_INTERPRET"], interpreter.PATCHED = "1", True
        fn()
    finally:
        for mod, name, obj in saved:
            setattr(mod, name, obj)
        interpreter.PATCHED = patched
        if mode is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = mode
    return calls


def _sm90_spec(kernel, args, kwargs):
    """What Triton's launcher would compile for this launch on sm_90: (target, ASTSource, options);
    its own binder specialises the arguments."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec,
                                                              options)
    return target, ASTSource(kernel, signature, constexprs, attrs), options


def sm90_build(kernel, args, kwargs):
    """Compile one launch for sm_90 as Triton's launcher would and read the cubin: registers,
    stack (spills), shared memory, SASS counts and a hash of the SASS (did a change touch it?)."""
    import hashlib
    import re

    from mambalearn.compiled import opcode_counts, read_cubin

    target, src, options = _sm90_spec(kernel, args, kwargs)
    k = triton.compile(src, target=target, options=options.__dict__)
    usage, sass = read_cubin(k.asm["cubin"])
    res = dict(re.findall(r"\b(REG|STACK):(\d+)", usage))
    ops = opcode_counts(sass)
    code = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*;)", sass)  # instructions, no file names
    return dict(regs=int(res["REG"]), stack=int(res["STACK"]), smem=k.metadata.shared,
                warps=options.num_warps, sass=sum(ops.values()), mufu=ops.get("MUFU", 0),
                spill_ops=ops.get("LDL", 0) + ops.get("STL", 0),
                sass_hash=hashlib.sha1("\n".join(code).encode()).hexdigest()[:12])


def sm90_builds(shape=SHAPE, chunk=64, batch=1):
    """Every kernel variant a bf16 forward + backward of ours at ``shape`` (batch cut to
    ``batch``: the build does not depend on it) and the decode steps launch, built for sm_90:
    one row each (``sm90_build``). Needs TRITON_INTERPRET=0 (a CPU is enough)."""
    from mambalearn.mamba3 import mamba3_mimo_step, mamba3_siso_combined, mamba3_siso_step

    if _device.interpreted():
        raise RuntimeError("sm90_builds compiles for a GPU: start Python with TRITON_INTERPRET=0")
    kw = inputs(**dict(shape, b=batch), device="cpu", grad=True)
    dec = dict(DECODE, b=batch)

    def work():
        _fwd_bwd(mamba3_siso_combined, kw, chunk)()
        mamba3_siso_step(**decode_inputs(dec, device="cpu"))
        state = torch.zeros(batch, dec["h"], dec["p"], dec["n"])
        for r in (1, 4):
            mamba3_mimo_step(state, **decode_inputs(dec, rank=r, device="cpu"))

    rows, seen = [], set()
    for kernel, args, kwargs in _recorded_launches(work):
        flags = {k: v for k, v in kwargs.items() if k in ("GRAD", "REVERSE", "R")}
        key = (kernel.fn.__name__, tuple(flags.items()))
        if key not in seen:
            seen.add(key)
            rows.append(dict(kernel=kernel.fn.__name__, **flags,
                             **sm90_build(kernel, args, kwargs)))
    return rows


# chapter 15's kernel cell (its kw32), the benchmark's and the agreement's (l is not compiled in),
# one with GQA and n, p that are not powers of two, one of small n and the benchmark's p
MATRIX_SHAPES = dict(notebook=dict(b=2, l=13, h=2, g=2, n=4, p=3, na=2), benchmark=dict(AGREE, b=1),
                     odd=dict(b=1, l=70, h=6, g=2, n=40, p=20, na=10),
                     narrow=dict(b=1, l=40, h=2, g=1, n=16, p=64, na=4))
MATRIX_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MATRIX_CHUNKS = (16, 32, 64, 128)


def _matrix_case(size, dtype, chunk, extras):
    """A forward + backward of ours on CPU tensors: with D, Z, Input_States and the final
    states' gradients (``extras``) or none of them."""
    from mambalearn.mamba3 import mamba3_siso_combined

    kw = inputs(**size, dtype=dtype, device="cpu")
    if not extras:
        kw.update(D=None, Z=None)
    b, h, p, n, na = (size[k] for k in ("b", "h", "p", "n", "na"))
    st = [torch.rand(b, h, na), torch.randn(b, h, p, n), torch.randn(b, h, n),
          torch.randn(b, h, p)] if extras else None
    x = {k: None if v is None else v.requires_grad_() for k, v in kw.items()}
    outs = mamba3_siso_combined(**x, Input_States=st, chunk_size=chunk,
                                return_final_states=extras)
    sum(o.float().sum() for o in (outs if extras else (outs,))).backward()


def sm90_matrix(chunks=MATRIX_CHUNKS, dtypes=MATRIX_DTYPES, shapes=MATRIX_SHAPES, log=None):
    """Does every kernel build for sm_90? Each shape × dtype × chunk, forward + backward with and
    without D/Z/Input_States (``_matrix_case``), and the decode steps (bf16, the benchmark's):
    one row per distinct compilation (kernel, specialised signature, constexprs), with its case,
    ``ok`` and the build's numbers (``sm90_build``) or the error. Needs TRITON_INTERPRET=0."""
    from mambalearn.mamba3 import mamba3_mimo_step, mamba3_siso_step

    if _device.interpreted():
        raise RuntimeError("sm90_matrix compiles for a GPU: start Python with TRITON_INTERPRET=0")
    dec = dict(DECODE, b=1)

    def steps():
        mamba3_siso_step(**decode_inputs(dec, device="cpu"))
        for r in (1, 4):
            mamba3_mimo_step(torch.zeros(1, dec["h"], dec["p"], dec["n"]),
                             **decode_inputs(dec, rank=r, device="cpu"))

    cases = [("decode", "bf16", "-", "-", steps)]
    cases += [(name, str(dt).replace("torch.", ""), q, extras,
               lambda s=size, dt=dt, q=q, e=extras: _matrix_case(s, dt, q, e))
              for name, size in shapes.items() for dt in dtypes for q in chunks
              for extras in (True, False)]
    rows, seen = [], set()
    for name, dt, q, extras, work in cases:
        for kernel, args, kwargs in _recorded_launches(work):
            target, src, options = _sm90_spec(kernel, args, kwargs)
            key = (kernel.fn.__name__, repr(src.signature), repr(sorted(src.constants.items())),
                   repr(src.attrs), options.num_warps, options.num_stages)
            if key in seen:
                continue
            seen.add(key)
            row = dict(kernel=kernel.fn.__name__, shape=name, dtype=dt, chunk=q, extras=extras,
                       **{k: str(v) for k, v in kwargs.items() if k in ("GRAD", "REVERSE", "R")})
            try:
                row.update(ok=True, **sm90_build(kernel, args, kwargs))
            except Exception as e:  # noqa: BLE001  (the row says which build failed, and why)
                row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
            rows.append(row)
            if log:
                log(row)
    return rows


def run(gpu):
    """The bench topic: timings and decode rows (GPU), or one tiny interpreted call (CPU)."""
    from course.bench import Rows

    rows = Rows()
    if not gpu:
        from mambalearn.timing import time_ms
        from mambalearn.mamba3 import mamba3_siso_combined

        kw = inputs(1, 32, 2, 1, 16, 16, 4, dtype=torch.float32, device="cpu")
        rows.append(dict(topic="mamba3", backend="ours (interpreter)", shape="b1 l32 h2 p16 n16",
                         ms=time_ms(lambda: mamba3_siso_combined(**kw, chunk_size=16))))
        return rows
    for row in timings(theirs=load()) + decode(theirs_step=load("mamba3_siso_step",
                                                                 "mamba3_siso_step")):
        rows.append(row)
    return rows


if __name__ == "__main__":  # TRITON_INTERPRET=0 python -m course.bench.mamba3 --sm90 [--all]
    if "--sm90" in sys.argv:
        chunks = [int(a) for a in sys.argv[sys.argv.index("--sm90") + 1:] if a.isdigit()]
        show = lambda row: print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        if "--all" in sys.argv:
            rows = sm90_matrix(tuple(chunks) or MATRIX_CHUNKS, log=show)
            bad = [r for r in rows if not r["ok"]]
            print(f"{len(rows)} builds, {len(rows) - len(bad)} ok, {len(bad)} failed")
        else:
            for q in chunks or [64]:
                for row in sm90_builds(chunk=q):
                    show(dict(chunk=q, **row))
