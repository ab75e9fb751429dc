"""Import pure-Triton functions of the official ``mamba_ssm`` from its source tree, for side-by-side
timing. Its package ``__init__`` imports the CUDA extension unconditionally, so empty stub packages
stand in for ``mamba_ssm`` and its subpackages: no ``__init__`` runs, only the module asked for.

The tree is found at ``$MAMBA_SSM_PATH`` or ``.mamba_ref/mamba_ssm-2.3.2.post1/mamba_ssm`` in the
repository (never committed: `pip download --no-binary :all: mamba-ssm==2.3.2.post1`, unpacked).
"""

import importlib
import os
import sys
import types

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT = os.path.join(ROOT, ".mamba_ref", "mamba_ssm-2.3.2.post1", "mamba_ssm")


def load(module, name, path=None):
    """``mamba_ssm.<module>.<name>``, or None with the reason printed (the bench then times ours
    only)."""
    root = os.path.abspath(path or os.environ.get("MAMBA_SSM_PATH") or DEFAULT)
    if not os.path.isdir(root):
        print(f"mamba_ssm source tree not found at {root}: timing ours only")
        return None
    parts = module.split(".")[:-1]  # the packages above the module, e.g. ["ops", "triton"]
    packages = [parts[:i] for i in range(len(parts) + 1)] + [["utils"]]  # its kernels import utils
    for sub in packages:
        package = ".".join(["mamba_ssm", *sub])
        if package not in sys.modules:  # a stub: its __init__ (and the CUDA import) never runs
            stub = types.ModuleType(package)
            stub.__path__ = [os.path.join(root, *sub)]
            sys.modules[package] = stub
    try:
        return getattr(importlib.import_module(f"mamba_ssm.{module}"), name)
    except Exception as e:  # noqa: BLE001 - e.g. einops missing: report, do not crash the bench
        print(f"mamba_ssm.{module}.{name} not importable: {type(e).__name__}: {e}")
        return None
