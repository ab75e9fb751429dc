"""Chapters 10–11: Mamba-2's SSD in Triton.

    mamba_chunk_scan_combined  the five forward stages and the backward (drop-in for mamba_ssm's)
    ssd_fused_forward          the single-launch forward of chapter 11

Modules: ``forward`` (the five stages and the public function), ``backward*`` (the gradients),
``fused`` (one launch).
"""

from mambalearn.triton.ssd.forward import mamba_chunk_scan_combined
from mambalearn.triton.ssd.fused import ssd_fused_forward

__all__ = ["mamba_chunk_scan_combined", "ssd_fused_forward"]
