"""Chapter 09: the fused Mamba-1 selective scan, forward and backward.

    selective_scan_fn        the tuned kernels (drop-in for ``mamba_ssm.selective_scan_fn``,
                             plus initial_state, a differentiable last state, packed sequences)
    selective_scan_teaching  the readable version the chapter walks through
    Config, default_config   the tuned kernels' launch settings (``config``)
"""

from mambalearn.triton.selective_scan.config import Config, default_config
from mambalearn.triton.selective_scan.teaching import selective_scan_teaching
from mambalearn.triton.selective_scan.tuned import selective_scan_fn

__all__ = ["Config", "default_config", "selective_scan_fn", "selective_scan_teaching"]
