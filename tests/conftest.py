import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("MAMBALEARN_PROGRESS", "0")
os.environ.setdefault("MPLBACKEND", "Agg")


# `make test` runs pytest with `--dist loadgroup`: a group's tests run on one worker, in order.
# A file is one group (its module fixtures and, for a notebook, its cells' one kernel must not be
# split), except that the per-chapter tests below get a group per chapter, so that the chapters
# spread over the workers (and the tests of one chapter share its executed copy, one at a time).
BY_CHAPTER = {"test_slides.py": ("path",), "test_slides_fit.py": ("notebook",),
              "test_grading.py": ("solution", "exercise")}
# Groups started first (the longest: a long group started last would run alone at the end).
FIRST = ("test_gradebook.py", "test_grading_holes.py", "test_grading_sandbox.py",
         "test_grading_exercises.py")


def _group(item):
    """(order, name) of ``item``'s xdist group."""
    name, params = item.path.name, getattr(getattr(item, "callspec", None), "params", {})
    for param in BY_CHAPTER.get(name, ()):
        if param in params:
            return 1, f"chapter {Path(params[param]).stem}"
    return (0 if name in FIRST else 1), str(item.path)


def pytest_collection_modifyitems(config, items):
    groups = {id(item): _group(item) for item in items}
    items.sort(key=lambda item: groups[id(item)][0])  # stable: file order kept within each rank
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[id(item)][1]))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def require_chromium():
    """Skip a browser test where Debian's chromium is missing (`make browser` installs it), except
    in CI, where a missing browser must fail rather than pass silently."""
    from mambalearn.classroom import slides_offline

    try:
        return slides_offline.chromium()
    except RuntimeError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(e), allow_module_level=True)
