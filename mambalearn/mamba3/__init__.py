"""Chapter 15 — Mamba-3: a trapezoid, a rotating (complex) state, and more work per byte.

The oracles (PyTorch):

    reference          the oracle loop ``mamba3_siso_sequential`` (mamba_ssm's names and layouts),
                       the complex-state oracle, and the pieces: angles, rotations, trapezoid
                       coefficients
    reference_chunked  ``mamba3_siso_chunked``: chapter 10's chunked algorithm with the trapezoid
                       weight
    step_reference     the decode step, SISO (``mamba3_siso_step_ref``) and MIMO, with their costs
    mimo_reference     MIMO prefill: the loop oracle and the chunked form (ranks folded into rows)

The kernels (Triton), beside them, in the rooms of Mamba-1 and Mamba-2:

    api                ``mamba3_siso_combined`` (same signature as mamba_ssm's; forward +
                       recomputing backward)
    args, config       the checks; the launch settings as data (``Config``, ``default_config``)
    chunk              the chunked forward (chunk_state, state_passing: its states)
    backward           the backward (backward_qk, backward_v)
    mimo_api           ``mamba3_mimo_combined``: the MIMO prefill (mimo_forward, mimo_backward)
    fused/             names the fused kernels: the MIMO prefill's, a program per (head, batch)
    step               ``mamba3_siso_step`` (mamba_ssm's signature) and ``mamba3_mimo_step``
    common             what the kernels share

The model and beyond:

    tasks        parity: a task Mamba's real decaying state cannot solve and a rotating one can
    mixer        the Mamba-3 block of chapter 13's model (``Mamba3Config``; registers itself)
    parallel     context parallelism (chapter 14): the angle scan and the one-token halo
    verify       context parallel against one process, for the tests and the chapter

Glossary (mamba_ssm's names → the course's letters): Q = C, K = B, V = x, ADT = Δ·A, DT = Δ,
Trap = logit of the trapezoid weight λ, Angles = the raw rotation rates ω (θ = Σ Δ·π·tanh(ω)).
"""


from mambalearn import triton as _triton  # noqa: F401  (TRITON_INTERPRET, the interpreter's bf16 dot)
from mambalearn.mamba3 import mixer  # noqa: F401  (registers the "mamba3" block with the model)
from mambalearn.mamba3.reference import (
    angle_cumsum,
    angle_rates,
    mamba3_complex_sequential,
    mamba3_siso_sequential,
    rotate_pairs,
    trapezoid_coefficients,
)
from mambalearn.mamba3.reference_chunked import mamba3_siso_chunked, trapezoid_weights
from mambalearn.utils import lazy_attributes

__all__ = [
    "angle_cumsum", "angle_rates", "mamba3_complex_sequential", "mamba3_siso_chunked",
    "mamba3_siso_sequential", "rotate_pairs", "trapezoid_coefficients", "trapezoid_weights",
]

_WHERE = {
    "mamba3_siso_combined": "api",
    "mamba3_mimo_combined": "mimo_api",
    "mamba3_siso_step": "step",
    "mamba3_mimo_step": "step",
}


__getattr__ = lazy_attributes(__name__, _WHERE)  # the kernels load when asked for
