import os

import pytest
import torch

os.environ.setdefault("MAMBALEARN_PROGRESS", "0")
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collection_modifyitems(config, items):
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
