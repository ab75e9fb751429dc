"""Mamba-3's kernels (chapter 15):
the old import path, kept for code written against it.

The code now lives in `mambalearn.mamba3` (api, mimo_api, step, beside the oracles);
this module only re-exports its public names (mamba_ssm's signatures).
"""

from mambalearn.mamba3.api import mamba3_siso_combined
from mambalearn.mamba3.mimo_api import mamba3_mimo_combined
from mambalearn.mamba3.step import mamba3_mimo_step, mamba3_siso_step

__all__ = ["mamba3_mimo_combined", "mamba3_mimo_step", "mamba3_siso_combined", "mamba3_siso_step"]
