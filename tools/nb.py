"""Author notebooks as jupytext percent files; normalise their metadata; validate them.

    python tools/nb.py build SRC.py OUT.ipynb   # percent file -> notebook with our metadata
    python tools/nb.py to-py NB.ipynb SRC.py    # notebook -> percent file, to edit
    python tools/nb.py check NB.ipynb ...       # the rules of docs/AUTHORING.md

In a percent file a word after the cell marker names the slide type (`# %% [markdown] slide`,
`# %% fragment`, `# %% skip`, `# %% notes`, `# %% subslide`); tags go as jupytext writes them
(`tags=["check"]`). Cells tagged `solution` or `check` get nbgrader metadata.
"""

import json
import re
import sys

import jupytext
import nbformat

SLIDE_TYPES = ("slide", "subslide", "fragment", "skip", "notes", "-")
_MARKER = re.compile(r"^# %%(?P<md> \[markdown\])?(?P<rest>.*)$")


def _grade_id(cell):
    m = re.search(r"^def (\w+)|^class (\w+)", cell.source, re.M)
    if not m:
        raise ValueError(f"solution cell has no def/class:\n{cell.source[:200]}")
    return m.group(1) or m.group(2)


def normalise(nb):
    """Add nbgrader metadata from tags, default slide types, strip outputs."""
    for cell in nb.cells:
        meta = cell.metadata
        meta.setdefault("slideshow", {"slide_type": "-"})
        meta.pop("lines_to_next_cell", None)
        tags = meta.get("tags", [])
        if "solution" in tags:
            meta["nbgrader"] = {"grade": False, "grade_id": _grade_id(cell), "locked": False,
                                "schema_version": 3, "solution": True, "task": False}
        if "check" in tags:
            m = re.search(r"check\.(\w+)\(", cell.source)
            if not m:
                raise ValueError(f"check cell does not call check.<name>(...):\n{cell.source}")
            meta["nbgrader"] = {"grade": True, "grade_id": f"check_{m.group(1)}", "locked": True,
                                "points": 1, "schema_version": 3, "solution": False, "task": False}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                 "name": "python3"}
    return nb


def build(src, out):
    text = open(src).read()
    lines, slide_types = [], []
    for line in text.splitlines():
        m = _MARKER.match(line)
        if m:  # pull our slide-type word out of the marker; jupytext keeps the rest
            words = m.group("rest").split()
            kind = next((w for w in words if w in SLIDE_TYPES), "-")
            rest = " ".join(w for w in words if w not in SLIDE_TYPES)
            slide_types.append(kind)
            line = "# %%" + (m.group("md") or "") + (" " + rest if rest else "")
        lines.append(line)
    nb = jupytext.reads("\n".join(lines) + "\n", fmt="py:percent")
    if len(nb.cells) != len(slide_types):
        raise ValueError(f"{src}: every cell needs a '# %%' marker (got {len(nb.cells)} cells, "
                         f"{len(slide_types)} markers); no code before the first marker")
    for cell, kind in zip(nb.cells, slide_types, strict=True):
        cell.metadata["slideshow"] = {"slide_type": kind}
    nbformat.write(normalise(nb), out)
    problems = check(out)
    if problems:
        raise SystemExit("\n".join(problems))


def to_py(nb_path, out):
    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:  # put the slide type back into the marker line
        kind = cell.metadata.pop("slideshow", {}).get("slide_type", "-")
        cell.metadata.pop("nbgrader", None)
        cell.metadata["_slide"] = kind
    text = jupytext.writes(nb, fmt="py:percent")
    text = re.sub(r'^(# %%.*?) _slide="([^"]+)"', lambda m: f"{m.group(1)} {m.group(2)}"
                  if m.group(2) != "-" else m.group(1), text, flags=re.M)
    open(out, "w").write(text)


def check(path):
    with open(path, encoding="utf-8") as f:  # as stored: nbformat.read would fill in missing ids
        stored = json.load(f)
    problems = [f"{path} cell {i}: no cell id (nbformat 4.5 gives every cell one)"
                for i, cell in enumerate(stored["cells"]) if "id" not in cell]
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        kind = cell.metadata.get("slideshow", {}).get("slide_type")
        if kind not in SLIDE_TYPES:
            problems.append(f"{path} cell {i}: slideshow.slide_type missing or invalid ({kind!r})")
        if cell.cell_type == "code" and cell.outputs:
            problems.append(f"{path} cell {i}: has outputs (commit notebooks without outputs)")
        solution = cell.metadata.get("nbgrader", {}).get("solution")
        if cell.cell_type == "code" and "BEGIN SOLUTION" in cell.source and not solution:
            problems.append(f"{path} cell {i}: solution markers but no `solution` tag")
    return problems


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "build":
        build(*args)
    elif cmd == "to-py":
        to_py(*args)
    elif cmd == "check":
        found = [p for a in args for p in check(a)]
        print("\n".join(found) or "ok")
        sys.exit(bool(found))
    else:
        raise SystemExit(__doc__)
