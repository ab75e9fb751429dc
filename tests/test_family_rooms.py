"""The three kernel families show the same rooms: a student who knows where Mamba-2's backward
or decode step lives finds Mamba-1's and Mamba-3's under the same name (docs/ARCHITECTURE.md)."""

import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mambalearn"
FAMILIES = ("mamba1", "mamba2", "mamba3")
# a room is a module (name.py) or a package (name/); "chunk or kernel": the chunked stages or
# the one readable kernel, whichever the family's algorithm is
ROOMS = ("reference", "api", "config", "chunk|kernel", "backward", "fused/", "step")


def rooms(family):
    """The rooms of ROOMS that ``mambalearn/<family>/`` has, each as ROOMS spells it."""
    folder = PACKAGE / family
    found = []
    for room in ROOMS:
        if room.endswith("/"):
            ok = (folder / room / "__init__.py").is_file()
        else:
            ok = any((folder / f"{name}.py").is_file() for name in room.split("|"))
        if ok:
            found.append(room)
    return found


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_every_room(family):
    assert rooms(family) == list(ROOMS), (
        f"mambalearn/{family}/ lacks {sorted(set(ROOMS) - set(rooms(family)))}: give it the room "
        f"(moved code, or a face whose docstring says where the code is taught)")


def test_the_families_show_the_same_rooms():
    assert rooms("mamba1") == rooms("mamba2") == rooms("mamba3")


@pytest.mark.parametrize("module", ["mamba1.reference", "mamba1.step"])
def test_a_face_room_says_where_its_code_lives(module):
    """A room that names code written elsewhere hands on real names, and its docstring names the
    module each comes from (where the code is taught)."""
    mod = importlib.import_module(f"mambalearn.{module}")
    assert mod.__all__, f"{module} hands nothing on"
    for name in mod.__all__:
        obj = getattr(mod, name)
        home = getattr(obj, "fn", obj).__module__  # a Triton kernel wraps its function
        assert home != mod.__name__, f"{module}.{name} is written here: not a face"
        assert home in mod.__doc__, f"{module}'s docstring does not say where {name} lives ({home})"
