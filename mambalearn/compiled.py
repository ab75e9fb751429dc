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
    compile_many(module, name, source, configs)       each with its own signature; errors collected
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from mambalearn import launches


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
def path(key):  # "x" → (index of x,), a tuple's element "x[2]" → (index of x, 2)
    m = re.fullmatch(r"(\w+)((?:\[\d+\])*)", key)
    if m is None or m[1] not in names:
        sys.exit(f"{key!r} names none of the kernel's arguments {names}")
    return (names.index(m[1]),) + tuple(int(i) for i in re.findall(r"\d+", m[2]))
def tup(ty):  # a tuple argument's types travel as a JSON list
    return tuple(map(tup, ty)) if isinstance(ty, list) else ty
out = []
for cfg in job["configs"]:
    sig = cfg["signature"]
    if sorted(names) != sorted(sig):
        sys.exit(f"signature names {sorted(sig)} != the kernel's arguments {names}")
    signature = {n: tup(sig[n]) for n in names}  # in argument order
    attrs = {path(n): [["tt.divisibility", 16]] for n in cfg["divisible"]}
    constexprs = {path(k): tl.dtype(v["tl.dtype"]) if isinstance(v, dict) else v
                  for k, v in cfg["constexprs"].items()}  # a dtype travels as its name
    try:
        src = triton.compiler.ASTSource(fn=kernel, signature=signature,
                                        constexprs=constexprs, attrs=attrs)
        k = triton.compile(src, target=GPUTarget("cuda", job["arch"], 32),
                           options=cfg["options"])
    except Exception as e:  # a program this GPU's compiler refuses
        if not job["collect"]:
            raise
        out.append(f"{type(e).__name__}: {str(e)[-1500:]}")
        continue
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"]); f.flush()
        usage = subprocess.run([exe, "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout if job["sass"] else ""
    res = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", usage))
    out.append(dict(registers=int(res["REG"]), spill_bytes=int(res["STACK"]) + int(res["LOCAL"]),
                    shared_bytes=int(k.metadata.shared), num_warps=k.metadata.num_warps, sass=sass,
                    ptx=k.asm["ptx"] if job["sass"] else ""))
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


def compile_all(kernel, signature, configs, arch=90, divisible=()):
    """Compile ``kernel`` once per configuration for compute capability ``arch`` (90: H100/H200).

    ``signature`` maps each argument to its Triton type (``"*fp32"``, ``"i32"``, ...; every
    ``tl.constexpr`` to ``"constexpr"``; a tuple argument to a tuple of its elements' types).
    ``configs``: dicts with ``constexprs`` (their values: numbers, bools, None, ``tl`` dtypes),
    ``num_warps``, ``num_stages``. Pointers are assumed 16-byte aligned, as Triton specializes
    them for tensors PyTorch allocates, and so are the integer arguments named in ``divisible``.
    A tuple's element is named by its path, ``"x_strides[1]"``: in ``divisible``, and in
    ``constexprs`` where its type is ``"constexpr"`` (an integer 1, as Triton folds it).
    Returns one :class:`Compiled` per configuration. No GPU is needed: ptxas runs on the CPU.
    """
    job = _job(kernel, signature)
    div = [path for n, ty in signature.items() for path, t in launches.leaves(n, ty)
           if t.startswith("*")] + list(divisible)
    configs = [{"constexprs": c.get("constexprs", {}), "signature": signature, "divisible": div,
                "num_warps": c.get("num_warps", 4), "num_stages": c.get("num_stages", 3)}
               for c in configs]
    return compile_many(job["module"], job["name"], job["source"], configs, arch, collect=False)


def compile_many(module, name, source, configs, arch=90, collect=True, sass=True):
    """The builds of one kernel (``module.name``, or rebuilt from ``source``), each config with its
    own ``signature``, ``divisible`` arguments, ``constexprs`` and compile options (``num_warps``,
    ``num_stages``, ``maxnreg``, ...). One :class:`Compiled` per config, or with ``collect`` the
    compiler's error message (a string) where a config does not build."""
    job = {"module": module, "name": name, "source": source, "arch": arch, "collect": collect,
           "sass": sass, "configs": [
               {"constexprs": {k: launches.plain(v) for k, v in c.get("constexprs", {}).items()},
                "signature": c["signature"], "divisible": list(c.get("divisible", ())),
                "options": {k: v for k, v in c.items()
                            if k not in ("constexprs", "signature", "divisible")}}
               for c in configs]}
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    env.pop("MAMBALEARN_RECORD_LAUNCHES", None)
    r = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(job), text=True,
                       capture_output=True, env=env)
    if r.returncode:
        raise RuntimeError(f"compiling {name} for sm_{arch} failed:\n{r.stderr[-3000:]}")
    return [c if isinstance(c, str) else Compiled(**c) for c in json.loads(r.stdout)]


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


def _build_group(group):
    """One kernel's configurations built for sm_90 in one child process: for each, its resources
    {"shared", "spills", "registers"} or {"error": the compiler's message}."""
    first = group[0]
    configs = [{"constexprs": la["constexprs"], "signature": la["signature"],
                "divisible": la["divisible"], **la["options"]} for la in group]
    try:
        built = compile_many(first["module"], first["name"], first["source"], configs,
                             sass=False)
    except RuntimeError as e:
        return [{"error": f"the compiler could not run: {e}"}] * len(group)
    return [{"error": res} if isinstance(res, str) else
            {"shared": res.shared_bytes, "spills": res.spill_bytes, "registers": res.registers}
            for res in built]


def _problem(launch, build):
    """What is wrong with one build (None: nothing)."""
    what = f"{launch['module']}.{launch['name']} {_short(launch)}"
    if "error" in build:
        return f"{what}: does not compile for sm_90: {build['error']}"
    if build["shared"] > launches.SHARED_LIMIT:
        return (f"{what}: {build['shared']} B of shared memory, more than the "
                f"{launches.SHARED_LIMIT} B a program may have on sm_90")
    if launch.get("no_spills") and build["spills"]:  # its docstring says "no spills"
        return f"{what}: spills {build['spills']} B although its docstring says no spills"
    return None


def _short(launch):
    cx = {k: v for k, v in launch["constexprs"].items() if v is not None}
    return f"(constexprs {cx}, options {launch['options']})"


def build_key(launch, arch=90):
    """What decides a build: the launch's `launches.key` (kernel source and the Triton functions
    it calls, signature, constexprs, options), the Triton version (its ptxas) and the target."""
    import hashlib

    import triton

    text = f"{launches.key(launch)}|triton {triton.__version__}|sm_{arch}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def check_launches(directory, jobs=2, cache=None, per_process=16):
    """Every distinct recorded configuration built for sm_90: (problems, builds, compiled now).

    ``problems``: a message per configuration that does not compile, needs more shared memory
    than a program may have, spills where its docstring says "no spills", or exceeds a grid
    limit; a directory with no recorded launch is itself a problem. ``cache``: {build_key:
    build} of earlier builds (the same key is the same build); only the rest are compiled, in
    ``jobs`` child processes of at most ``per_process`` builds each. ``builds`` holds them all.
    """
    found = launches.load(directory)
    if not found:
        return [f"no launch was recorded in {directory}: was ${launches.ENV} set while the "
                "kernels ran?"], {}, 0
    problems, todo, builds = [], {}, {}
    for la in found.values():
        if "unreadable" in la:
            problems.append(f"{la['module']}.{la['name']}: launch not readable: {la['unreadable']}")
            continue
        grid = la["grid"] + [1] * (3 - len(la["grid"]))
        for axis, (g, limit) in enumerate(zip(grid, launches.GRID_LIMITS, strict=True)):
            if g > limit:
                problems.append(f"{la['module']}.{la['name']}: grid axis {axis} has {g} programs, "
                                f"past the limit {limit}")
        k = build_key(la)
        if cache and k in cache:
            builds[k] = cache[k]
        else:
            todo.setdefault((la["module"], la["name"], la["fingerprint"]), []).append((k, la))
    pieces = [group[i:i + per_process] for group in todo.values()
              for i in range(0, len(group), per_process)]
    with ThreadPoolExecutor(max(1, jobs)) as pool:  # each piece compiles in its own process
        for piece, built in zip(pieces, pool.map(lambda p: _build_group([la for _, la in p]),
                                                 pieces), strict=True):
            builds.update({k: b for (k, _), b in zip(piece, built, strict=True)})
    for la in found.values():
        if "unreadable" not in la:
            bad = _problem(la, builds[build_key(la)])
            if bad:
                problems.append(bad)
    return problems, builds, sum(len(p) for p in pieces)


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mambalearn.compiled",
                                 description="build every recorded launch for sm_90")
    ap.add_argument("directory", help=f"where ${launches.ENV} wrote the launches")
    ap.add_argument("--jobs", type=int, default=2, help="compiler processes at once")
    ap.add_argument("--cache", help="a JSON file of earlier builds (read, then written back)")
    a = ap.parse_args(argv)
    cache = {}
    if a.cache and os.path.exists(a.cache):
        with open(a.cache) as f:
            cache = json.load(f)
    problems, builds, fresh = check_launches(a.directory, a.jobs, cache)
    if a.cache:
        with open(a.cache, "w") as f:  # this run's builds only: what no launch uses goes
            json.dump(dict(sorted(builds.items())), f, indent=0, sort_keys=True)
            f.write("\n")
    for p in problems:
        print("FAIL", p)
    print(f"{len(builds)} distinct launch configurations built for sm_90 ({fresh} compiled now, "
          f"{len(builds) - fresh} from earlier builds of the same source): {len(problems)} "
          f"problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
