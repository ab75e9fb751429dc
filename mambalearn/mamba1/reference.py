"""Mamba-1's oracle: the selective scan as a loop over time, taught in chapter 02.

    Δ_t = softplus(delta_t + delta_bias)      Ā_t = exp(Δ_t A)      B̄_t x_t = Δ_t B_t x_t
    h_t = Ā_t h_{t−1} + Δ_t B_t x_t           y_t = C_t h_t + D x_t  out_t = y_t · silu(z_t)

The loop is written once, in ``mambalearn.scan.sequential`` (``selective_scan_sequential``:
mamba_ssm's ``selective_scan_ref`` arguments, plus ``mask`` and ``initial_state``), where
chapter 02 builds it and every later scan of the course is compared with it; this room names it
beside the kernels it checks (``kernel``, ``api``). The decode step's oracle is
``mambalearn.inference.decode_step`` (chapter 12; see ``step``).
"""

from mambalearn.scan.sequential import (
    check_inputs,
    effective_delta,
    selective_scan_sequential,
)

__all__ = ["check_inputs", "effective_delta", "selective_scan_sequential"]
