"""The tuned Mamba-1 backward's launcher (chapter 09): which kernel, over how many segments.

    g_t = C_t dy_t + Ā_{t+1} g_{t+1}      (the adjoint of h, scanned backwards from the end)

and every gradient from it (``fused.gradients``). ``config.backward.layout`` picks the kernel:
``state_outer`` (one tile a whole chunk: the state the forward stored, no replay) or ``backward``
(sub-blocks of time, replayed from the stored state); the state-outer one is cut into segments
as the forward (``fused.segments``: the adjoint summaries of the later segments first, folded
backwards). The forward and the public entry point are in ``api``; the kernels in ``fused/``.
"""

import triton

from mambalearn.mamba1.args import bc_layout
from mambalearn.mamba1.config import segment_plan, summary_split
from mambalearn.mamba1.fused import backward as sub_block
from mambalearn.mamba1.fused import segments, state_outer
from mambalearn.mamba1.fused.gradients import GradBuffers
from mambalearn.triton.common import sm_count


def backward(dout, dlast, u, delta, A, B, C, D, z, delta_bias, flags, seq_idx, states, shape,
             config, need_g0=True):
    """Launch the backward ``config.backward.layout`` names (the state-outer one cut into
    segments as the forward, its adjoint summaries first). Returns the eight gradients
    (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias) and g_0 (b, d, n), the adjoint at step 0
    (always: it is the adjoint carry's last value)."""
    b, d, l, n, g = shape
    dout = dout.contiguous()  # (autograd's); the inputs came contiguous from ``args.run``
    bc = config.backward
    S, seg_len, k, G, P = 1, l, 1, None, None
    sms = sm_count(u.device)
    if bc.layout == "state-outer":  # (the sub-block kernel walks the whole sequence)
        programs = b * g * triton.cdiv(d // g, bc.block_d)  # a segment's
        S, seg_len = segment_plan(config.segments, programs, bc.per_sm, l,
                                  config.segment_unit, sms)
    if S > 1:
        k = summary_split(S, seg_len, b * g * triton.cdiv(d // g, config.summary.block_d),
                          config.summary, sms)
        G, P = segments.adjoint_summaries(dout, delta, A, C, z, delta_bias, flags, seq_idx,
                                          dlast, shape, S, seg_len, k, config.summary)
    Bk, Ck = bc_layout(B, upcast=True), bc_layout(C, upcast=True)  # fp32 (b, g, n, l) or (d, n)
    tree = None  # deterministic: dB/dC over the channel tiles in a fixed order, not atomics
    if config.deterministic:
        tree = (triton.cdiv(d // g, bc.block_d), config.chunk, bc.tree_fan,
                bc.layout == "sub-block",  # (its last sub-block may end before the chunk)
                bc.tree_after)
    bufs = GradBuffers.allocate(u, delta, z, Bk, Ck, dlast, n, S, tree)
    kernel = state_outer if bc.layout == "state-outer" else sub_block
    kernel.launch(dout, u, delta, A, Bk, Ck, D, z, delta_bias, flags, seq_idx,
                  states, bufs, shape, config, B, C, (S, seg_len, k, G, P))
    return bufs.finish(B, C, D, delta_bias)
