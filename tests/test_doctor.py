"""The doctor reads the tested version ranges from the package metadata and warns outside them."""

import importlib.metadata

import pytest

from course import doctor

try:  # the ranges are the installed package's (pip install -e .); a bare checkout has none
    importlib.metadata.distribution("mambalearn")
    INSTALLED = True
except importlib.metadata.PackageNotFoundError:
    INSTALLED = False
needs_metadata = pytest.mark.skipif(not INSTALLED, reason="mambalearn is not installed (a bare "
                                    "checkout on the path: no package metadata to read)")


@needs_metadata
def test_tested_ranges_come_from_the_package_metadata():
    torch_range, triton_range = doctor.tested_range("torch"), doctor.tested_range("triton")
    assert torch_range is not None and triton_range is not None, "pyproject declares both ranges"
    assert torch_range.contains("2.11.0") and not torch_range.contains("2.10.0")
    assert triton_range.contains("3.6.0") and triton_range.contains("3.9.0")
    assert not triton_range.contains("3.5.1")


@needs_metadata
def test_a_version_outside_the_range_is_a_warning_not_a_failure(capsys):
    assert doctor._version_line("triton", "3.1.0") is True  # a warning keeps the verdict
    out = capsys.readouterr().out
    assert "[warn] triton 3.1.0 is outside the tested range" in out and "pip install" in out


def test_a_version_inside_the_range_is_ok(capsys):
    assert doctor._version_line("torch", "2.13.0+cpu") is True
    assert capsys.readouterr().out.startswith("[ok ] torch 2.13.0+cpu")
