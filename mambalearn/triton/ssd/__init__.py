"""Chapters 10–11: Mamba-2's SSD in Triton.

    mamba_chunk_scan_combined  forward and backward, drop-in for mamba_ssm's (``combined``)
    ssd_fused_forward          chapter 11's fused forward (``fused``: ``states`` + ``outputs``)

Modules: ``forward`` (chapter 10's five stages), ``states`` and ``outputs`` (chapter 11's two
fused kernels), ``fused`` (both designs behind one function), ``backward*`` (the gradients),
``combined`` (the public function), ``config`` (every launch setting, as data: ``Config``,
``default_config``), ``common`` (what the kernels share).
"""

from mambalearn.triton.ssd.combined import mamba_chunk_scan_combined
from mambalearn.triton.ssd.fused import ssd_fused_forward

__all__ = ["mamba_chunk_scan_combined", "ssd_fused_forward"]
