"""Mamba-1's fused selective scan (chapter 09):
the old import path, kept for code written against it.

The code now lives in `mambalearn.mamba1` (api, kernel, config, args, fused/);
this module only re-exports its public names.
"""

from mambalearn.mamba1.api import selective_scan_fn
from mambalearn.mamba1.config import Config, default_config
from mambalearn.mamba1.kernel import selective_scan_teaching

__all__ = ["Config", "default_config", "selective_scan_fn", "selective_scan_teaching"]
