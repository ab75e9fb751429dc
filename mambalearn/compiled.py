"""What a Triton kernel becomes on a GPU you may not have: compile it for sm_90 anywhere (ch. 05).

Triton lowers a ``@triton.jit`` function through its IRs to PTX and then, with NVIDIA's ``ptxas``
(shipped inside the Triton wheel), to a cubin: the machine code an H200 runs. Compiling needs no
GPU, so on a laptop we can read what the profiler would report about a program's resources:

    registers per thread   REG of ``cuobjdump -res-usage``; decides occupancy (mambalearn.machine)
    spill bytes            STACK/LOCAL: values that did not fit in registers, kept in local memory
    shared memory          ``metadata.shared``: staging tiles of ``tl.dot``, pipelining buffers
    instructions           the SASS: MUFU (exp on the special-function unit), HGMMA (tensor
                           cores), LDG/STG (global loads/stores), SHFL (warp shuffles), BAR ...

The compiler runs in a fresh Python process with ``TRITON_INTERPRET=0``: on a CPU the course runs
kernels in Triton's interpreter, which swaps parts of ``triton.language`` while it runs and must
not meet the real code generator in the same process. A kernel defined in a module is imported
there by name; one defined in a notebook is rebuilt from its source (it may use ``triton`` and
``tl``, nothing else of the notebook).

    compile_for(kernel, signature, constexprs, num_warps, num_stages, arch)  -> Compiled
    compile_all(kernel, signature, configs, arch)     several configurations in one process
    opcode_counts(sass)    how often each instruction (first word of the opcode) occurs
"""

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Compiled:
    """The resources of one compiled program and its machine code."""

    registers: int
    spill_bytes: int
    shared_bytes: int
    num_warps: int
    sass: str = field(repr=False)
    ptx: str = field(repr=False)

    def opcodes(self):
        return opcode_counts(self.sass)



# The child process: rebuild the kernel, compile every configuration, read ptxas' resource usage.
_CHILD = r"""
import importlib, json, os, re, subprocess, sys, tempfile
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
job = json.load(sys.stdin)
if job["source"] is None:
    kernel = getattr(importlib.import_module(job["module"]), job["name"])
else:  # Triton reads a kernel's source from its file: write one, import it
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "notebook_kernel.py"), "w") as f:
        f.write("import triton\nimport triton.language as tl\n\n" + job["source"])
    sys.path.insert(0, folder)
    kernel = getattr(importlib.import_module("notebook_kernel"), job["name"])
exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
names = kernel.arg_names
if sorted(names) != sorted(job["signature"]):
    sys.exit(f"signature names {sorted(job['signature'])} != the kernel's arguments {names}")
signature = {n: job["signature"][n] for n in names}  # in argument order
attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
         if signature[n].startswith("*") or n in job["divisible"]}
out = []
for cfg in job["configs"]:
    constexprs = {k: tl.dtype(v["tl.dtype"]) if isinstance(v, dict) else v
                  for k, v in cfg["constexprs"].items()}  # a dtype travels as its name
    src = triton.compiler.ASTSource(fn=kernel, signature=signature,
                                    constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", job["arch"], 32),
                       options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"]); f.flush()
        usage = subprocess.run([exe, "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    res = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", usage))
    out.append(dict(registers=int(res["REG"]), spill_bytes=int(res["STACK"]) + int(res["LOCAL"]),
                    shared_bytes=int(k.metadata.shared), num_warps=cfg["num_warps"], sass=sass,
                    ptx=k.asm["ptx"]))
json.dump(out, sys.stdout)
"""


def _job(kernel, signature):
    fn = getattr(kernel, "fn", kernel)  # JITFunction or the interpreter's wrapper → Python fn
    if not inspect.isfunction(fn):
        raise TypeError(f"kernel must be a @triton.jit function, got {type(kernel).__name__}")
    if not isinstance(signature, dict) or not signature:
        raise TypeError("signature must be a dict {argument name: Triton type}")
    module = sys.modules.get(fn.__module__)  # a package's kernel is imported by name, any other
    in_module = "." in fn.__module__ and getattr(module, fn.__name__, None) is kernel  # rebuilt
    source = None if in_module else textwrap.dedent(inspect.getsource(fn))
    return {"module": fn.__module__, "name": fn.__name__, "source": source,
            "signature": signature}


def _plain(value):
    """A constexpr as JSON: a ``tl`` dtype (``tl.bfloat16``) as {"tl.dtype": "bf16"}."""
    name = getattr(value, "primitive_bitwidth", None) and str(value)
    return {"tl.dtype": name} if name else value


def compile_all(kernel, signature, configs, arch=90, divisible=()):
    """Compile ``kernel`` once per configuration for compute capability ``arch`` (90: H100/H200).

    ``signature`` maps each argument to its Triton type (``"*fp32"``, ``"i32"``, ...; every
    ``tl.constexpr`` to ``"constexpr"``). ``configs``: dicts with ``constexprs`` (their values:
    numbers, bools, None, ``tl`` dtypes), ``num_warps``, ``num_stages``. Pointers are assumed
    16-byte aligned, as Triton specializes them for tensors PyTorch allocates, and so are the
    integer arguments named in ``divisible``.
    Returns one :class:`Compiled` per configuration. No GPU is needed: ptxas runs on the CPU.
    """
    job = _job(kernel, signature)
    job.update(arch=arch, divisible=list(divisible), configs=[
        {"constexprs": {k: _plain(v) for k, v in c.get("constexprs", {}).items()},
         "num_warps": c.get("num_warps", 4),
         "num_stages": c.get("num_stages", 3)} for c in configs])
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    r = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(job), text=True,
                       capture_output=True, env=env)
    if r.returncode:
        raise RuntimeError(f"compiling {job['name']} for sm_{arch} failed:\n{r.stderr[-3000:]}")
    return [Compiled(**c) for c in json.loads(r.stdout)]


def compile_for(kernel, signature, constexprs=None, num_warps=4, num_stages=3, arch=90,
                divisible=()):
    """:func:`compile_all` with one configuration: registers and spill bytes per thread, shared
    memory per program and the SASS of ``kernel`` built for an sm_``arch`` GPU."""
    config = {"constexprs": constexprs or {}, "num_warps": num_warps, "num_stages": num_stages}
    return compile_all(kernel, signature, [config], arch, divisible)[0]


_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def read_cubin(cubin):
    """(resource usage, SASS listing) of a compiled kernel's cubin bytes, from the ``cuobjdump``
    Triton ships (for kernels built in this process, e.g. by the benchmarks' sm_90 builds)."""
    import tempfile

    import triton

    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return tuple(subprocess.run([exe, flag, f.name], capture_output=True, text=True,
                                    check=True).stdout for flag in ("-res-usage", "-sass"))


def opcode_counts(sass):
    """{opcode: count} over the SASS listing (``FFMA``, ``MUFU``, ``HGMMA``, ``LDG``, ``SHFL``...).

    The opcode is the first word of each instruction, before its modifiers (``MUFU.EX2`` counts
    as ``MUFU``), after an optional predicate (``@P0``).
    """
    return dict(Counter(_SASS_LINE.findall(sass)))
