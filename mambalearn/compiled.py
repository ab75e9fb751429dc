"""What a Triton kernel becomes on a GPU you may not have: compile it for sm_90 anywhere (ch. 05).

Triton lowers a ``@triton.jit`` function through its IRs to PTX and then, with NVIDIA's ``ptxas``
(shipped inside the Triton wheel), to a cubin: the machine code an H200 runs. Compiling needs no
GPU, so on a laptop we can read what the profiler would report about a program's resources:

    registers per thread   REG of ``cuobjdump -res-usage``; decides occupancy (mambalearn.machine)
    spill bytes            STACK/LOCAL: values that did not fit in registers, kept in local memory
    shared memory          ``metadata.shared``: staging tiles of ``tl.dot``, pipelining buffers
    instructions           the SASS: MUFU (exp on the special-function unit), HGMMA (tensor
                           cores), LDG/STG (global loads/stores), SHFL (warp shuffles), BAR ...

Triton's interpreter (``TRITON_INTERPRET=1``, on a CPU) replaces ``@triton.jit`` by an
interpreted function; :func:`compile_for` rebuilds the compilable function from its Python source.

    compile_for(kernel, signature, constexprs, num_warps, num_stages, arch)  -> Compiled
    opcode_counts(sass)    how often each instruction (first word of the opcode) occurs
"""

import os
import re
import subprocess
import tempfile
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


def _cuobjdump():
    import triton

    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(exe):
        raise RuntimeError(f"no cuobjdump at {exe}: this Triton wheel ships no NVIDIA tools")
    return exe


def compile_for(kernel, signature, constexprs=None, num_warps=4, num_stages=3, arch=90):
    """Compile ``kernel`` for an NVIDIA GPU of compute capability ``arch`` (90 = H100/H200).

    ``signature`` maps each run-time argument to its Triton type (``"*fp32"``, ``"i32"``, ...)
    and each ``tl.constexpr`` to ``"constexpr"``; ``constexprs`` gives their values. Returns
    :class:`Compiled` with the registers per thread, bytes spilled per thread (stack + local),
    shared memory per program and the SASS. No GPU is needed (ptxas runs on the CPU).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction

    fn = getattr(kernel, "fn", kernel)  # JITFunction or the interpreter's wrapper → Python fn
    if not callable(fn):
        raise TypeError(f"kernel must be a @triton.jit function, got {type(kernel).__name__}")
    if not isinstance(signature, dict):
        raise TypeError("signature must be a dict {argument name: Triton type}")
    src = triton.compiler.ASTSource(fn=JITFunction(fn), signature=signature,
                                    constexprs=dict(constexprs or {}))
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([_cuobjdump(), "-res-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    res = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", usage))
    return Compiled(registers=int(res["REG"]), spill_bytes=int(res["STACK"]) + int(res["LOCAL"]),
                    shared_bytes=int(k.metadata.shared), num_warps=num_warps, sass=sass,
                    ptx=k.asm["ptx"])


_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def opcode_counts(sass):
    """{opcode: count} over the SASS listing (``FFMA``, ``MUFU``, ``HGMMA``, ``LDG``, ``SHFL``...).

    The opcode is the first word of each instruction, before its modifiers (``MUFU.EX2`` counts
    as ``MUFU``), after an optional predicate (``@P0``).
    """
    return dict(Counter(_SASS_LINE.findall(sass)))
