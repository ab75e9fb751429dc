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


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, headless, through Playwright (the dev extra), one per test module."""
    from playwright.sync_api import sync_playwright

    from mambalearn.classroom import slides_offline

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=slides_offline.chromium(),
                              args=slides_offline.CHROMIUM_ARGS)
        yield b
        b.close()
