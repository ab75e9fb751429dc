"""Chapter 15 — Mamba-3: a trapezoid, a rotating (complex) state, and more work per byte.

    sequential   the oracle loop ``mamba3_siso_sequential`` (mamba_ssm's names and layouts), the
                 complex-state oracle, and the pieces: angles, rotations, trapezoid coefficients
    chunked      ``mamba3_siso_chunked``: chapter 10's chunked algorithm with the trapezoid weight
    step         the decode step, SISO (``mamba3_siso_step_ref``) and MIMO, with their costs
    tasks        parity: a task Mamba's real decaying state cannot solve and a rotating one can
    mixer        the Mamba-3 block of chapter 13's model (``Mamba3Config``; registers itself)
    mimo         MIMO prefill: the loop oracle and the chunked form (ranks folded into rows)
    parallel     context parallelism (chapter 14): the angle scan and the one-token halo
    verify       context parallel against one process, for the tests and the chapter

Glossary (mamba_ssm's names → the course's letters): Q = C, K = B, V = x, ADT = Δ·A, DT = Δ,
Trap = logit of the trapezoid weight λ, Angles = the raw rotation rates ω (θ = Σ Δ·π·tanh(ω)).
"""

from mambalearn.mamba3 import mixer  # noqa: F401  (registers the "mamba3" block with the model)
from mambalearn.mamba3.chunked import mamba3_siso_chunked, trapezoid_weights
from mambalearn.mamba3.sequential import (
    angle_cumsum,
    angle_rates,
    mamba3_complex_sequential,
    mamba3_siso_sequential,
    rotate_pairs,
    trapezoid_coefficients,
)

__all__ = [
    "angle_cumsum", "angle_rates", "mamba3_complex_sequential", "mamba3_siso_chunked",
    "mamba3_siso_sequential", "rotate_pairs", "trapezoid_coefficients", "trapezoid_weights",
]
