"""The one style of launch settings: a frozen dataclass deriving from `LaunchConfig`.

Every family's settings (``mamba1.config``, ``mamba2.config``, ``mamba3.config``, the decode
step's ``StepConfig``) are data passed in with ``config=``: a ``@dataclass(frozen=True)`` class
deriving from `LaunchConfig`, whose parts may be such dataclasses again. ``replace`` changes
fields, a part by a dict of changes (``config.replace(backward=dict(num_warps=4))``), and names
the fields where one is unknown; `resolve` is the one check of an entry point's ``config=``
(``tests/test_kernel_config.py`` refuses any other style in the package).
"""

import dataclasses


class LaunchConfig:
    """Base of every launch-settings dataclass; declare the subclass ``@dataclass(frozen=True)``."""

    def replace(self, **changes):
        """A copy with fields changed; a part that is itself a config may be given as a dict of
        changes. An unknown field is a ValueError naming the fields there are."""
        return _replace(self, changes, "config")


def _replace(obj, changes, where):
    names = {f.name for f in dataclasses.fields(obj)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise ValueError(f"{where} has no field {', '.join(unknown)}; its fields: "
                         f"{', '.join(sorted(names))}")
    changes = {k: _replace(getattr(obj, k), v, f"{where}.{k}")
               if isinstance(v, dict) and dataclasses.is_dataclass(getattr(obj, k)) else v
               for k, v in changes.items()}
    return dataclasses.replace(obj, **changes)


def resolve(config, cls, default):
    """``config`` if it is a ``cls``, ``default()`` if None, else a TypeError naming the class."""
    if config is None:
        return default()
    if not isinstance(config, cls):
        raise TypeError(f"config must be a {cls.__module__}.{cls.__qualname__} (or None), got "
                        f"{type(config).__name__}; change a default with "
                        f"default_config(...).replace(...)")
    return config
