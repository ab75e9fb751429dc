"""Every chapter runs from its first cell to its last without an error.

This is what ``pytest --nbval-lax notebooks/`` checks (no chapter cell compares its outputs), run
once per chapter: the run is the executed copy the decks, the widgets and the site are made from
(``course.classroom.execute.executed``, kept in ``build/executed/`` and shared with
tests/test_slides*.py and tests/test_site.py under a lock per chapter), so ``make test`` executes
each chapter once instead of twice. Students and the GPU runs use nbval itself
(``pytest --nbval-lax --nbval-current-env notebooks/``).
"""

from pathlib import Path

import pytest

from course.classroom import execute

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_every_chapter_is_found():
    assert len(CHAPTERS) >= 15, [p.name for p in CHAPTERS]


@pytest.mark.parametrize("notebook", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_runs_without_an_error(notebook):
    nb = execute.executed(notebook)  # raises NotebookError naming the cell's exception
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    not_run = [i for i, c in enumerate(code) if c.get("execution_count") is None]
    assert not not_run, f"{notebook.stem}: code cells {not_run} did not run"
    errors = [(i, o.get("ename")) for i, c in enumerate(code) for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"{notebook.stem}: cells that raised {errors}"
