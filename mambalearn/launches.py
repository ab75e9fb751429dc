"""What the interpreter ran, built for the GPU: every kernel launch recorded for an sm_90 build.

Triton's CPU interpreter runs a kernel's Python body with NumPy: it never builds the program, so
it accepts programs an H200's compiler refuses — a ``tl.dot`` whose K is below 16, tiles and
pipeline buffers past the 227 KB of shared memory one program may have, a grid past 65 535
programs on axis 1 or 2. Chapter 05's ``compiled`` builds a kernel for sm_90 on any machine; this
module applies it to everything the course launched:

    MAMBALEARN_RECORD_LAUNCHES=DIR  (environment)  every launch made under the interpreter in this
                                     process and its children (notebook kernels) is written to
                                     DIR/launches-<pid>.jsonl: the kernel, its signature as
                                     Triton specializes it, its constexprs, warps, stages, grid
    load(DIR)                        the distinct launches recorded there
    compiled.check_launches(DIR)     each one built for sm_90 (chapter 05's ``compiled``; ptxas from
                                     the Triton wheel, no GPU): a list of problems, empty if none
    python -m mambalearn.compiled DIR   the same from the command line (exit 1 on a problem)

A problem is a configuration that does not compile, that asks for more shared memory than a
program may have (``SHARED_LIMIT``), that spills registers although its kernel's docstring says
``no spills``, or whose grid exceeds the launch limits. A kernel that only ever runs in the
interpreter on purpose (a counterexample in a chapter) is marked with :func:`interpreter_only`.
The arguments each launch gives are read the way Triton's launcher reads them
(``native_specialize_impl``: the type of each argument, a pointer's 16-byte alignment, an integer
1 as a constant; a tuple argument element by element, each named ``name[i]``), so the build is
the one the GPU would make for the same call, with one simplification: integers are built as if
not divisible by 16 (the GPU would specialize a length that is: the same tiles and buffers, a
few instructions fewer). Random test shapes then give a handful of builds per kernel, not one
per length drawn.
"""

import hashlib
import inspect
import json
import os
import sys
import textwrap
from pathlib import Path

ENV = "MAMBALEARN_RECORD_LAUNCHES"
SHARED_LIMIT = 227 * 1024  # bytes of shared memory one program may use on sm_90 (H100, H200)
GRID_LIMITS = (2**31 - 1, 65535, 65535)  # programs per grid axis
OPTIONS = ("num_warps", "num_stages", "maxnreg", "num_ctas")
_seen = {}  # key → the largest grid written so far
# whose kernels are recorded: the package's, and a notebook's or a script's (``__main__``); a
# test's stand-ins for a student's mistakes are not the course's kernels
COURSE = ("mambalearn.", "__main__")


def interpreter_only(kernel, why):
    """Mark ``kernel`` as one that runs only in the interpreter on purpose (``why``: a sentence);
    its launches are not recorded. Returns the kernel."""
    if not why:
        raise ValueError("interpreter_only needs a reason (why)")
    kernel._interpreter_only = why
    return kernel


def plain(value):
    """A constexpr value as JSON (a ``tl`` dtype as {"tl.dtype": "bf16"}; the build check and
    ``compiled.compile_many`` send constexprs to the compiler's process so)."""
    value = getattr(value, "value", value) if type(value).__name__ == "constexpr" else value
    if getattr(value, "primitive_bitwidth", None):
        return {"tl.dtype": str(value)}
    if value is None or isinstance(value, (bool, int, float, str)) or (
            isinstance(value, dict) and set(value) == {"tl.dtype"}):  # plain already
        return value
    return repr(value)


_fingerprints = {}


def fingerprint(fn):
    """:func:`_fingerprint` of ``fn``, computed once per function."""
    if fn not in _fingerprints:
        _fingerprints[fn] = _fingerprint(fn)
    return _fingerprints[fn]


def _fingerprint(fn, seen=None):
    """sha256 over the source of ``fn`` and every Triton function and constant it names,
    recursively: the same key whenever the build would be the same."""
    seen = set() if seen is None else seen
    h = hashlib.sha256(inspect.getsource(fn).encode())
    for name in sorted(set(fn.__code__.co_names)):
        dep = fn.__globals__.get(name)
        inner = getattr(dep, "fn", None)
        if inspect.isfunction(inner) and inner not in seen:
            seen.add(inner)
            h.update(_fingerprint(inner, seen).encode())
        elif type(dep).__name__ == "constexpr":
            h.update(f"{name}={dep!r}".encode())
    return h.hexdigest()[:16]


def rebuilt_source(fn):
    """A notebook's or a script's kernel as source that builds on its own: the Triton functions and
    constants of the notebook it uses first (theirs before them), a module's imported by name."""
    lines, seen = [], set()

    def visit(f):
        for name in sorted(set(f.__code__.co_names)):
            dep = f.__globals__.get(name)
            inner = getattr(dep, "fn", None)
            if inspect.isfunction(inner) and inner not in seen:
                seen.add(inner)
                if inner.__module__ == fn.__module__:
                    visit(inner)
                    lines.append(textwrap.dedent(inspect.getsource(inner)))
                else:
                    lines.append(f"from {inner.__module__} import {inner.__name__} as {name}")
            elif type(dep).__name__ == "constexpr" and name not in seen:
                seen.add(name)
                lines.append(f"{name} = tl.constexpr({dep.value!r})")

    visit(fn)
    return "\n".join(lines + [textwrap.dedent(inspect.getsource(fn))])


def leaves(name, ty):
    """(path, type) of each value an argument of Triton type ``ty`` holds: the argument itself,
    or for a tuple (a tuple or list of types) each element as ``name[i]`` (``name[i][j]``
    nested). Signatures, constexprs and ``divisible`` name a tuple's elements by these paths."""
    return [(path, t) for path, t, _ in _leaves(name, ty, ty)]


def _leaves(name, ty, key):
    if isinstance(ty, (tuple, list)):
        return [leaf for i, (t, k) in enumerate(zip(ty, key, strict=True))
                for leaf in _leaves(f"{name}[{i}]", t, k)]
    return [(name, ty, key)]


def describe(kernel, args, kwargs, grid):
    """One launch as a JSON-able dict, or None for a kernel marked :func:`interpreter_only` or
    defined outside the course (not in ``COURSE``)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    fn = kernel.fn
    if getattr(kernel, "_interpreter_only", None) or not fn.__module__.startswith(COURSE):
        return None
    params = list(inspect.signature(fn).parameters.values())
    bound = inspect.signature(fn).bind_partial(
        *args, **{k: v for k, v in kwargs.items() if k not in OPTIONS})
    bound.apply_defaults()
    dns = set(kernel.kwargs.get("do_not_specialize") or ())
    signature, constexprs, divisible = {}, {}, []
    for i, p in enumerate(params):
        value = bound.arguments.get(p.name)
        if "constexpr" in str(p.annotation):
            signature[p.name] = "constexpr"
            constexprs[p.name] = plain(value)
            continue
        spec = not (p.name in dns or i in dns)  # (a tuple's elements specialize regardless)
        ty, key = native_specialize_impl(BaseBackend, value, False, spec, True)
        signature[p.name] = ty  # a tuple's: a tuple of its elements' types (JSON: a list)
        for path, t, k in _leaves(p.name, ty, key):
            if t == "constexpr":  # None, or an integer 1 that Triton folds into the build
                constexprs[path] = plain(k)
            elif k == "D" and not t.startswith(("i", "u")):  # a 16-byte aligned pointer
                divisible.append(path)
    meta = dict(bound.arguments)
    grid = grid(meta) if callable(grid) else grid
    grid = [int(g) for g in grid]
    options = {k: kwargs[k] for k in OPTIONS if kwargs.get(k) is not None}
    module = fn.__module__
    source = None
    if sys.modules.get(module) is None or "." not in module or \
            getattr(getattr(sys.modules[module], fn.__name__, None), "fn", None) is not fn:
        source = rebuilt_source(fn)  # a notebook's kernel: rebuilt from its source
    return {"module": module, "name": fn.__name__, "fingerprint": fingerprint(fn),
            "source": source, "no_spills": "no spills" in (fn.__doc__ or "").lower(),
            "signature": signature, "constexprs": constexprs,
            "divisible": sorted(divisible), "options": options, "grid": grid}


def key(launch):
    """What makes two launches the same build (the grid aside)."""
    return json.dumps({k: launch[k] for k in ("module", "name", "fingerprint", "signature",
                                                "constexprs", "divisible", "options")},
                      sort_keys=True)


def record(directory):
    """Record every interpreted launch of this process into ``directory`` (idempotent)."""
    from triton.runtime.interpreter import InterpretedFunction

    os.makedirs(directory, exist_ok=True)
    run = InterpretedFunction.run
    if getattr(run, "records_launches", False):
        return
    path = os.path.join(directory, f"launches-{os.getpid()}.jsonl")

    def recording_run(self, *args, grid, warmup, **kwargs):
        if not warmup:
            try:
                launch = describe(self, args, kwargs, grid)
            except Exception as e:  # never break a launch: record why it could not be read
                launch = {"module": self.fn.__module__, "name": self.fn.__name__,
                          "unreadable": repr(e)}
            if launch is not None:
                k = key(launch) if "unreadable" not in launch else repr(launch)
                size = [max(launch.get("grid") or [0])]
                if k not in _seen or size > _seen[k]:  # a new build, or a larger grid of one
                    _seen[k] = size
                    try:
                        with open(path, "a") as f:
                            f.write(json.dumps(launch) + "\n")
                    except OSError:  # a read-only place (a sandbox): the launch still runs
                        pass
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    recording_run.records_launches = True
    InterpretedFunction.run = recording_run


def record_from_env():
    """:func:`record` into ``$MAMBALEARN_RECORD_LAUNCHES`` when it is set and kernels run
    interpreted (called by ``mambalearn.triton`` on import)."""
    directory = os.environ.get(ENV)
    if directory:
        record(directory)


def load(directory):
    """The distinct launches recorded in ``directory``: {key: launch} (the largest grid kept)."""
    out = {}
    for path in sorted(Path(directory).glob("launches-*.jsonl")):
        for line in path.read_text().splitlines():
            launch = json.loads(line)
            k = key(launch) if "unreadable" not in launch else line
            old = out.get(k)
            if old is None or max(launch.get("grid") or [0]) > max(old.get("grid") or [0]):
                out[k] = launch
    return out
