"""Mamba-1's tuned kernels (chapter 09), launched by `mambalearn.mamba1.api`.

    forward      the chunked forward scan (state in registers, tl.associative_scan inside)
    recurrent    the forward as a plain recurrence over time (small batches)
    segments     a sequence cut into segments: their summaries and the fold (small batches)
    backward     the backward, sub-blocks of time (reverse scan)
    state_outer  the backward with the state dimension outermost
    gradients    the gradient sums the backward kernels share (deterministic)
    tile         loads, stores and the ⊗ scan of one tile
"""
