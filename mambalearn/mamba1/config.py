"""Launch settings of the tuned Mamba-1 selective scan (chapter 09), as data passed in.

A `Config` is the whole choice for one call: how many steps lie between the states the forward
stores (``chunk``, the backward restarts from those), the forward's tile and switches
(`Forward`) and which backward kernel runs with which tile (`Backward`). `default_config(n,
device)` returns the measured default for n states on a device; ``selective_scan_fn(...,
config=...)`` takes any other. The named variants below are the alternatives the GPU scripts
time side by side. Every figure behind a default is in ``bench/NOTES_selective_scan.md`` and
``docs/BENCHMARKS.md`` (H200, b8 d2048 l2048 bf16), not here.
"""

import dataclasses
import math
from dataclasses import dataclass

import torch

from mambalearn.triton.common import sm_count  # noqa: F401  (the plan's SMs: config.sm_count)
from mambalearn.triton.config import LaunchConfig

LAYOUTS = ("state-outer", "sub-block")  # the backward's
FORWARD_LAYOUTS = ("scan", "recurrent")
UNROLL_MAX = 16  # the scan forward's states unrolled up to this n (compile time grows)
MIN_SEGMENT = 512  # the shortest piece of a sequence worth its own summary (steps)


@dataclass(frozen=True)
class Forward(LaunchConfig):
    """The forward kernel's launch: a tile of ``block_d`` channels × ``block_l`` steps.
    ``layout``: "scan" (``forward``: a scan along time per state) or "recurrent"
    (``recurrent``: one channel a thread, every state in registers, step by step)."""

    block_d: int
    block_l: int
    num_warps: int
    layout: str = "scan"
    unroll: bool = True  # states unrolled, carries in registers; False: a run-time state loop
    state_unroll: int = 1  # run-time state loop: states per turn (their scans interleave)
    stages: int = 0  # > 0: a software-pipelined `for` over time blocks (cp.async), else `while`
    even: bool = True  # drop the masks where the tile divides l and the channels of a group
    maxnreg: int | None = None  # registers per thread (None: the compiler's choice)
    prefetch: bool = False  # recurrent: each step's B, C rows loaded one step ahead
    per_sm: int = 2  # programs of this launch one SM holds at once (its registers × warps)
    l1_prefetch: bool = False  # the next tile's inputs asked into L1 at each tile's top (a hint:
                               # scan, u/Δ/z and B/C rows; recurrent, B/C rows)
    fast_softplus: bool = False  # softplus from MUFU's ex2 and lg2 (`tile.softplus_fast`)


@dataclass(frozen=True)
class Summary(LaunchConfig):
    """The launch of the segment summaries (``segments``): one channel a thread, ``block_l``
    steps a tile, each step's B (or C) row loaded one step ahead if ``prefetch``."""

    block_d: int
    block_l: int
    num_warps: int
    prefetch: bool = True
    per_sm: int = 16  # programs one SM holds at once (127 registers × 32 threads, sm_90)
    split: int | None = None  # pieces a summarised segment is cut into (None: `summary_split`)
    l1_prefetch: bool = False  # the next tile's rows of B asked into L1 at each tile's top
    fast_softplus: bool = False  # softplus from MUFU's ex2 and lg2 (`tile.softplus_fast`)
    state_split: int = 1  # forward: programs a channel tile, n / state_split states each (fewer
                          # registers a program, more of them in flight; n a multiple of it)


@dataclass(frozen=True)
class Backward(LaunchConfig):
    """The backward kernel's launch. ``layout``: "state-outer" (a tile is one whole chunk, no
    replay; needs n ≤ chunk) or "sub-block" (sub-blocks of ``block_l`` steps, replayed from the
    chunk's stored state)."""

    layout: str
    block_d: int
    num_warps: int
    block_l: int = 8  # sub-block only: steps per sub-block (state-outer: the chunk)
    even: bool = True  # drop the masks where the tile divides l and the channels of a group
    rev_loads: bool = False  # state-outer: adjoint inputs loaded time-reversed (1 flip, not 3)
    stages: int = 0  # sub-block: > 0 pipelines the run-time state loop
    unroll: bool = False  # sub-block: states unrolled (carries in registers)
    maxnreg: int | None = None
    per_sm: int = 21  # programs of this launch one SM holds at once (its registers × warps)
    tree_fan: int = 16  # deterministic mode: channel tiles one node of the dB/dC sum adds
    tree_rows: int = 0  # deterministic mode, state-outer: rows of a program's per-chunk staging
    # (each run of block_d / tree_rows channels summed, the rows then added once a chunk; 0: the
    # tile's channel sum goes straight into its slot of the tree)
    tree_after: bool = False  # deterministic mode: the tiles' partials added in tile order by a
    # second kernel after the backward (``deterministic.TreeSum`` ``after``), not by a tree joined
    # in the chunk loop (no counter, fence or last-arriver's sum there)
    tree_block: int = 0  # deterministic mode: floats a pass of the staging's and the tree's sums
    # adds (a power of two; 0: 128 a warp, 4 a thread)
    reg_carry: bool = False  # state-outer: the adjoint carried between chunks in a register tile
    # (column n = state n), not stored and reloaded per state (a shared-memory round trip once
    # the channels span warps)


@dataclass(frozen=True)
class Config(LaunchConfig):
    """Steps between stored states, the forward's and backward's launches, and how many
    segments a sequence is cut into (``segments``: None = as many as fill the GPU, see
    `segment_plan`; 1 = never cut) with the launch of their summaries.

    ``deterministic``: the backward adds the time-varying dB/dC over channel tiles in a fixed
    order (``deterministic.TreeSum``) instead of with atomics, so fwd+bwd give the same bits on
    every run, and a sequence's outputs and gradients the same bits at any position in its batch
    (every other sum is per program in both modes). What still depends on the batch: the plan
    (`segment_plan`, `summary_split`) counts the programs of the whole batch, so one sequence in
    batches of different *sizes* may be cut differently (last bits); a config with ``segments``
    and ``summary.split`` fixed removes that. The parameter gradients (dA, dD, d bias, fixed
    dB/dC) are sums over the batch: fixed-order, but over the neighbours too. Its memory and
    traffic: ``gradients``; ``backward.tree_fan``: tiles one node of the fixed-order sum adds."""

    chunk: int
    forward: Forward
    backward: Backward
    segments: int | None = None
    summary: Summary = None
    deterministic: bool = False

    def __post_init__(self):
        if not isinstance(self.backward.tree_fan, int) or self.backward.tree_fan < 2:
            raise ValueError(f"backward.tree_fan must be an int ≥ 2, got "
                             f"{self.backward.tree_fan!r}")
        rows = self.backward.tree_rows
        if not isinstance(rows, int) or rows < 0 or (rows and (
                rows & (rows - 1) or self.backward.block_d % rows)):
            raise ValueError(f"backward.tree_rows must be 0 or a power of two dividing "
                             f"backward.block_d {self.backward.block_d}, got {rows!r}")
        if rows and self.backward.layout != "state-outer":
            raise ValueError(f"backward.tree_rows = {rows}: only the 'state-outer' backward "
                             f"stages its partials, not {self.backward.layout!r}")
        tb = self.backward.tree_block
        if not isinstance(tb, int) or tb < 0 or tb & (tb - 1):
            raise ValueError(f"backward.tree_block must be 0 or a power of two, got {tb!r}")
        for name in ("tree_after", "reg_carry"):
            if not isinstance(getattr(self.backward, name), bool):
                raise TypeError(f"backward.{name} must be True or False, got "
                                f"{getattr(self.backward, name)!r}")
        if self.backward.reg_carry and self.backward.layout != "state-outer":
            raise ValueError(f"backward.reg_carry: only the 'state-outer' backward carries its "
                             f"adjoint in registers, not {self.backward.layout!r}")
        if not isinstance(self.deterministic, bool):
            raise TypeError(f"deterministic must be True or False, got {self.deterministic!r}")
        if self.forward.layout not in FORWARD_LAYOUTS:
            raise ValueError(f"forward.layout must be one of {FORWARD_LAYOUTS}, "
                             f"got {self.forward.layout!r}")
        if self.backward.layout not in LAYOUTS:
            raise ValueError(f"backward.layout must be one of {LAYOUTS}, "
                             f"got {self.backward.layout!r}")
        if self.chunk % self.forward.block_l:
            raise ValueError(f"chunk {self.chunk} must be a multiple of forward.block_l "
                             f"{self.forward.block_l} (states are stored at block ends)")
        if self.backward.layout == "sub-block" and self.chunk % self.backward.block_l:
            raise ValueError(f"chunk {self.chunk} must be a multiple of backward.block_l "
                             f"{self.backward.block_l}")
        if self.segments is not None and (not isinstance(self.segments, int)
                                          or self.segments < 1):
            raise ValueError(f"segments must be None or an int ≥ 1, got {self.segments!r}")
        if self.summary is None:
            object.__setattr__(self, "summary", SUMMARY)

    @property
    def segment_unit(self):
        """Segments are whole chunks and whole summary tiles: a multiple of both."""
        return math.lcm(self.chunk, self.summary.block_l)

    def check(self, n):
        """ValueError if this configuration cannot run n states."""
        if self.backward.layout == "state-outer" and n > self.chunk:
            raise ValueError(f"backward layout 'state-outer' keeps the row sums in the "
                             f"{self.chunk} columns of a chunk: needs n ≤ {self.chunk}, "
                             f"got n = {n}")


def chunk_size(n):
    """Steps between stored states: 64 at n ≤ 16 (fwd+bwd peak at the CUDA kernel's), else 128.

    The stored states take b·d·n·⌈l/q⌉·4 bytes; the state-outer backward needs n ≤ q."""
    return 64 if n <= UNROLL_MAX else 128


# --- the H200 defaults (the measurements behind each: bench/NOTES_selective_scan.md) ----------
# forward, n ≤ 16: a scan along time, unmasked `while` over time blocks, states unrolled; the
# next tile's inputs hinted into L1 and Δ's softplus on MUFU (both measured faster at b1–b4, n16
# and n64, in every kernel of the cut: docs/results/*_m1_b1_*.json)
FORWARD = Forward(block_d=64, block_l=32, num_warps=4, per_sm=2,  # 255 registers × 128 threads
                  l1_prefetch=True, fast_softplus=True)
# forward, n > 16: the same tile with a run-time state loop (unrolled spills at n64), 8 warps
FORWARD_LARGE_N = Forward(block_d=64, block_l=32, num_warps=8, unroll=False, per_sm=2)
# forward, the recurrent kernel (one channel a thread, every state in registers): the default
# only where the H200 measured it faster than the scan (n = 64). Its speed depends on each
# step's B/C loads being issued well before their use: `prefetch` loads them a step ahead in
# the source (without it, ptxas hoists them in some builds and not in others; NOTES).
FORWARD_RECURRENT = Forward(block_d=32, block_l=8, num_warps=1, layout="recurrent", per_sm=8,
                            prefetch=True, l1_prefetch=True, fast_softplus=True)
RECURRENT_DEFAULT_N = (64,)
# backward, n ≤ 16: state-outer, two channels a program; 96 registers buy occupancy (spills)
BACKWARD = Backward("state-outer", block_d=2, num_warps=1, maxnreg=96, per_sm=21)
# backward, 16 < n ≤ chunk: state-outer, one channel a program (mamba_ssm's atomic count)
BACKWARD_LARGE_N = Backward("state-outer", block_d=1, num_warps=1, maxnreg=80, per_sm=25)
# backward, n > chunk: state-outer cannot hold the row sums; the sub-block kernel
BACKWARD_RUNTIME_LOOP = Backward("sub-block", block_d=32, block_l=8, num_warps=1, even=False,
                                 per_sm=9)
# backward, n ≤ 16, deterministic mode: 32 channels (2 a warp, as the default's tile) in a program
# of 16 warps; the adjoint carried between chunks in registers (``reg_carry``), each warp's channel
# sums staged and stored once a chunk, and the tiles' partials added in tile order by a second
# kernel after the backward (``tree_after``): no counter, fence or last arriver in the chunk loop
# (the floor and the expectation: ``fused.gradients``; chosen by ``bench.gpu.det_sweep`` on the
# H200, the candidate whose slower shape was fastest, then checked over 10 runs by
# ``bench.gpu.determinism``: docs/results/*_det_sweep_*.json, *_determinism_*.json)
DETERMINISTIC_BACKWARD = Backward("state-outer", block_d=32, num_warps=16, maxnreg=128, per_sm=1,
                                  tree_rows=16, tree_fan=16, tree_after=True, reg_carry=True)
# the summaries of a cut sequence: the recurrent layout, one warp of 32 channels, 8 steps a tile,
# the next tile's B rows hinted into L1, the softplus on MUFU (as the forward's)
SUMMARY = Summary(block_d=32, block_l=8, num_warps=1, l1_prefetch=True, fast_softplus=True)
# the interpreter (CPU): small tiles, masks kept in the backward
CPU_FORWARD = Forward(block_d=4, block_l=8, num_warps=1)
CPU_BACKWARD = Backward("sub-block", block_d=4, block_l=8, num_warps=1, even=False)
CPU_SUMMARY = Summary(block_d=4, block_l=8, num_warps=1)


def default_config(n, device, l=None, deterministic=False):
    """The default `Config` for n states on ``device`` (a CPU device: the interpreter's tiles),
    sequences of l steps (None: any); ``deterministic``: the deterministic mode's (its own
    backward tile at n ≤ 16)."""
    q = chunk_size(n)
    if torch.device(device).type == "cpu":
        return Config(q, dataclasses.replace(CPU_FORWARD, unroll=n <= UNROLL_MAX), CPU_BACKWARD,
                      summary=CPU_SUMMARY, deterministic=deterministic)
    if n <= UNROLL_MAX:
        return Config(q, FORWARD, DETERMINISTIC_BACKWARD if deterministic else BACKWARD,
                      deterministic=deterministic)
    # (l % 16: the measured build; without it the u/Δ/z rows are not known 16-byte aligned and
    # the recurrent build converts layouts every step)
    recurrent = n in RECURRENT_DEFAULT_N and (l is None or l % 16 == 0)
    fwd = FORWARD_RECURRENT if recurrent else FORWARD_LARGE_N
    return Config(q, fwd, BACKWARD_LARGE_N if n <= q else BACKWARD_RUNTIME_LOOP,
                  deterministic=deterministic)


# --- cutting a sequence into segments (chapter 09's last step) ----------------------------------
def segment_plan(segments, programs, per_sm, l, unit, sms):
    """(S, steps a segment): how a sequence of l steps is cut for a launch of ``programs``
    programs a segment on ``sms`` SMs. ``segments`` None: ⌊slots / programs⌋ segments (slots: SMs ×
    ``per_sm``), each at least MIN_SEGMENT steps — one while the programs fill at least half
    the GPU; an int: that many. A segment is a whole number of ``unit`` steps
    (`Config.segment_unit`); the last may be shorter."""
    units = -(-l // unit)
    if segments is None:  # (a cut pays for the summaries: only where it at least doubles the
        # programs in flight)
        slots = sms * per_sm
        segments = max(1, min(slots // max(programs, 1), l // MIN_SEGMENT))
    seg_len = -(-units // min(segments, units)) * unit
    return -(-l // seg_len), seg_len


def summary_split(S, seg_len, programs, summary, sms):
    """k: how many summaries each of the S − 1 summarised segments is cut into, so that the
    summary launch ((S − 1)·k × ``programs`` one-warp programs) fills the GPU's slots too.
    A power of two; seg_len / k a whole number of summary tiles and ≥ MIN_SEGMENT / 8 steps."""
    if summary.split is not None:
        if S > 1 and seg_len % (summary.split * summary.block_l):
            raise ValueError(f"summary.split = {summary.split} must cut a segment of {seg_len} "
                             f"steps into whole tiles of {summary.block_l}")
        return summary.split
    slots = sms * summary.per_sm
    if S < 2 or programs * (S - 1) >= slots:
        return 1
    want, k = -(-slots // (programs * (S - 1))), 1
    while (2 * k <= want and seg_len % (2 * k * summary.block_l) == 0
           and seg_len // (2 * k) >= MIN_SEGMENT // 8):
        k *= 2
    return k


# --- named variants the GPU scripts time side by side (outcomes: NOTES) ------------------------
FORWARD_VARIANTS = {  # n ≤ 16
    "masked 64x32w4": dataclasses.replace(FORWARD, even=False),
    "unmasked 64x32w4": FORWARD,  # the default
    "pipelined 64x32w4": dataclasses.replace(FORWARD, stages=2),
    "pipelined 64x32w8 r128": dataclasses.replace(FORWARD, stages=2, num_warps=8, maxnreg=128),
    "pipelined 32x32w4 r128": dataclasses.replace(FORWARD, stages=2, block_d=32, maxnreg=128),
    "recurrent 32x8w1": dataclasses.replace(FORWARD_RECURRENT, prefetch=False),
    "recurrent 32x8w1 prefetch": FORWARD_RECURRENT,
}
FORWARD_VARIANTS_LARGE_N = {  # 16 < n ≤ 64
    "scan 64x32w8 run-time loop": FORWARD_LARGE_N,  # the default but at n = 64
    "recurrent 32x8w1": dataclasses.replace(FORWARD_RECURRENT, prefetch=False),
    "recurrent 16x8w1": dataclasses.replace(FORWARD_RECURRENT, block_d=16, prefetch=False),
    "recurrent 32x8w1 prefetch": FORWARD_RECURRENT,  # the default at n = 64
}
_SUB = Backward("sub-block", block_d=32, block_l=16, num_warps=2, even=False)
_SO = Backward("state-outer", block_d=2, num_warps=1, rev_loads=True)
BACKWARD_VARIANTS = {  # n ≤ 16
    "runtime-loop 32x16w2": _SUB,
    "unmasked 32x16w2": dataclasses.replace(_SUB, even=True),
    "pipelined 32x16w2": dataclasses.replace(_SUB, stages=2),
    "unmasked pipelined 32x16w2": dataclasses.replace(_SUB, even=True, stages=2),
    "unmasked pipelined 32x16w4": dataclasses.replace(_SUB, even=True, stages=2, num_warps=4),
    "state-outer 2x64w1": _SO,
    "state-outer 8x64w4": dataclasses.replace(_SO, block_d=8, num_warps=4),
    "state-outer 2x64w1 flip3": dataclasses.replace(_SO, rev_loads=False),
}
BACKWARD_VARIANTS_LARGE_N = {  # 16 < n ≤ chunk
    "state-outer 4x128w4": dataclasses.replace(_SO, block_d=4, num_warps=4),
    "state-outer 1x128w1": dataclasses.replace(_SO, block_d=1),
}


# --- turning a launch into kernel switches ------------------------------------------------
def even_flags(even, l, dpg, block_l, block_d):
    """(EVEN_L, EVEN_D): masks dropped along time / channels where the tile divides the tensor
    (``dpg`` channels per group) and the launch allows it (``even``)."""
    return even and l % block_l == 0, even and dpg % block_d == 0


def _numpy_breaks_range():
    """NumPy ≥ 2.4: Triton 3.6's interpreter cannot run a `for` with a run-time bound
    (triton-lang/triton#9171)."""
    import numpy as np
    return tuple(int(v) for v in np.__version__.split(".")[:2]) >= (2, 4)


def stages(value, interpreted):
    """The STAGES switch: 0 (the `while` body) in the interpreter where NumPy breaks `for`."""
    return 0 if interpreted and value and _numpy_breaks_range() else value


def compile_options(maxnreg, interpreted):
    """Compile options of a launch: ``maxnreg`` if set. The interpreter ignores it, and the sm_90
    build check of what it launched reads it (``interpreted`` is kept for the launchers' calls)."""
    return {} if maxnreg is None else dict(maxnreg=maxnreg)
