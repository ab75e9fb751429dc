"""Mamba-2's SSD (chapters 10–11) and the decode step (chapter 12), oracle beside the kernels.

    reference       the oracle: segsum, the quadratic (attention) form, the chunked algorithm
    reference_grad  its backward, derived by hand (chapter 10)
    packed          packed sequences (cu_seqlens / seq_idx) in the oracle
    api             ``mamba_chunk_scan_combined``: checks and resolves once, forward + backward,
                    drop-in for mamba_ssm's
    args            the checks and layouts of the public function
    config          every launch setting, as data (``Config``, ``default_config``)
    chunk           chapter 10's five stages as Triton kernels
    backward        the backward, its steps in order (backward_cumsum, backward_dx,
                    backward_groups, backward_states; backward_config their launch settings)
    fused/          chapter 11: ``ssd_fused_forward`` (forward) over the states and outputs
                    kernels, and the one-launch design
    common          what the kernels share (tiles, loads, stages)
    step            ``selective_state_update``: the decode step (chapter 12), one kernel for
                    Mamba-2's (b, h, p, n) state and Mamba-1's (b, d, n)
"""


from mambalearn import triton as _triton  # noqa: F401  (TRITON_INTERPRET, the interpreter's bf16 dot)
from mambalearn.utils import lazy_attributes

_WHERE = {
    "mamba_chunk_scan_combined": "api",
    "ssd_fused_forward": "fused.forward",
    "selective_state_update": "step",
    "Config": "config",
    "default_config": "config",
}
__all__ = sorted(_WHERE)


__getattr__ = lazy_attributes(__name__, _WHERE)  # the kernels load when asked for
