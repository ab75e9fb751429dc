import os

import pytest
import torch

os.environ.setdefault("MAMBALEARN_PROGRESS", "0")
os.environ.setdefault("MPLBACKEND", "Agg")


# The files that take minutes on two cores, longest first: collected before the rest, so that
# pytest-xdist's --dist loadfile hands them out first and the short files fill in behind them
# (in alphabetical order they came last and one worker finished minutes after the other).
LONGEST = ("test_grading_holes.py", "test_gradebook.py", "test_grading.py", "test_slides_fit.py",
           "test_slides.py", "test_chapters_run.py", "test_grading_sandbox.py",
           "test_grading_exercises.py", "test_site.py", "test_grading_selfcheck.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST)))  # stable: files stay whole
    if torch.cuda.is_available():  # the CPU smoke runs of device scripts: the scripts run here
        skip = pytest.mark.skip(reason="the CPU path (interpreter, CPU tensors): a GPU is here")
        for item in items:
            if "cpu" in item.keywords:
                item.add_marker(skip)
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def require_chromium():
    """Skip a browser test where Debian's chromium is missing (`make browser` installs it), except
    in CI, where a missing browser must fail rather than pass silently."""
    from course.classroom import slides_offline

    try:
        return slides_offline.chromium()
    except RuntimeError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(e), allow_module_level=True)


@pytest.fixture
def one_thread():
    """torch on one thread for the test (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    on two small CPU cores, threads only fight over them for tensors this small."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, headless, through Playwright (the dev extra), one per test module."""
    from playwright.sync_api import sync_playwright

    from course.classroom import slides_offline

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=slides_offline.chromium(),
                              args=slides_offline.CHROMIUM_ARGS)
        yield b
        b.close()
