"""Launch settings of the SSD backward's kernels (chapter 10), as data.

``CONFIGS[kernel]`` holds a kernel's tile of n (``BLOCK_N``) and its launch options; every launcher
of ``mambalearn.triton.ssd.backward*`` takes an optional ``cfg`` dict of the same form, and
``ssd_backward(..., configs={kernel: cfg})`` passes them on, so a benchmark sweep hands settings
in instead of replacing module globals. How each default was chosen (sm_90 register counts, the
H200 sweeps) is recorded in ``bench/NOTES_ssd.md`` and ``docs/BENCHMARKS.md``.
"""

from mambalearn.triton.ssd.common import INTERP, p2

CONFIGS = dict(
    dstates=dict(BLOCK_N=128, num_warps=4, num_stages=3),
    dcb=dict(num_warps=8, num_stages=2, maxnreg=128),  # a register cap: two programs per SM
    dC=dict(BLOCK_N=64, num_warps=8, num_stages=3),
    dB=dict(BLOCK_N=64, num_warps=8, num_stages=3),
    dx=dict(BLOCK_N=64, num_warps=8, num_stages=2, maxnreg=80),  # n in one tile would spill
)


def launch_config(name, cfg=None, n=None):
    """(BLOCK_N, launch options) of kernel ``name``: ``cfg`` if given, else ``CONFIGS[name]``.
    The interpreter takes the whole n and one stage (``maxnreg``, a compile option, is not for
    it either)."""
    if name not in CONFIGS:
        raise ValueError(f"no SSD backward kernel named {name!r}; known: {sorted(CONFIGS)}")
    c = dict(CONFIGS[name] if cfg is None else cfg)
    bn = c.pop("BLOCK_N", None)
    if INTERP:
        return (p2(n) if n else None), dict(num_warps=4, num_stages=1)
    return (min(bn, p2(n)) if n and bn else bn), c


def blocks(q):
    """The tile of the q×q blocks (steps t and s); steps 4–7 share it, so they agree on which
    blocks of dCB exist (those on or below the diagonal)."""
    return 16 if INTERP else min(64, p2(q))
