"""Exercise checks: ``check.<name>(student_fn)`` for every exercise function of the course.

Each chapter's checks live in ``ch<NN>_<topic>.py`` and are re-exported here, so a notebook writes
``from mambalearn import check`` and ``check.zoh(zoh)`` (``check.zoh(zoh, seed=…)`` replays the
inputs a failure names). A check module declares ``__all__`` (the exercise functions it checks),
``REBUILDS`` (for each, the library and torch functions that compute its answer, switched off while
grading) and ``HINTS`` (for each, the hints a failure shows one by one): see docs/AUTHORING.md.
"""

import importlib
import pkgutil

from mambalearn.check import _core
from mambalearn.check.treeorder import tree_order

__all__ = ["tree_order"]

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name.startswith("ch"):
        _mod = importlib.import_module(f"{__name__}.{_m.name}")
        for _name in _mod.__all__:
            _hints = getattr(_mod, "HINTS", {}).get(_name, ())
            globals()[_name] = _core.student_facing(getattr(_mod, _name), _hints)
            __all__.append(_name)
