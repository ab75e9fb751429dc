"""Mamba-1's decode step (chapter 12): one token through the (b, d, n) state, in place.

    Ā = exp(Δ A)    h ← Ā ⊙ h + Δ B x    y = C·h + D x    out = y · silu(z)

A Mamba-1 channel is a Mamba-2 head with p = 1 and its own A row, so one kernel serves both
families: ``selective_state_update`` (``mambalearn.mamba2.step``, chapter 12's kernel, mamba_ssm's
signature) takes Mamba-1's state (b, d, n), x, delta, z (b, d), A (d, n), B, C (b, n) as they
are. Its oracle is ``mambalearn.inference.decode_step`` (the same shapes, in PyTorch). This room
names them beside the scan's kernels; the code is taught, and written, in chapter 12.
"""

from mambalearn.inference import decode_step
from mambalearn.mamba2.step import selective_state_update

__all__ = ["decode_step", "selective_state_update"]
