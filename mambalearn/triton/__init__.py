"""Triton kernels of the course. Importing this package first calls `mambalearn.device`, which sets
``TRITON_INTERPRET=1`` on machines without a GPU *before* any kernel is decorated.

    scan            scan.scan (chapter 08: tl.associative_scan with ⊗, blocked, reverse)
    selective_scan  selective_scan_fn (chapter 09: the fused Mamba-1 kernel, fwd + bwd)
    ssd             mamba_chunk_scan_combined (chapter 10: the five SSD stages) and
                    ssd_fused_forward (chapter 11: the fused forward, a states and an outputs
                    kernel)
    step            selective_state_update (chapter 12: the decode step)
    mamba3          mamba3_siso_combined, the decode steps (chapter 15)
    interpreter     the CPU interpreter's bf16 matmul made right (applied here, on import)
"""

import importlib

from mambalearn import device  # noqa: F401  (sets TRITON_INTERPRET before kernels exist)
from mambalearn.triton import interpreter

interpreter.setup()

_WHERE = {
    "selective_scan_fn": "selective_scan",
    "mamba_chunk_scan_combined": "ssd",
    "selective_state_update": "step",
}


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
