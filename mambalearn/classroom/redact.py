"""The library a graded notebook sees: a copy of ``mambalearn`` with the exercise's answers cut out.

Each check module declares, for every exercise function it checks, the library functions that
exercise asks the student to write (``REBUILDS = {"zoh": ["mambalearn.discretize.zoh"]}``). While a
notebook is graded its kernel imports this copy instead of the library:

* every listed function (or class, or module-level name) is replaced, in its source, by a stub:
  calling it, or anything built on it, raises ``ExerciseBlocked`` "… write it yourself";
* importing it from student code (``from mambalearn.discretize import zoh``, ``getattr``,
  ``importlib``, a package's lazy re-export) raises the same error; the library's own modules
  still import each other as before, so everything else keeps working;
* a listed method (``mambalearn.model.Block.forward``) keeps its ``def`` line and raises;
* ``mambalearn.check`` is a stub (the checks run in the grader) and ``mambalearn.classroom`` is
  left out. The original source is not in the box: ``inspect.getsource``, reading the file or
  ``importlib.reload`` find the stub.

The copy is built once per exercise before any submission runs, compiled, and mounted read-only.
"""

import ast
import compileall
import os
import shutil
from pathlib import Path

from mambalearn import results

PACKAGE = Path(__file__).resolve().parents[1]  # the mambalearn package being graded with
LEFT_OUT = {"check", "classroom", "__pycache__", "build"}

GRADING = '''"""Generated for grading by mambalearn.classroom.redact: the answers, switched off."""
import os
import sys
import types

_LIB = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB_IMPORT = os.path.dirname(os.path.abspath(types.__file__)) + os.sep + "importlib" + os.sep


class ExerciseBlocked(ImportError):
    """Graded code reached a library function that the exercise asks the student to write."""


def _message(name, exercise):
    return (f"{name} is what exercise {exercise} asks you to write, so it is switched off while "
            f"grading: write it yourself (everything else in mambalearn works as usual)")


class Blocked:
    """Stands where the function was: calling it, or using it in any way, raises."""

    __slots__ = ("_ml_message",)

    def __init__(self, message):
        object.__setattr__(self, "_ml_message", message)

    def __call__(self, *args, **kwargs):
        raise ExerciseBlocked(self._ml_message)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise ExerciseBlocked(self._ml_message)

    def __getitem__(self, key):
        raise ExerciseBlocked(self._ml_message)

    def __repr__(self):
        return "<switched off while grading: " + self._ml_message.split(" is ")[0] + ">"


def blocked(name, exercise):
    return Blocked(_message(name, exercise))


def error(name, exercise):
    return ExerciseBlocked(_message(name, exercise))


def _from_library(frame):
    """Is the code asking for the attribute part of the library (skipping import machinery)?"""
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith("<frozen importlib") or path.startswith(_STDLIB_IMPORT):
            frame = frame.f_back
        elif path.startswith(_LIB) and frame.f_code.co_name == "__getattr__":
            frame = frame.f_back  # a package's lazy re-export: ask who wanted it
        else:
            return path.startswith(_LIB)
    return False


class _Guarded(types.ModuleType):
    def __getattribute__(self, name):
        value = super().__getattribute__(name)
        if type(value) is Blocked and not _from_library(sys._getframe(1)):
            raise ExerciseBlocked(object.__getattribute__(value, "_ml_message"))
        return value


def guard(module_name):
    """Run at the end of every module of the copy: block student access to its stubs."""
    module = sys.modules.get(module_name)
    if module is not None and any(type(v) is Blocked for v in vars(module).values()):
        module.__class__ = _Guarded
'''

CHECK_STUB = '''"""While grading, the checks run in the grader, outside this kernel."""

CHECKS = {checks!r}


def __getattr__(name):
    if name not in CHECKS:
        raise ImportError(f"mambalearn.check.{{name}} is not available while grading: the checks "
                          f"run in the grader, outside this kernel")

    def checked_by_the_grader(*args, **kwargs):
        print(f"(check.{{name}} is run by the grader, outside this kernel)")

    return checked_by_the_grader
'''
GUARD_LINE = ("\nfrom mambalearn._grading import guard as _ml_guard; _ml_guard(__name__)"
              "  # grading\n")


def locate(target, package=PACKAGE):
    """(module file, attribute path) of ``"mambalearn.mod.name"`` or ``"mambalearn.mod.Cls.meth"``.

    The name must be *defined* (def, class or assignment) at the top of that module, not imported:
    re-exports of it become stubs by themselves. Raises ValueError otherwise.
    """
    parts = target.split(".")
    if parts[0] != "mambalearn" or len(parts) < 3:
        raise ValueError(f"REBUILDS entry {target!r}: expected 'mambalearn.<module>.<name>'")
    for i in range(len(parts) - 1, 1, -1):
        base = package.joinpath(*parts[1:i])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file() and _defines(ast.parse(path.read_text()), parts[i:]):
                return path, parts[i:]
    raise ValueError(f"REBUILDS entry {target!r}: no module of mambalearn defines it (name the "
                     f"module where it is defined, not one that re-exports it)")


def _top_level(tree, name):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and node.name == name:
            return node
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node
    return None


def _defines(tree, attrs):
    node = _top_level(tree, attrs[0])
    if node is None or len(attrs) == 1:
        return node is not None
    return isinstance(node, ast.ClassDef) and len(attrs) == 2 and any(
        isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name == attrs[1]
        for m in node.body)


def _redact_source(text, names, exercise, module):
    """``text`` with each top-level name of ``names`` (or Class.method) replaced by a stub."""
    tree = ast.parse(text)
    lines = text.splitlines()
    edits = []  # (first line, last line, replacement lines), 1-based inclusive
    for attrs in names:
        node = _top_level(tree, attrs[0])
        full = f"{module}.{'.'.join(attrs)}"
        if len(attrs) == 1:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            stub = (f"from mambalearn._grading import blocked as _ml_blocked; "
                    f"{attrs[0]} = _ml_blocked({full!r}, {exercise!r})  # grading")
            edits.append((first, node.end_lineno, [stub]))
        else:
            meth = next(m for m in node.body if getattr(m, "name", None) == attrs[1])
            body = meth.body[0]
            indent = " " * body.col_offset
            stub = (f"{indent}from mambalearn._grading import error as _ml_error; "
                    f"raise _ml_error({full!r}, {exercise!r})  # grading")
            edits.append((body.lineno, meth.end_lineno, [stub]))
    for first, last, new in sorted(edits, reverse=True):
        keep = last - first + 1 - len(new)  # keep the line count: tracebacks point where they did
        lines[first - 1:last] = new + [""] * max(keep, 0)
    return "\n".join(lines) + "\n"


def build(dest, targets, exercise, package=PACKAGE):
    """Write the graded library for ``exercise`` to ``dest/mambalearn``; returns ``dest``.

    ``targets`` are REBUILDS entries (``"mambalearn.discretize.zoh"``).
    """
    dest = Path(dest)
    root = dest / "mambalearn"
    by_file = {}
    for target in targets:
        path, attrs = locate(target, package)
        by_file.setdefault(path, []).append(attrs)
    for src in sorted(package.rglob("*.py")):
        rel = src.relative_to(package)
        if LEFT_OUT & set(rel.parts[:-1]) or any(p.startswith(".") for p in rel.parts):
            continue
        out = root / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        text = src.read_text()
        if src in by_file:
            module = "mambalearn." + ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            text = _redact_source(text, by_file[src], exercise, module)
        out.write_text(text.rstrip("\n") + "\n" + GUARD_LINE)
    (root / "_grading.py").write_text(GRADING)
    (root / "check").mkdir(exist_ok=True)
    stub = CHECK_STUB.format(checks=sorted(_check_names(package)))
    (root / "check" / "__init__.py").write_text(stub)
    if results.STORE.is_dir():  # the measurements roofline & co. read, where the copy looks
        shutil.copytree(results.STORE, dest / "docs" / "results")
    compileall.compile_dir(str(root), quiet=2, workers=1)
    for d, _, files in os.walk(dest):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    return dest


def copy_or_build(cache, targets, exercise):
    """The graded library for ``exercise`` under ``cache`` (built on first use)."""
    dest = Path(cache) / f"lib-{exercise}"
    if not (dest / "mambalearn" / "_grading.py").exists():
        tmp = Path(cache) / f".lib-{exercise}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        build(tmp, targets, exercise)
        os.replace(tmp, dest)
    return dest


def _check_names(package):
    """Every name ``mambalearn.check`` exports (``__all__`` of each chNN module, tree_order)."""
    names = {"tree_order"}
    for path in (package / "check").glob("ch*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names.update(ast.literal_eval(node.value))
    return names


def rebuilds(package=PACKAGE):
    """{exercise function: [library targets]} from every check module's ``REBUILDS`` literal.

    Read from the source (no import), so the grader never imports a check to learn what to block.
    """
    table = {}
    for path in sorted((package / "check").glob("ch*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "REBUILDS" for t in node.targets):
                for task, targets in ast.literal_eval(node.value).items():
                    if task in table:
                        raise ValueError(f"{path.name}: REBUILDS[{task!r}] is declared twice")
                    table[task] = list(targets)
    return table
