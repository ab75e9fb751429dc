"""Mamba-3's fused kernels (chapter 15): the MIMO prefill, one program per (head, batch).

    mimo_forward   chunks in order, the state (p × n) kept in registers from chunk to chunk:
                   S = Q Kᵀ, y = (S ∘ L) V + e^{c} ∘ (Q Hᵀ) + D V, H ← e^{c_end} H + (u ∘ V)ᵀ K
    mimo_backward  chunks in reverse, each recomputed from the state stored at its start

the design of chapter 11's fused SSD states kernel (``mambalearn.mamba2.fused.states``): one
program walks its row's chunks with the state on chip, so no state crosses memory between
chunks. Their formulas are in the two modules' docstrings; ``mamba3_mimo_combined``
(``mambalearn.mamba3.mimo_api``) launches them. The SISO kernels are the chunked ones
(``chunk``, ``backward``).
"""

from mambalearn.mamba3.fused.mimo_backward import mimo_backward_kernel, sum_heads_kernel
from mambalearn.mamba3.fused.mimo_forward import mimo_forward_kernel

__all__ = ["mimo_backward_kernel", "mimo_forward_kernel", "sum_heads_kernel"]
