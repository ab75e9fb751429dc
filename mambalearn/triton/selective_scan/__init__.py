"""Chapter 09: the fused Mamba-1 selective scan, forward and backward.

    selective_scan_fn        the tuned kernels (drop-in for ``mamba_ssm.selective_scan_fn``)
    selective_scan_teaching  the readable version the chapter walks through

Modules: ``interface`` (argument checks, layouts, shared by both), ``teaching``, and the tuned
kernel's ``forward``, ``backward``, ``backward_state_outer``, ``config`` and ``tuned`` (launchers).
"""

from mambalearn.triton.selective_scan.teaching import selective_scan_teaching
from mambalearn.triton.selective_scan.tuned import selective_scan_fn

__all__ = ["selective_scan_fn", "selective_scan_teaching"]
