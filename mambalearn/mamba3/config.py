"""Launch settings of the Mamba-3 SISO kernels (chapter 15), as data passed in.

A `Config` holds every setting of one ``mamba3_siso_combined`` call: the state columns a kernel
holds at once, the warps of each kernel (for chunks of 64 steps; ``common.warps`` doubles them
per doubling of the chunk beyond), the state passing's rows per program and pipeline depth, and
the dq/dk kernel's heads per program. `default_config(shape, device)` returns the default for a
shape; ``mamba3_siso_combined(..., config=)`` takes any other (``Config.replace`` changes fields).
The caller's ``chunk_size`` is the one every kernel runs at. How each default was chosen (sm_90
register counts, the H200's timings): ``bench/NOTES_mamba3.md``.
"""

import dataclasses
from dataclasses import dataclass

from mambalearn.triton.config import LaunchConfig
from mambalearn.triton.config import resolve as _resolve


@dataclass(frozen=True)
class Config(LaunchConfig):
    """Every launch setting of the SISO forward and backward (module doc)."""

    col_block: int = 32  # state columns (n) a kernel holds at once: BN, a power of two ≥ 16
    chunk_state_col_block: int = 64  # the same for the chunk-state kernel (which holds less else)
    chunk_state_warps: int = 4  # chunk states (forward) and state gradients (backward)
    state_rows: int = 8  # rows of the (p × n) state per state-passing program
    state_warps: int = 2
    state_stages: int = 3  # the state passing's loads this many chunks ahead (its pipeline)
    output_warps: int = 4  # the forward's outputs
    output_maxnreg: int | None = None  # its registers per thread (None: the compiler's choice)
    output_col_block: int | None = None  # its state columns at once (None: ``col_block``)
    output_unroll: int = 1  # 1: its column blocks unrolled; 2: a loop over them (fewer live)
    bwd_v_warps: int = 4  # dv and the per-step weights' gradients
    bwd_v_unroll: int = 1  # 1: its column blocks unrolled; 2: a loop over them
    bwd_v_col_block: int | None = None  # its state columns at once (None: ``col_block``)
    bwd_v_maxnreg: int | None = None  # its registers per thread (None: the compiler's choice)
    bwd_qk_warps: int = 4  # dq and dk (and dθ), one column block per program
    bwd_qk_stages: int = 2  # its loop over heads prefetches the next head's tiles
    bwd_qk_maxnreg: int | None = None  # its registers per thread (None: the compiler's choice)
    heads_per_program: int = 32  # heads one dq/dk program sums over (GQA), at most,
    min_programs: int = 1024  # … as long as this many dq/dk programs are left
    steps_warps: int = 4  # dAngles, dDT, dTrap, dADT
    steps_chunks: int = 16  # later chunks' angle totals the steps kernel sums at once
    # the forward: 3 launches (chunk states, state passing, outputs), 2 (the first two in one
    # walk over chunks, ``state_passing._state_walk_kernel``: S^L never leaves the registers) or
    # 1 (below)
    forward_launches: int = 3
    walk_rows: int = 64  # the walk's state tile: rows (p) …
    walk_col_block: int = 32  # … and columns (n) a program owns
    walk_warps: int = 4
    walk_stages: int = 2  # its loads this many chunks ahead
    # 1: the whole forward in one walk (``walk._walk_kernel``): a program per P_BLK channels of a
    # (batch, head) walks the chunks with its (P_BLK × n) float32 state in a scratch of its own
    walk1_p_block: int = 16  # P_BLK, a power of two ≥ 16
    walk1_warps: int = 4
    walk1_col_block: int = 32  # the state columns (n) it works on at once (a loop over them)
    walk1_maxnreg: int | None = None  # its registers per thread (None: the compiler's choice)
    walk1_reload: int = 1  # 1: its step values formed again after that loop (fewer registers)
    # the backward's state gradients and their passing: 2 launches, or 1 reverse walk
    # (``state_passing._state_walk_back_kernel``, the walk settings above)
    state_grad_launches: int = 2

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "walk1_reload" and v in (0, 1):
                continue
            if v is None and f.name in ("output_maxnreg", "output_col_block", "bwd_v_col_block",
                                        "bwd_v_maxnreg", "bwd_qk_maxnreg", "walk1_maxnreg"):
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"config.{f.name} must be an int ≥ 1, got {v!r}")
        if self.forward_launches not in (1, 2, 3):
            raise ValueError("config.forward_launches must be 1, 2 or 3, got "
                             f"{self.forward_launches}")
        for name in ("walk1_p_block", "walk1_col_block"):  # tl.dot's least tile
            if getattr(self, name) < 16:
                raise ValueError(f"config.{name} must be a power of two ≥ 16, got "
                                 f"{getattr(self, name)}")
        for name in ("output_unroll", "bwd_v_unroll"):
            if getattr(self, name) not in (1, 2):
                raise ValueError(f"config.{name} must be 1 or 2, got {getattr(self, name)}")
        if self.state_grad_launches not in (1, 2):
            raise ValueError("config.state_grad_launches must be 1 or 2, got "
                             f"{self.state_grad_launches}")
        for name in ("col_block", "chunk_state_col_block", "state_rows", "steps_chunks",
                     "walk_rows", "walk_col_block", "walk1_p_block", "walk1_col_block",
                     "output_col_block", "bwd_v_col_block"):
            v = getattr(self, name)
            if v is not None and v & (v - 1):
                raise ValueError(f"config.{name} must be a power of two, got {v}")


DEFAULT = Config()


def default_config(shape, device):
    """The default `Config` for ``shape`` = (b, l, h, g, n, p, na, chunk) on ``device``: the
    same settings at every shape today (the measurements: bench/NOTES_mamba3.md)."""
    return DEFAULT


def resolve(config, shape, device):
    """``config`` if it is a `Config`, the default if None, else a TypeError."""
    return _resolve(config, Config, lambda: default_config(shape, device))


MIMO_CHOICES = {"rank_one": ("siso", "mimo"), "det_sum": ("heads", "tree"),  # str fields
                "qk_live": ("float32", "dot")}


@dataclass(frozen=True)
class MimoConfig(LaunchConfig):
    """Launch settings of the MIMO prefill (``mamba3_mimo_combined(..., config=)``): warps per
    (q·r)-row tile of 64 rows, scaled with it, and pipeline stages up to 64 rows (one beyond).

    Not tuned on a GPU yet: the backward holds about twenty (64 × 64|128) float32 tiles, which
    spill at any warp count below 16; 8 warps is a first guess for both. The stages are the most
    whose buffers fit one program's shared memory on an H200 (227 KB), read from the kernels built
    for sm_90 without a GPU (p 64, n 128, bf16; tests/test_mamba3_mimo_fits.py): at 64 rows the
    forward needs 48 / 185 / 322 KB at 1 / 2 / 3 stages (Triton's default is 3), the backward
    104 / 241 / 394 KB; at 128 rows the forward 81 / 355 KB at 1 / 2, the backward 192 KB at 1;
    at 256 rows the backward 368 KB at 1."""

    forward_warps: int = 8
    backward_warps: int = 8
    forward_stages: int = 2
    backward_stages: int = 1
    # channels (of p) one program holds, a power of two ≥ 16: the kernels' program axis 2 runs
    # over ⌈p / block⌉ blocks (the default covers p ≤ 256 in one program)
    forward_p_block: int = 256
    backward_p_block: int = 256
    tree_fan: int = 8  # deterministic mode, ``det_sum="tree"``: heads one node of the sum adds
    # rank 1 is SISO's recurrence (``mimo_api``): "siso" runs it on the SISO kernels, the
    # per-rank weights folded into V, Z and the output; "mimo" on the MIMO kernels (the default:
    # the "siso" route's dAngles failed its H200 check at a length not a multiple of the chunk)
    rank_one: str = "mimo"
    # deterministic mode's dQ/dK sum over a group's heads: "heads" stores each head's rows and
    # a separate kernel adds them in head order (``mimo_backward.sum_heads_kernel``); "tree":
    # the last head of a chunk adds them inside the backward (``triton.deterministic``)
    det_sum: str = "heads"
    # the backward's rotated q, k of a chunk: "float32" held so through the chunk's work; "dot"
    # converted to the products' dtype once turned (half the registers in bf16), the angles and
    # q, k loaded and turned again for dθ at the end (the same bits: only what a thread holds)
    qk_live: str = "float32"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in MIMO_CHOICES:
                if v not in MIMO_CHOICES[f.name]:
                    raise ValueError(f"config.{f.name} must be one of "
                                     f"{', '.join(map(repr, MIMO_CHOICES[f.name]))}, got {v!r}")
            elif not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"config.{f.name} must be an int ≥ 1, got {v!r}")
        if self.tree_fan < 2:
            raise ValueError(f"config.tree_fan must be ≥ 2, got {self.tree_fan}")
        for name in ("forward_p_block", "backward_p_block"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"config.{name} must be a power of two ≥ 16, got {v}")


MIMO_DEFAULT = MimoConfig()

