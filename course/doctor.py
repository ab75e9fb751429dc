"""`python -m mambalearn doctor`: is this machine ready for the course? One verdict per line.

Checks versions, the device mode (GPU, or Triton's CPU interpreter), the platform (Triton wheels
are Linux-only), and runs a tiny Triton scan forward and in reverse against a Python loop.
"""

import platform
import sys


def _line(ok, what, fix="", warn=False):
    mark = "ok " if ok else ("warn" if warn else "FAIL")
    print(f"[{mark}] {what}" + ("" if ok or not fix else f"\n       fix: {fix}"))
    return ok or warn


def tested_range(name):
    """The version specifier of ``name`` that mambalearn's metadata declares (pyproject.toml's
    tested range), or None where the package metadata is not installed."""
    from importlib import metadata

    try:
        from packaging.requirements import Requirement
    except ImportError:
        return None
    try:
        requires = metadata.requires("mambalearn") or []
    except metadata.PackageNotFoundError:
        return None
    for text in requires:
        req = Requirement(text)
        if req.name == name:
            return req.specifier
    return None


def _version_line(name, version):
    """ok when ``version`` lies in the tested range, else a warning naming the range."""
    spec = tested_range(name)
    if spec is None or spec.contains(version.split("+")[0], prereleases=True):
        return _line(True, f"{name} {version}" + (f" (tested: {spec})" if spec else ""))
    return _line(False, f"{name} {version} is outside the tested range {spec}",
                 f"expect surprises, or install a tested version (README, Tested combinations): "
                 f"pip install '{name}{spec}'", warn=True)


def _loop_scan(a, b, reverse):
    import torch

    h, out = torch.zeros_like(b[..., 0]), torch.empty_like(b)
    for t in (reversed(range(b.shape[-1])) if reverse else range(b.shape[-1])):
        h = a[..., t] * h + b[..., t]
        out[..., t] = h
    return out


def tools():
    """The programs outside Python the course's tools use: warnings, never failures (the chapters
    run without them)."""
    import os
    import shutil

    chromium = os.environ.get("MAMBALEARN_CHROMIUM", "/usr/bin/chromium")
    found = {"bubblewrap (bwrap)": shutil.which("bwrap"),
             "Chromium": chromium if os.access(chromium, os.X_OK) else shutil.which("chromium"),
             "npm": shutil.which("npm")}
    used = {"bubblewrap (bwrap)": "make grade boxes each graded notebook (no network, nothing "
                                  "of yours readable); without it grading runs unboxed",
            "Chromium": "the slide and site PDFs and the browser tests",
            "npm": "fetching reveal.js and MathJax once, for offline slides and the site"}
    for name, path in found.items():
        _line(bool(path), f"{name}: {path}" if path else f"{name} not found ({used[name]})",
              "make browser (Debian's packages: apt-get install bubblewrap chromium npm)",
              warn=True)
    return found


def main():
    ok = _line(sys.version_info >= (3, 10), f"Python {platform.python_version()}",
               "install Python 3.10 or newer")
    try:
        import numpy
        import torch
    except ImportError as e:
        return not _line(False, f"import torch/numpy: {e}", "run `make lab` (it installs them)")
    ok &= _version_line("torch", torch.__version__)
    ok &= _line(True, f"numpy {numpy.__version__}")
    linux = sys.platform.startswith("linux")
    ok &= _line(linux, f"platform {sys.platform}",
                "Triton is Linux-only: use WSL2 on Windows or a Linux machine "
                "(chapters 01-07 run anywhere)")
    try:
        import triton
    except ImportError:
        return not _line(False, "import triton", "pip install triton (Linux), or `make lab`")
    from mambalearn import device

    ok &= _version_line("triton", triton.__version__)
    _line(True, device.describe())
    if not device.HAS_GPU and not device.interpreted():
        ok &= _line(False, "no GPU and TRITON_INTERPRET is not 1",
                    "unset TRITON_INTERPRET (mambalearn sets it to 1 when there is no GPU)")
    try:
        from mambalearn.testing import assert_close
        from mambalearn.triton.scan import scan
    except ImportError as e:
        return not _line(False, f"import mambalearn.triton.scan: {e}", "reinstall: `make lab`")
    dev = device.get()
    a = torch.rand(3, 37, device=dev) * 0.5 + 0.5
    b = torch.randn(3, 37, device=dev)
    for reverse in (False, True):
        try:
            assert_close(scan(a, b, reverse=reverse), _loop_scan(a, b, reverse))
            ok &= _line(True, f"Triton scan (reverse={reverse}) matches a Python loop")
        except Exception as e:  # noqa: BLE001 - any failure here is the verdict
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            ok &= _line(False, f"Triton scan (reverse={reverse}): {first}",
                        "check that triton matches torch (`pip list`), then report the output")
    tools()
    print("all good" if ok else "some checks failed: see the fixes above")
    return ok
