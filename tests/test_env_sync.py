"""environment.yml (conda-forge) lists the same dependencies as pyproject.toml."""

import re
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAME = {"torch": "pytorch"}  # PyPI name -> conda-forge name where they differ


def _split(req):
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*([^;]*)", req)
    return m.group(1).lower(), m.group(2).replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += [r for r in extra if not r.startswith("mambalearn")]
    want = {CONDA_NAME.get(n, n): spec for n, spec in map(_split, reqs)}

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"][0] == "conda-forge" and "defaults" not in env["channels"]
    conda, pip = {}, {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip.update(_split(r) for r in dep["pip"] if not r.startswith("-e"))
        elif not dep.startswith(("python", "pip")) or dep.startswith("python-"):
            conda.update([_split(dep)])
    assert {**conda, **pip} == want
