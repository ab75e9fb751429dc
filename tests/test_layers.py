"""A chapter uses only what earlier chapters built, in the library and in the notebooks.

The chapter map is written once, in ``mambalearn/chapters.py``. The
library's own imports are checked by the import-linter contracts in pyproject.toml (`make test`
runs `lint-imports`), whose layers must list the course modules in the map's order; the diagram
of docs/ARCHITECTURE.md must show the map; notebooks are not Python modules, so this test reads
their code cells and maps every `mambalearn` module they import to the chapter that introduces it.
"""

import ast
import json
import re
import textwrap
from pathlib import Path

import pytest

from mambalearn import chapters

tomllib = pytest.importorskip("tomllib")
ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]

# The chapter that introduces each course module (longest prefix wins). Utilities (chapter 0)
# and tooling may be used anywhere.
CHAPTER = {m: c for m, c in chapters.CHAPTERS.items() if c > 0}
# The tooling: the package's own (checks, the command line's face) and course/ beside it.
TOOLING = chapters.TOOLING + ("course",)
ANYWHERE = tuple(m for m, c in chapters.CHAPTERS.items() if c == 0) + TOOLING
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
    # A new course module must be placed in mambalearn/chapters.py (and in the layers).
    for path in (ROOT / "mambalearn").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        assert chapter_of(module) is not None, \
            f"{module}: add it to mambalearn/chapters.py (CHAPTERS or TOOLING)"


LAYERS = next(c["layers"] for c in PYPROJECT["importlinter"]["contracts"] if c["type"] == "layers")


def test_every_module_stands_in_a_layer_of_the_contract():
    # import-linter only checks the modules its layers name: a new module outside them would
    # escape the rule, so each one must fall under a layer of pyproject.toml's contract.
    named = {m.strip() for layer in LAYERS for m in re.split(r"[|:]", layer)}
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


def test_the_layers_follow_the_chapter_map():
    """import-linter's layers: tooling on top, then the course modules with their chapters never
    rising downwards, then the utilities; every module of the map stands in a layer."""
    order = [(chapter_of(m.strip()), m.strip()) for layer in LAYERS for m in layer.split("|")]
    assert all(c is not None for c, _ in order), [m for c, m in order if c is None]
    course = [(c, m) for c, m in order if c and not m.startswith(TOOLING)]
    assert [c for c, _ in course] == sorted((c for c, _ in course), reverse=True), course
    kinds = ["tooling" if m.startswith(TOOLING) else "course" if c else "utility"
             for c, m in order]
    assert kinds == sorted(kinds, key=["tooling", "course", "utility"].index), kinds
    named = {m for _, m in order}
    for module in chapters.CHAPTERS:
        assert any(n == module or n.startswith(module + ".") for n in named), \
            f"{module} is in the chapter map but in no import-linter layer"


def diagram_lines(width=88):
    """The course rows of docs/ARCHITECTURE.md's diagram, as the chapter map gives them."""
    by = {}
    for module, chapter in CHAPTER.items():
        by.setdefault(chapter, []).append(module.removeprefix("mambalearn."))
    rows = [f" │   {c:02d}  {', '.join(by[c])}" for c in sorted(by, reverse=True)]
    utilities = " · ".join(m.removeprefix("mambalearn.")
                           for m, c in chapters.CHAPTERS.items() if not c)
    rows += textwrap.wrap(f"utilities (any chapter): {utilities}", width - 4,
                          initial_indent=" │ ", subsequent_indent=" │   ")
    return [r.ljust(width) + "│" for r in rows]


def test_the_diagram_shows_the_chapter_map():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines()
    missing = [line for line in diagram_lines() if line not in text]
    assert not missing, "docs/ARCHITECTURE.md's diagram lacks (paste them):\n" + "\n".join(missing)
