"""The kernels' shared helpers are written once: ``LOG2E``, the ftz ``exp2``, the stable softplus
(``mambalearn.triton.common``) and the SM count (``mambalearn.device``). A second copy anywhere in
the package fails here, by name or by what it computes. Reads the source only (no import, no
kernel): a fraction of a second."""

import ast
import math
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mambalearn"
COMMON, DEVICE = "triton/common.py", "device.py"


def _sources():
    return {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def _jit(f):
    return any("jit" in ast.unparse(d) for d in f.decorator_list)


def _calls(node, names):
    """The calls in ``node`` to a function whose last dotted part is in ``names``."""
    return [c for c in ast.walk(node) if isinstance(c, ast.Call)
            and ast.unparse(c.func).split(".")[-1] in names]


def copies(path, source):
    """[(helper, line)] of what ``source`` (file ``path`` of the package) writes again."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, float) \
                and math.isclose(node.value, 1 / math.log(2), rel_tol=1e-6) and path != COMMON:
            found.append(("LOG2E", node.lineno))
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and path != COMMON:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id.upper().strip("_") == "LOG2E"
                   for t in targets):
                found.append(("LOG2E", node.lineno))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "ex2.approx" in node.value and path != COMMON:
            found.append(("exp2_ftz", node.lineno))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = node.name.strip("_")
            if name in ("softplus", "exp2_ftz", "ex2_ftz") and path != COMMON:
                found.append((name, node.lineno))
            if name == "sm_count" and path != DEVICE:
                found.append(("sm_count", node.lineno))
            # softplus by what it computes: log(… exp(…) …) inside a kernel function
            if _jit(node) and path != COMMON and any(
                    _calls(log, {"exp", "exp2", "exp2_ftz"})
                    for log in _calls(node, {"log", "log2", "log1p"})):
                found.append(("softplus", node.lineno))
        if isinstance(node, ast.Attribute) and node.attr == "multi_processor_count" \
                and path != DEVICE:
            found.append(("sm_count", node.lineno))
    return found


def test_no_shared_helper_is_written_twice():
    sources = _sources()
    assert COMMON in sources and DEVICE in sources
    again = [f"mambalearn/{path}:{line}: {helper}" for path, source in sources.items()
             for helper, line in copies(path, source)]
    assert not again, ("written again; import it from mambalearn.triton.common "
                       "(sm_count: mambalearn.device):\n" + "\n".join(again))
    # the one copy is where the others import it from
    common = dict((h, n) for h, n in copies("elsewhere.py", sources[COMMON]))
    assert {"LOG2E", "exp2_ftz", "softplus"} <= set(common), common


@pytest.mark.parametrize("helper, source", [
    ("LOG2E", "LOG2E = tl.constexpr(1.4426950408889634)"),
    ("LOG2E", "def f(x):\n    return x * 1.44269504\n"),
    ("exp2_ftz", 'y = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x])'),
    ("softplus", "@triton.jit\ndef k(x):\n    return tl.log(1.0 + tl.exp(x))\n"),
    ("softplus", "def _softplus(x):\n    return x\n"),
    ("sm_count", "n = torch.cuda.get_device_properties(0).multi_processor_count"),
    ("sm_count", "def sm_count(d):\n    return 132\n"),
])
def test_a_second_copy_is_found(helper, source):
    assert helper in [h for h, _ in copies("mamba9/kernel.py", source)]
