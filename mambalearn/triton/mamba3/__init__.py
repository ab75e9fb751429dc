"""Chapter 15's kernels: Mamba-3 SISO and MIMO prefill, forward and backward, and the decode
steps (SISO, MIMO).

    mamba3_siso_combined   same signature as mamba_ssm's (forward + recomputing backward)
    mamba3_mimo_combined   the MIMO prefill (rank-r products as tl.dot tiles), fwd + bwd
    mamba3_siso_step       same signature as mamba_ssm's step kernel
    mamba3_mimo_step       the MIMO decode step (rank-r inputs and outputs)

Launch settings: ``config`` (``Config``, ``default_config``), passed in with ``config=``.
"""

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before any kernel module)
from mambalearn.triton.mamba3.interface import mamba3_siso_combined
from mambalearn.triton.mamba3.mimo import mamba3_mimo_combined
from mambalearn.triton.mamba3.step import mamba3_mimo_step, mamba3_siso_step

__all__ = ["mamba3_mimo_combined", "mamba3_mimo_step", "mamba3_siso_combined", "mamba3_siso_step"]
