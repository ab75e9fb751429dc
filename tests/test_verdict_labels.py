"""How grading names a cell: as a student finds it in JupyterLab, not by nbval's index from 0.

JupyterLab shows ``[n]``, the execution count, which changes with every run; so a report names a
cell by what it is and by its position among the code cells of the exercise as shipped, counted
from the top from 1. Fast: no kernel, only the shipped exercise files.
"""

import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course.classroom import pristine as P
from course.classroom import verdict

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = sorted((ROOT / "exercises").glob("ex*.ipynb"))


@pytest.mark.parametrize("path", EXERCISES, ids=[p.stem for p in EXERCISES])
def test_a_label_names_the_cell_a_student_finds_by_counting_and_by_name(path):
    nb = nbformat.read(path, as_version=4)
    raw = json.loads(path.read_text())["cells"]  # the file as stored: count its code cells
    code_at = [i for i, c in enumerate(raw) if c["cell_type"] == "code"]
    for index, cell in enumerate(P.code_cells(nb)):
        text = verdict.label(nb, index)
        n = int(text.split("code cell ")[1].split()[0])
        assert n == index + 1 and "".join(raw[code_at[n - 1]]["source"]) == cell.source
        assert f"Cell {index}" not in text and "[" not in text.split("(")[0]
        if P.meta(cell).get("solution"):
            assert f"your `{P.meta(cell)['grade_id']}` cell" in text
        elif P.meta(cell).get("grade"):
            assert f"`{cell.source.strip()}`" in text  # the check as written in the cell
        else:
            assert verdict.first_line(cell.source) in text


def test_a_plain_cell_is_named_by_its_first_line_and_its_heading():
    nb = new_notebook(cells=[new_markdown_cell("# Ex\n\n## Zero-order hold\n\ntext"),
                             new_code_cell("# set up\n\nx = torch.randn(4)  # four values\n"),
                             new_markdown_cell("Prose, no heading."),
                             new_code_cell("y = x * 2 + " + "x * 3 + " * 10 + "1")])
    assert verdict.label(nb, 0) == ("code cell 1 from the top (`x = torch.randn(4)  # four "
                                    "values`, under “Zero-order hold”)")
    second = verdict.label(nb, 1)
    assert second.startswith("code cell 2 from the top (`y = x * 2") and "…`" in second
    assert len(verdict.first_line(nb.cells[3].source)) == 40
