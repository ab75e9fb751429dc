"""Mamba-2's SSD in Triton (chapters 10–11):
the old import path, kept for code written against it.

The code now lives in `mambalearn.mamba2` (api, chunk, backward, fused/, config);
this module only re-exports its public names (``mamba_chunk_scan_combined`` as mamba_ssm names it).
"""

from mambalearn.mamba2.api import mamba_chunk_scan_combined
from mambalearn.mamba2.fused.forward import ssd_fused_forward

__all__ = ["mamba_chunk_scan_combined", "ssd_fused_forward"]
