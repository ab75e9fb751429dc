"""Each chapter's last cell: which exercise goes with it and how to grade it (made here, not typed).

    python tools/exercise_cells.py           # write or update it in every notebooks/NN_*.ipynb
    python tools/exercise_cells.py --check   # exit 1, naming each chapter where it is stale

The cell is a markdown slide tagged ``exercise-link``; its text comes from ``CELL`` and from the
exercise itself: the functions its solution cells define (their nbgrader ``grade_id``) and its
file name (``exercises/exNN_name.ipynb``: ``pristine.exercise_file``). A chapter without an
exercise gets no cell. Notebooks are written as nbformat writes them (indent 1, keys sorted,
UTF-8, a trailing newline), only where the cell changes.
"""

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course.classroom.pristine import exercise_file  # noqa: E402

TAG = "exercise-link"
CELL = """## ✎ Your exercise: `exercises/{name}`

[Open `exercises/{name}`](../exercises/{name}) beside this chapter and write {tasks} in the cells
that raise `NotImplementedError`; {tests}. Then grade the
whole notebook (any copy of it, under any name):

```bash
make grade NB=exercises/{name}
```"""
TESTS = "its check cells test them on fresh random inputs"
# where a check does something else with the student's functions, what it does
TESTS_OF = {"16_claims": "its check cell runs them on your settings, on settings it draws at "
                         "random between yours and on each setting changed one key at a time"}


def tasks(solution):
    """The functions or classes a student writes: the grade_ids of the solution cells."""
    nb = json.loads(Path(solution).read_text())
    return [c["metadata"]["nbgrader"]["grade_id"] for c in nb["cells"]
            if c["metadata"].get("nbgrader", {}).get("solution")]


def words(names):
    """``a``, ``a` and `b``, ``a`, `b` and `c``."""
    names = [f"`{n}`" for n in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def cell_for(chapter):
    """The markdown cell for ``chapter`` (a notebooks/ path), or None without an exercise."""
    name = exercise_file(chapter.stem)
    exercise, solution = ROOT / "exercises" / name, ROOT / "solutions" / chapter.name
    if not exercise.exists() or not solution.exists():
        return None
    text = CELL.format(name=name, tasks=words(tasks(solution)),
                       tests=TESTS_OF.get(chapter.stem, TESTS))
    return {"cell_type": "markdown", "id": hashlib.sha256(f"{TAG}{chapter.stem}".encode())
            .hexdigest()[:8], "metadata": {"slideshow": {"slide_type": "slide"}, "tags": [TAG]},
            "source": text.splitlines(keepends=True)}


def updated(chapter):
    """The notebook's JSON with its exercise cell last and current; None when nothing changes."""
    raw = chapter.read_text()
    nb = json.loads(raw)
    want = cell_for(chapter)
    cells = [c for c in nb["cells"] if TAG not in c["metadata"].get("tags", [])]
    nb["cells"] = cells + ([want] if want else [])
    out = json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    return None if out == raw else out


def main(argv):
    chapters = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    stale = [c for c in chapters if updated(c) is not None]
    if "--check" in argv:
        for c in stale:
            print(f"{c.relative_to(ROOT)}: its exercise cell is missing or stale "
                  "(python tools/exercise_cells.py)")
        return 1 if stale else 0
    for c in stale:
        c.write_text(updated(c))
        print(c.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
