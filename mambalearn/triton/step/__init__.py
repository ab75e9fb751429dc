"""The decode step (chapter 12):
the old import path, kept for code written against it.

The code now lives in `mambalearn.mamba2.step` (one kernel for Mamba-2's and Mamba-1's state);
this module only re-exports its public names (``selective_state_update`` as mamba_ssm names it).
"""

from mambalearn.mamba2.step import selective_state_update

__all__ = ["selective_state_update"]
