"""The launch rule of docs/ARCHITECTURE.md, over every kernel launch of the package: runtime
arguments (and sizes compiled in as lower-case ``tl.constexpr``, as the Mamba-3 kernels do) go
positionally in the kernel's parameter order; every UPPER-CASE ``tl.constexpr`` (tiles, flags) and
every launch option by keyword — never positionally, never a name the kernel does not have."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg"}


def kernels(tree):
    """{name: (parameter names, constexpr names, UPPER-CASE constexprs without a default)} of
    the @triton.jit functions of one module."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in
                                                     node.decorator_list):
            args = node.args.args
            defaults = len(args) - len(node.args.defaults)
            const = {a.arg for a in args if a.annotation is not None
                     and ast.unparse(a.annotation).endswith("constexpr")}
            required = {a.arg for i, a in enumerate(args)
                        if a.arg in const and a.arg.isupper() and i < defaults}
            out[node.name] = ([a.arg for a in args], const, required)
    return out


def problems(paths):
    """(launches checked, what breaks the rule) over the modules ``paths``."""
    trees = {p: ast.parse(p.read_text()) for p in paths}
    defs = {}
    for path, tree in trees.items():
        for name, sig in kernels(tree).items():
            defs.setdefault(name, {})[path] = sig
    checked, bad = 0, []
    for path, tree in trees.items():
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Subscript)
                    and isinstance(call.func.value, ast.Name) and call.func.value.id in defs):
                continue  # not a launch of one of our kernels
            name, where = call.func.value.id, f"{path.name}:{call.lineno}"
            params, const, required = defs[name].get(path) or next(iter(defs[name].values()))
            checked += 1
            given = {k.arg for k in call.keywords if k.arg is not None}
            splat = any(k.arg is None for k in call.keywords)  # **flags(...): not checkable
            if unknown := given - const - OPTIONS:
                bad.append(f"{where} {name}: by keyword but not a constexpr: {sorted(unknown)}")
            if not splat and (missing := required - given):
                bad.append(f"{where} {name}: constexprs not passed by keyword: {sorted(missing)}")
            if not any(isinstance(a, ast.Starred) for a in call.args):
                upper = [q for q in params[:len(call.args)] if q in const and q.isupper()]
                if upper or len(call.args) > len(params):
                    bad.append(f"{where} {name}: {len(call.args)} positional arguments reach "
                               f"{upper or 'past the parameters'}")
    return checked, bad


def test_every_launch_passes_constexprs_and_options_by_keyword():
    kernels = [p for d in ("triton", "mamba1", "mamba2", "mamba3")
               for p in (ROOT / "mambalearn" / d).rglob("*.py")]
    checked, bad = problems(sorted(kernels))
    assert checked >= 30, f"only {checked} launches found: the walk is broken"
    assert not bad, "\n".join(bad)


def test_the_rule_sees_a_bad_launch(tmp_path):
    module = tmp_path / "k.py"
    module.write_text(
        "import triton\nimport triton.language as tl\n\n@triton.jit\n"
        "def _k(x_ptr, n, h: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr = True):\n"
        "    pass\n\n"
        "_k[(1,)](x, n, 4, BLOCK=8, num_warps=4)\n"       # fine: h compiled in, positional
        "_k[(1,)](x, n, 4, 8)\n"                          # BLOCK positional
        "_k[(1,)](x, n, 4, BLOCK=8, WARPS=4)\n")           # WARPS: no such constexpr
    checked, bad = problems([module])
    assert checked == 3 and len(bad) == 3, bad  # BLOCK reached positionally, not by keyword; WARPS
