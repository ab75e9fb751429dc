"""How a ``config.Backward`` becomes the SSD backward kernels' launch arguments (chapter 10).

The settings themselves are data in ``mambalearn.mamba2.config`` (``Backward``: a ``Launch``
per kernel, the q × q tile ``block_q``); every launcher of ``mambalearn.mamba2.backward*``
takes a resolved ``cfg`` (a ``Backward``: ``ssd_backward`` resolves the call's ``Config`` once
and passes its ``backward`` down). How each default was chosen (sm_90 register counts, the H200
sweeps) is recorded in ``bench/NOTES_ssd.md``.
"""

from mambalearn.mamba2.common import launch_options, stages, tile


def launch_args(launch, n=None):
    """(BLOCK_N, launch options) of one kernel's ``config.Launch``: its tile of n (None: the
    whole n), warps, pipeline stages (one in the interpreter) and register cap."""
    bn = tile(launch.block_n, n) if n else None
    return bn, dict(num_warps=launch.num_warps, num_stages=stages(launch.num_stages),
                    **launch_options(launch.maxnreg))


def blocks(q, cfg):
    """The tile of the q×q blocks (steps t and s); steps 4–7 share it, so they agree on which
    blocks of dCB exist (those on or below the diagonal)."""
    return tile(cfg.block_q, q)
