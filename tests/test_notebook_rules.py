"""Every committed notebook: slideshow metadata on every cell, no outputs, tagged solutions."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for d in ("notebooks", "solutions", "exercises")
                   for p in (ROOT / d).glob("*.ipynb"))
pytest.importorskip("jupytext")  # tools/nb.py's converter; in the dev extra (a GPU box may lack it)
spec = importlib.util.spec_from_file_location("nbtool", ROOT / "tools" / "nb.py")
nbtool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nbtool)


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.name}/{p.name}" for p in NOTEBOOKS])
def test_notebook_follows_the_rules(path):
    assert nbtool.check(path) == []
