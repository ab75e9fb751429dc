"""A chapter uses only what earlier chapters built (DESIGN §2), in the notebooks too.

The library's own imports are checked by the import-linter contracts in pyproject.toml
(`make test` runs `lint-imports`); notebooks are not Python modules, so this test reads their code
cells and maps every `mambalearn` module they import to the chapter that introduces it.
"""

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The chapter that introduces each course module (longest prefix wins). Utilities and tooling
# (device, testing, timing, utils, check, bench, classroom) may be used anywhere.
CHAPTER = {
    "mambalearn.discretize": 1,
    "mambalearn.scan.sequential": 2,
    "mambalearn.ops": 3,
    "mambalearn.scan.hillis_steele": 4,
    "mambalearn.scan.blelloch": 4,
    "mambalearn.scan.selective": 4,
    "mambalearn.roofline": 5,
    "mambalearn.machine": 5,
    "mambalearn.compiled": 5,
    "mambalearn.ncu": 5,
    "mambalearn.scan.chunked": 6,
    "mambalearn.autograd": 7,
    "mambalearn.triton.scan": 8,
    "mambalearn.triton.interpreter": 8,
    "mambalearn.triton.selective_scan": 9,
    "mambalearn.ssd": 10,
    "mambalearn.ssd_grad": 10,
    "mambalearn.ssd_packed": 10,
    "mambalearn.triton.ssd": 10,
    "mambalearn.inference": 12,
    "mambalearn.triton.step": 12,
    "mambalearn.model": 13,
    "mambalearn.parallel": 14,
    "mambalearn.mamba3": 15,
    "mambalearn.triton.mamba3": 15,
}
ANYWHERE = ("mambalearn.device", "mambalearn.testing", "mambalearn.timing", "mambalearn.utils",
            "mambalearn.check", "mambalearn.bench", "mambalearn.classroom",
            "mambalearn.scan.layout")
FACES = ("mambalearn", "mambalearn.scan", "mambalearn.triton")  # packages that only hand names on


def chapter_of(module):
    """The chapter of ``module``, 0 for a utility or a package's face, None if unknown."""
    if module in FACES or module.startswith(ANYWHERE):
        return 0
    best = max((k for k in CHAPTER if module == k or module.startswith(k + ".")), key=len,
               default=None)
    return CHAPTER.get(best)


def imported_modules(source):
    """Every mambalearn module a cell imports (``from mambalearn import ssd`` names ``.ssd``)."""
    source = re.sub(r"^\s*[%!].*$", "", source, flags=re.M)  # IPython magics and shell lines
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mambalearn")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mambalearn"):
            for a in node.names:  # a name may be a submodule or a function: keep the deepest
                sub = f"{node.module}.{a.name}"
                found.add(sub if chapter_of(sub) is not None else node.module)
    return found


NOTEBOOKS = sorted(p for d in ("notebooks", "solutions") for p in (ROOT / d).glob("[0-9]*.ipynb"))


def test_the_chapter_map_knows_every_course_module():
    # A new course module must be placed in a chapter here (and in pyproject's layers).
    for path in (ROOT / "mambalearn").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module.startswith(("mambalearn.__main__", "mambalearn.doctor")):
            continue
        assert chapter_of(module) is not None, f"{module}: add it to CHAPTER or ANYWHERE"


def test_every_module_stands_in_a_layer_of_the_contract():
    # import-linter only checks the modules its layers name: a new module outside them would
    # escape the rule, so each one must fall under a layer of pyproject.toml's contract.
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in config["contracts"] if c["type"] == "layers")
    named = {m.strip() for layer in layers for m in re.split(r"[|:]", layer)}
    for path in (ROOT / "mambalearn").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            continue  # a package's face: its names are checked where they are defined
        module = ".".join(parts)
        assert any(module == m or module.startswith(m + ".") for m in named), \
            f"{module} is in no layer of pyproject.toml's import-linter contract"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_notebook_imports_only_its_own_and_earlier_chapters(path):
    chapter = int(path.name[:2])
    cells = json.loads(path.read_text())["cells"]
    late = set()
    for cell in cells:
        if cell["cell_type"] == "code":
            late |= {m for m in imported_modules("".join(cell["source"]))
                     if (chapter_of(m) or 0) > chapter}
    assert not late, f"chapter {chapter:02d} imports later chapters' modules: {sorted(late)}"
