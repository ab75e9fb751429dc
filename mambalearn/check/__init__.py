"""Exercise checks: ``check.<name>(student_fn)`` for every exercise function of the course.

Each chapter's checks live in ``ch<NN>_<topic>.py`` and are re-exported here, so a notebook writes
``from mambalearn import check`` and ``check.zoh(zoh)``. A check module declares ``__all__`` (the
exercise functions it checks) and ``REBUILDS`` (for each, the library functions the exercise asks
the student to write, switched off while grading: see docs/AUTHORING.md).
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
            globals()[_name] = _core.student_facing(getattr(_mod, _name))
            __all__.append(_name)
