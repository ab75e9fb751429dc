"""What a student of chapter N may use: the library exercise N is graded with.

The course modules stand in chapter order (`mambalearn.chapters`, the one chapter map;
pyproject.toml's import-linter layers are held to it by a test). While exercise N is graded its
kernel sees

* the utilities (``device``, ``testing``, ``timing``, ``utils``, ``scan.layout``) and the modules
  of chapters 1 … N − 1, as a student of chapter N has them;
* of chapter N's own modules, only those its notebook hands out (the modules the given cells
  import, with everything they import in turn): the rest is what the exercise asks for;
* nothing of later chapters, and none of the course's tooling (checks, grading, benchmarks);

and within that, each task's ``REBUILDS`` (the functions that compute its answer another way) are
switched off (``course.classroom.redact``). A module left out raises, on import, an error that
says why.
"""

import ast
import functools
import re
from pathlib import Path

from mambalearn import chapters

PACKAGE = Path(chapters.__file__).resolve().parent  # the mambalearn package

# The chapter that introduces each course module (the longest prefix wins), from the one map
CHAPTER = {m: c for m, c in chapters.CHAPTERS.items() if c > 0}
UTILITIES = tuple(m for m, c in chapters.CHAPTERS.items() if c == 0)
FACES = ("mambalearn", "mambalearn.scan", "mambalearn.triton")  # packages that only hand on names
TOOLING = chapters.TOOLING
BESIDE = ("course",)  # the tooling's own package, beside mambalearn: never graded code's
_CHAPTER_OF_EXERCISE = re.compile(r"^(\d\d)_")


def chapter_of(module):
    """The chapter of ``module``: 0 for a utility or a package's face, None for tooling."""
    if module in FACES or module.startswith(UTILITIES):
        return 0
    if module.startswith(TOOLING):
        return None
    best = max((k for k in CHAPTER if module == k or module.startswith(k + ".")), key=len,
               default=None)
    if best is None:
        raise ValueError(f"{module} is in no chapter: add it to mambalearn/chapters.py")
    return CHAPTER[best]


def exercise_chapter(exercise):
    """``"10_ssd"`` → 10."""
    m = _CHAPTER_OF_EXERCISE.match(exercise)
    if not m:
        raise ValueError(f"exercise {exercise!r}: expected a name NN_topic")
    return int(m.group(1))


def modules(package=PACKAGE):
    """{module name: its file} of every module of the package."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if "__pycache__" in parts or any(p.startswith(".") for p in parts):
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def lazy_exports(files):
    """{package: {name: its submodule}} of the packages whose ``__init__`` hands names on lazily
    (a ``_WHERE = {"spawn": "launch", …}`` table read by ``__getattr__``)."""
    out = {}
    for module, path in files.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_WHERE"
                                                    for t in node.targets):
                out[module] = {k: f"{module}.{v}" for k, v in ast.literal_eval(node.value).items()}
    return out


def imports(source, known, lazy=None):
    """The modules of ``known`` that ``source`` imports (anywhere in it, lazily too); a name taken
    from a package is the submodule if there is one (``from mambalearn import ssd``), or the one
    the package's lazy table (``lazy_exports``) hands it on from."""
    source = re.sub(r"^\s*[%!].*$", "", source, flags=re.M)  # IPython magics and shell lines
    lazy = lazy or {}
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {lazy.get(node.module, {}).get(a.name, f"{node.module}.{a.name}")
                      for a in node.names}
    with_parents = {".".join(m.split(".")[: i + 1]) for m in found for i in range(m.count(".") + 1)}
    return with_parents & set(known)


def given_imports(nb, known, lazy=None):
    """The modules the given cells of exercise notebook ``nb`` import: the code cells that are
    neither solutions nor checks, up to the last check (later ones are not run while grading)."""
    meta = lambda c: c.metadata.get("nbgrader", {})
    cells = [c for c in nb.cells if c.cell_type == "code"]
    last = max((i for i, c in enumerate(cells) if meta(c).get("grade")), default=-1)
    found = set()
    for c in cells[:last]:
        if not meta(c).get("solution") and not meta(c).get("grade"):
            found |= imports(c.source, known, lazy)
    return found


def library_of(exercise, nb, package=PACKAGE):
    """(modules kept, {module left out: why}) for grading ``exercise`` (its notebook ``nb``)."""
    n = exercise_chapter(exercise)
    files, lazy, edges, chapter = _graph(package)
    keep = set()
    todo = [m for m, c in chapter.items() if c is not None and c < n]
    todo += given_imports(nb, files, lazy)
    while todo:  # and everything those import, with the packages around them
        m = todo.pop()
        if m not in keep and chapter[m] is not None:  # tooling: the checks are a stub there
            keep.add(m)
            todo += edges.get(m, ()) | {".".join(m.split(".")[:i]) for i in range(1, m.count("."))}
    later = sorted(m for m in keep if chapter[m] is not None and chapter[m] > n)
    if later:
        raise ValueError(f"exercise {exercise}: chapter {n}'s library would import later "
                         f"chapters' modules {later} (the layers of pyproject.toml forbid it)")
    left_out = {m: why(m, chapter[m], n, exercise) for m in files if m not in keep}
    left_out.update({m: why(m, None, n, exercise) for m in BESIDE})  # never in the box either
    return keep, left_out


@functools.lru_cache(maxsize=4)
def _graph(package):
    """(files, lazy exports, {module: the modules it imports}, {module: chapter}) of a package."""
    files = modules(package)
    lazy = lazy_exports(files)
    edges = {m: imports(p.read_text(), files, lazy) for m, p in files.items()}
    return files, lazy, edges, {m: chapter_of(m) for m in files}


def why(module, chapter, n, exercise):
    """The message an import of a left-out ``module`` raises while ``exercise`` is graded."""
    if chapter is None:
        return (f"{module} is the course's tooling, not part of the library an exercise may use: "
                f"it is not there while exercise {exercise} is graded")
    if chapter > n:
        return (f"{module} belongs to chapter {chapter:02d}; exercise {exercise} is graded with "
                f"what chapters 01–{n:02d} built, so it is not there while grading")
    return (f"{module} is part of chapter {n:02d}'s own library, which exercise {exercise} asks "
            f"you to build: while grading only what the notebook hands out is there (the "
            f"modules its given cells import)")
