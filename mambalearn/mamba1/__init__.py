"""Mamba-1 (chapter 09, and the state-outer backward of chapter 12): the fused selective scan.

The rooms of Mamba-2 and Mamba-3:

    reference  the oracle, chapter 02's loop (``selective_scan_sequential``, written in
               `mambalearn.scan.sequential`), named beside the kernels it checks
    kernel     the readable kernel the chapter walks through (``selective_scan_teaching``)
    api        the tuned entry point ``selective_scan_fn`` (drop-in for ``mamba_ssm``'s, plus
               initial_state, a differentiable last state, packed sequences) and its forward
    backward   the tuned backward's launcher: which kernel, over how many segments
    args       the checks, layouts and autograd Function both share (the interface of kernel
               and api)
    config     the tuned kernels' launch settings as data (``Config``, ``default_config``)
    fused/     the tuned kernels: forward, recurrent, segments, backward, state_outer, and the
               helpers they share (tile, gradients)
    step       the decode step (chapter 12): `mambalearn.mamba2.step.selective_state_update`,
               one kernel for Mamba-1's (b, d, n) state and Mamba-2's, and its oracle
"""


from mambalearn import triton as _triton  # noqa: F401  (TRITON_INTERPRET, the interpreter's bf16 dot)
from mambalearn.utils import lazy_attributes

_WHERE = {
    "selective_scan_fn": "api",
    "selective_scan_teaching": "kernel",
    "Config": "config",
    "default_config": "config",
}
__all__ = sorted(_WHERE)


__getattr__ = lazy_attributes(__name__, _WHERE)  # the kernels load when asked for
