"""Launch settings of the SSD kernels (chapters 10–11), as data passed in.

A `Config` is the whole choice for one call of ``mamba_chunk_scan_combined``: the tiles, warps and
pipeline depths of chapter 10's five stages (`Stages`), of chapter 11's fused forward (`States`,
`Outputs`, `OneLaunch`) and of the backward (`Backward`, one `Launch` per kernel). It holds no
chunk size: the caller's ``chunk_size`` is the one every kernel runs at. `default_config(shape,
device)` returns the measured default for a shape on a device — the tiles are constants, while
the parallelism that depends on the shape (how many segments each sequence's state walk is cut
into, how many programs share a group's heads in the backward) is chosen from b, h, l and the
SM count by `split_walk` and `head_splits`, whose thresholds are the data below. Every entry
point takes ``config=`` (None: the default); ``Config.replace`` changes fields, nested ones by
dicts. The measurements behind each default: ``bench/NOTES_ssd.md``.
"""

import dataclasses
from dataclasses import dataclass, field

import torch
import triton

from mambalearn import device as _device
from mambalearn.triton.common import sm_count
from mambalearn.triton.config import LaunchConfig
from mambalearn.triton.config import resolve as _resolve


@dataclass(frozen=True)
class Launch(LaunchConfig):
    """One kernel's launch: a tile of n (``block_n``, where the kernel has one) and options."""

    num_warps: int = 4
    num_stages: int = 2
    block_n: int | None = None
    maxnreg: int | None = None  # registers per thread (None: the compiler's choice)


@dataclass(frozen=True)
class Stages(LaunchConfig):
    """Chapter 10's five kernels. ``*_block_*``: tile sizes (rounded to the problem's powers of
    two), ``cumsum_heads``: heads per chunk-cumsum program, ``passing_block``: state values per
    state-passing program."""

    cumsum_heads: int = 8
    bmm: Launch = Launch(num_warps=4, num_stages=3, block_n=64)  # block_n: the n reduction tile
    bmm_block_q: int = 64  # rows and columns of C Bᵀ per program
    chunk_state: Launch = Launch(num_warps=4, num_stages=3, block_n=128)
    chunk_state_block_p: int = 64
    chunk_state_block_k: int = 64
    passing_block: int = 1024
    passing_warps: int = 4
    chunk_scan: Launch = Launch(num_warps=4, num_stages=2, block_n=128)
    chunk_scan_block_m: int = 64
    chunk_scan_block_k: int = 64
    chunk_scan_block_p: int = 64


@dataclass(frozen=True)
class States(LaunchConfig):
    """Chapter 11's states kernel: a (block_p, block_n) state tile per program, walking chunks.

    ``tma``: the tensor-descriptor kernel (a chunk a loop trip, a ``stages`` deep pipeline) or
    the pointer-load one (``pointer_block_k`` steps a trip, ``pointer_stages``). ``split``:
    segments each sequence's walk is cut into (1: one walk; the tensor-descriptor kernel only).
    (64-step trips in a 2-stage pipeline, tried on 2026-12-01, computed wrong states on the H200
    and were no faster: bench/NOTES_ssd.md.)"""

    tma: bool = True
    block_p: int | None = 64
    block_n: int | None = 64
    num_warps: int = 4
    stages: int = 1
    maxnreg: int | None = 96  # 16-bit inputs only: 5 one-stage programs an SM without a spill
    split: int = 1
    pointer_block_k: int = 64
    pointer_stages: int = 3


@dataclass(frozen=True)
class Outputs(LaunchConfig):
    """Chapter 11's outputs kernel: ``block_m`` rows × ``block_k`` columns of C Bᵀ at a time,
    ``rows`` row blocks per program (None: the whole chunk), ``loop``: every column block in one
    pipelined loop, ``exp2``: decays from log2-scaled a."""

    block_m: int = 64
    block_k: int = 64
    rows: int | None = 1
    loop: bool = False
    num_warps: int = 4
    num_stages: int = 2
    exp2: bool = False
    maxnreg: int | None = None


@dataclass(frozen=True)
class OneLaunch(LaunchConfig):
    """Chapter 11's one-launch kernel (its outputs tile as `Outputs`, ``block_p`` channels)."""

    block_m: int = 64
    block_k: int = 64
    block_p: int = 64
    num_warps: int = 4
    num_stages: int = 2
    exp2: bool = False
    maxnreg: int | None = None


@dataclass(frozen=True)
class Backward(LaunchConfig):
    """The backward's kernels (``mambalearn.mamba2.backward`` numbers the steps).

    ``block_q``: the (t, s) tile of the q × q blocks (steps 4–7 agree on it); ``nsplit``:
    programs sharing a group's heads in steps 4–6; ``recompute``: step 0 by chapter 11's
    states kernel (``"states"``, with ``states``: its ``split`` cuts that walk as the forward's)
    or chapter 10's stages (``"stages"``); ``passing_split``: segments step 3's reverse walk over
    the chunks is cut into (1: one walk)."""

    block_q: int = 64
    dstates: Launch = Launch(num_warps=4, num_stages=3, block_n=128)
    dstates_block_p: int | None = 64
    dcb: Launch = Launch(num_warps=8, num_stages=2, maxnreg=128)  # two programs an SM
    dC: Launch = Launch(num_warps=8, num_stages=3, block_n=64)
    dB: Launch = Launch(num_warps=8, num_stages=3, block_n=64)
    dx: Launch = Launch(num_warps=8, num_stages=2, block_n=64, maxnreg=80)  # n whole: spills
    nsplit: int = 1
    passing_block: int = 256  # one warp, 8 values a thread: its sums need no barrier
    passing_warps: int = 1
    passing_split: int = 1
    cumsum_heads: int = 4
    cumsum_warps: int = 4
    gate_block: int = 1024
    recompute: str = "states"
    states: States = States(tma=False)


@dataclass(frozen=True)
class Config(LaunchConfig):
    """Every launch setting of one SSD call (module doc)."""

    stages: Stages = field(default_factory=Stages)
    states: States = field(default_factory=States)
    outputs: Outputs = field(default_factory=Outputs)
    one: OneLaunch = field(default_factory=OneLaunch)
    backward: Backward = field(default_factory=Backward)

    def __post_init__(self):
        if self.backward.recompute not in ("states", "stages"):
            raise ValueError(f'backward.recompute must be "states" or "stages", '
                             f"got {self.backward.recompute!r}")
        for name, v in (("states.split", self.states.split),
                        ("backward.nsplit", self.backward.nsplit),
                        ("backward.states.split", self.backward.states.split),
                        ("backward.passing_split", self.backward.passing_split)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int ≥ 1, got {v!r}")


# --- what depends on the shape: the data, and the two rules ------------------------------------
# a sequence's state walk is cut in segments only if at least SPLIT_MIN segments of at least
# SPLIT_MIN_CHUNKS chunks fit in one wave of SPLIT_PROGRAMS_PER_SM programs an SM
SPLIT_PROGRAMS_PER_SM, SPLIT_MIN, SPLIT_MIN_CHUNKS = 5, 3, 8
HEADS_PROGRAMS_PER_SM = 2  # steps 4–6: split a group's heads while fewer programs than this
# The backward's recompute of the states (step 0) by default runs the pointer-load kernel (205
# registers on sm_90: two programs an SM), whose walk cut in S fills S · 160 / 264 waves at b1 h80:
# where the forward's walk is cut it takes the forward's descriptor kernel (96 registers, five an
# SM) and its cut instead (``gpu_config``).
# the backward's reverse state passing (one-warp programs, bound by bytes once ~16 warps an SM
# keep their next chunk in flight): cut only while fewer than that; a cut costs a second read of
# dH ((S − 1)/S × 4 of the 10 bytes a value a chunk)
PASSING_RULE = (16, 3, 8)  # (programs an SM, least segments, least chunks a segment)
# the outputs kernel at chunks up to 128: one pipelined loop over 32-column blocks, 3 stages
# (127 registers: 4 programs an SM instead of 3); at 256 the one-tile diagonal was faster
OUTPUTS_LOOP = Outputs(block_k=32, loop=True, num_stages=3)
OUTPUTS_LOOP_MAX_CHUNK = 128


def split_walk(programs, nchunks, sms, rule=None):
    """Segments per sequence for the states kernel: as many as fit one wave of
    ``programs_per_sm`` programs an SM beside the ``programs`` (b · h · state tiles) already
    there, each of at least ``min_chunks`` chunks; 1 (no split) if fewer than ``min_split``.

    With S segments the two launches walk 2·C/S chunks where one launch walks C, doing
    (2S − 1)/S of the work: worth it only when the GPU is otherwise idle (small b · h)."""
    per_sm, least, min_chunks = rule or (SPLIT_PROGRAMS_PER_SM, SPLIT_MIN, SPLIT_MIN_CHUNKS)
    s = min(per_sm * sms // max(programs, 1), nchunks // min_chunks)
    return s if s >= least else 1


def head_splits(heads_per_group, programs, sms):
    """Programs per group in backward steps 4–6: doubled while the grid has fewer than
    ``HEADS_PROGRAMS_PER_SM`` programs an SM (and the split divides the group)."""
    split = 1
    while (programs * split < HEADS_PROGRAMS_PER_SM * sms
           and heads_per_group % (2 * split) == 0):
        split *= 2
    return split


# --- the defaults --------------------------------------------------------------------------
# the interpreter (CPU): small tiles, whole dimensions (None) where a tile would loop, no caps
_WHOLE = Launch(num_warps=4, num_stages=1)
_CPU_STATES = States(block_p=None, block_n=None, maxnreg=None)
CPU = Config(
    stages=Stages(cumsum_heads=1, bmm=_WHOLE, bmm_block_q=16, chunk_state=_WHOLE,
                  chunk_state_block_p=None, chunk_state_block_k=16, passing_block=256,
                  chunk_scan=_WHOLE, chunk_scan_block_m=16, chunk_scan_block_k=16,
                  chunk_scan_block_p=None),
    states=_CPU_STATES,
    backward=Backward(block_q=16, dstates=_WHOLE, dstates_block_p=None, dcb=_WHOLE, dC=_WHOLE,
                      dB=_WHOLE, dx=_WHOLE, cumsum_heads=1,
                      states=dataclasses.replace(_CPU_STATES, tma=False)))
GPU = Config()  # the H200's, before the shape rules


def defaults(device):
    """The `Config` of a device before the shape rules: ``CPU`` in Triton's interpreter, else
    ``GPU`` (what a kernel's launcher uses when called without one)."""
    return CPU if _device.interpreted() or torch.device(device).type == "cpu" else GPU


def resolve(config, shape, device):
    """``config`` if it is a `Config`, the default for ``shape`` on ``device`` if None, else a
    TypeError (the one check of every entry point's ``config=``)."""
    return _resolve(config, Config, lambda: default_config(shape, device))


def default_config(shape, device):
    """The default `Config` for ``shape`` = (b, l, h, p, g, n, chunk) on ``device`` (a CPU
    device: the interpreter's tiles; a meta device: the H200's 132 SMs, for offline builds)."""
    if defaults(device) is CPU:
        return CPU
    return gpu_config(shape, sm_count(device) or 132)


def gpu_config(shape, sms):
    """The GPU default for ``shape`` on a GPU of ``sms`` SMs: ``GPU`` with the shape rules
    applied (the segments of the three walks over chunks: the forward's states, the backward's
    recompute of them and its reverse state passing; the backward's head splits; the outputs
    kernel by chunk)."""
    b, l, h, p, g, n, q = shape
    cfg = GPU
    tiles = triton.cdiv(p, cfg.states.block_p) * triton.cdiv(n, cfg.states.block_n)
    c = triton.cdiv(l, q)
    split = split_walk(b * h * tiles, c, sms)
    # the backward's recompute walks the same chunks: where the forward's walk is cut, it runs
    # the forward's (tensor-descriptor) states kernel cut the same way; else its own
    bstates = cfg.backward.states if split == 1 else dataclasses.replace(cfg.states, split=split)
    passing = split_walk(b * h * triton.cdiv(p * n, cfg.backward.passing_block), c, sms,
                         PASSING_RULE)
    nblk = triton.cdiv(q, cfg.backward.block_q)
    nsplit = head_splits(h // g, b * c * g * nblk * (nblk + 1) // 2, sms)
    outputs = OUTPUTS_LOOP if q <= OUTPUTS_LOOP_MAX_CHUNK else cfg.outputs
    return cfg.replace(states=dict(split=split), outputs=outputs,
                       backward=dict(nsplit=nsplit, passing_split=passing, states=bstates))
