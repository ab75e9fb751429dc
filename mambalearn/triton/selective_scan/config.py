"""Launch configurations of the tuned Mamba-1 selective scan (chapter 09), and `_launch`.

A configuration is a dict of tile and compile switches: BLOCK_D channels × BLOCK_L steps,
num_warps, and optionally STAGES, EVEN, maxnreg, REV_LOADS, LAYOUT (the backward's kernel). Here:
the autotuner's candidates (`fwd_configs`, `bwd_configs`), the measured defaults (DEFAULT_*),
the named variants the GPU script times side by side (FWD_VARIANTS, BWD_VARIANTS), the
interpreter's tiles (CPU_*), and `_launch`, which turns a configuration into a kernel launch.
Which default applies to which n (FWD_CONFIG, BWD_CONFIG) is decided in
`mambalearn.triton.selective_scan`, next to the launchers.
"""

import triton

from mambalearn import device
from mambalearn.triton.selective_scan.backward import _bwd_kernel
from mambalearn.triton.selective_scan.forward import _fwd_kernel


def _tiles(block_d, most_per_thread):
    """Candidate tiles BLOCK_D channels × BLOCK_L steps with 4…most values per thread."""
    return [dict(BLOCK_D=bd, BLOCK_L=bl, num_warps=w) for bl in (8, 16, 32) for bd in block_d
            for w in (1, 2, 4) if 4 <= bd * bl // (32 * w) <= most_per_thread]


def fwd_configs():
    """Candidate forward tiles (BLOCK_D channels × BLOCK_L steps, warps): 4–32 values a thread."""
    return _tiles((32, 64, 128), 32)


def bwd_configs():
    """Candidate backward tiles (sub-blocks of BLOCK_L steps inside a chunk)."""
    return _tiles((16, 32, 64), 16)


def _autotuned(kernel, configs, **kw):
    cfgs = [triton.Config({k: v for k, v in c.items() if k != "num_warps"},
                          num_warps=c["num_warps"]) for c in configs]
    return triton.autotune(cfgs, key=["l", "d", "dpg", "N", "CHUNK"], **kw)(kernel)


_ZEROED = ["dB_ptr", "dC_ptr", "gbuf_ptr"]
_fwd_autotuned = _autotuned(_fwd_kernel, fwd_configs())
_bwd_autotuned = _autotuned(_bwd_kernel, bwd_configs(), reset_to_zero=_ZEROED)

# Launch configuration: "auto" = autotune over the candidates (slow first call, one compile per
# candidate), or a dict. CPU (interpreter): one small tile, nothing to tune.
# Tiles: the fastest candidates of the H200 sweep of 2026-11-29 (mambalearn/bench/gpu/selective_scan.py,
# docs/BENCHMARKS.md), b8 d2048 l2048 bf16; n64 only had the run-time-loop candidates.
# Forward keys besides the tile: STAGES (> 0: pipelined `for` over time blocks), EVEN (False:
# keep every mask even where the tile divides the tensor), maxnreg (registers per thread: ≤ 128
# lets two 8-warp programs share an SM). The H200 run of the variants below (mambalearn/bench/gpu/all.sh
# final, 2026-11-29, docs/BENCHMARKS.md) at b8 d2048 n16 l2048: unmasked while-loop 0.447 ms,
# pipelined 0.483, masked 0.636, mamba_ssm CUDA 0.591. The unmasked while-loop one became the
# default once its full-size accuracy and the gpu tests ran with it on the H200 (2026-11-30).
FWD_MEASURED = dict(BLOCK_D=64, BLOCK_L=32, num_warps=4, STAGES=0, EVEN=False)
FWD_PIPELINED = dict(BLOCK_D=64, BLOCK_L=32, num_warps=4, STAGES=2)
FWD_UNMASKED = dict(FWD_MEASURED, EVEN=True)
BWD_RUNTIME_LOOP = dict(BLOCK_D=32, BLOCK_L=16, num_warps=2)  # the default until 2026-11-30
# defaults from the H200 runs of 2026-11-30 (docs/BENCHMARKS.md): the unmasked forward (0.447 ms
# vs 0.484 pipelined) and the state-outer backward with three flips (fwd+bwd 3.18 ms vs 4.98)
DEFAULT_FWD = FWD_UNMASKED
# maxnreg=96 (session 2 of 2026-11-30, mambalearn/bench/gpu/experiments.py): 96 registers and 17 spill
# loads instead of 128 and none, 21 warps per SM instead of 16: backward 2.40 ms against 2.68
DEFAULT_BWD = dict(LAYOUT="state-outer", EVEN=True, BLOCK_D=2, BLOCK_L=64, num_warps=1,
                   REV_LOADS=False, maxnreg=96)
# n > 16 (H200, b8 d2048 n64 l2048, mambalearn/bench/gpu/experiments.py, session 2 of 2026-11-30):
# forward: the same tile with the run-time state loop and 8 warps (184 registers): 2.79 ms, against
# 2.89 with 4 warps and 7.9 with the 64×8 tile of the first sweep; 2.48 ms once each state's loads
# were issued during the state before (call 5; 191 registers). Backward: the state-outer kernel
# with one channel a program (one atomic add per channel, as mamba_ssm's CUDA kernel) and 80
# registers: 8.12 ms, against 8.39 with its own 95, 10.2 with two channels, 23.4 with the run-time
# loop; peak 0.433 GB instead of 0.500 (no scratch). Past n = 128 (> the chunk) the run-time loop.
DEFAULT_FWD_LARGE_N = dict(FWD_UNMASKED, num_warps=8)
DEFAULT_BWD_LARGE_N = dict(LAYOUT="state-outer", EVEN=True, BLOCK_D=1, BLOCK_L=128, num_warps=1,
                           REV_LOADS=False, maxnreg=80)
BWD_RUNTIME_LOOP_LARGE_N = dict(BLOCK_D=32, BLOCK_L=8, num_warps=1)  # the n64 default until then
# named forward variants (n ≤ UNROLL_MAX) the GPU script times side by side
FWD_VARIANTS = {
    "measured 64x32w4": FWD_MEASURED,  # while loop, masks (the 0.949 ms kernel)
    "unmasked 64x32w4": FWD_UNMASKED,  # while loop, no masks (fastest, H200; the default)
    "pipelined 64x32w4": FWD_PIPELINED,  # + `for` with 2-stage cp.async pipelining
    "pipelined 64x32w8 r128": dict(FWD_PIPELINED, num_warps=8, maxnreg=128),  # 2× the warps
    "pipelined 32x32w4 r128": dict(FWD_PIPELINED, BLOCK_D=32, maxnreg=128),  # 2× the programs
}
# named backward variants (n ≤ UNROLL_MAX; the run-time state loop) the GPU script times side
# by side, each with the default forward. Keys besides the tile: EVEN (True: no masks where the
# tile divides l and d/g; the backward's default is False), STAGES (> 0: the state loop is a
# pipelined `tl.range`). Timed on the H200 on 2026-11-30 (docs/BENCHMARKS.md): neither helps.
# LAYOUT="state-outer": the other kernel (`_bwd_so_kernel`; BLOCK_L is the chunk, whatever the
# config says; REV_LOADS=False: three flips per state instead of one). sm_90 compile at
# b8 d2048 n16 l2048 bf16 (helper A4): 2x64w1 128 registers, no spill; 8x64w4 128 + 8 B spill.
# H200 backward: 2x64w1 3.00 ms, 8x64w4 4.44, 2x64w1 flip3 2.69 (the default; run-time loop 4.50).
STATE_OUTER = dict(LAYOUT="state-outer", EVEN=True)
BWD_VARIANTS = {
    "runtime-loop 32x16w2": BWD_RUNTIME_LOOP,  # masks, plain run-time state loop (4.5 ms, H200)
    "unmasked 32x16w2": dict(BWD_RUNTIME_LOOP, EVEN=True),
    "pipelined 32x16w2": dict(BWD_RUNTIME_LOOP, STAGES=2),
    "unmasked pipelined 32x16w2": dict(BWD_RUNTIME_LOOP, EVEN=True, STAGES=2),
    "unmasked pipelined 32x16w4": dict(BWD_RUNTIME_LOOP, EVEN=True, STAGES=2, num_warps=4),
    "state-outer 2x64w1": dict(STATE_OUTER, BLOCK_D=2, BLOCK_L=64, num_warps=1),
    "state-outer 8x64w4": dict(STATE_OUTER, BLOCK_D=8, BLOCK_L=64, num_warps=4),
    "state-outer 2x64w1 flip3": dict(STATE_OUTER, BLOCK_D=2, BLOCK_L=64, num_warps=1,
                                     REV_LOADS=False),
}
# n > 16 (chunk 128): state-outer tiles the GPU script (`--stage final`) times (sm_90, n64: 1x128w1
# 96 registers, 4x128w4 164, no spills). H200: 4x128w4 fwd+bwd 36.7 ms (first session); 1x128w1,
# one atomic add per channel as in the CUDA kernel, 11.3 ms: with maxnreg 80 it is the default
# DEFAULT_BWD_LARGE_N (the first entry is the one the script times)
BWD_VARIANTS_LARGE_N = {
    "state-outer 4x128w4": dict(STATE_OUTER, BLOCK_D=4, BLOCK_L=128, num_warps=4),
    "state-outer 1x128w1": dict(STATE_OUTER, BLOCK_D=1, BLOCK_L=128, num_warps=1),
}
CPU_FWD = dict(BLOCK_D=4, BLOCK_L=8, num_warps=1)
CPU_BWD = dict(BLOCK_D=4, BLOCK_L=8, num_warps=1)


def _numpy_breaks_range():
    """NumPy ≥ 2.4: the interpreter cannot run a `for` with a run-time bound (triton#9171)."""
    import numpy as np
    return tuple(int(v) for v in np.__version__.split(".")[:2]) >= (2, 4)


def pick(config, default, cpu_config, n):
    """The configuration that applies: ``config``, else ``default`` (``cpu_config`` in the
    interpreter); a function of n is called with n."""
    if config is None:
        config = cpu_config if device.interpreted() else default
    return config(n) if callable(config) else config


def _launch(kernel, autotuned, config, default, cpu_config, grid_fn, args, consts, even=None,
            even_default=True):
    """Launch ``kernel`` with ``config`` (None: ``default``, or ``cpu_config`` in the interpreter).

    ``even`` = (l, channels per group): the EVEN_L / EVEN_D flags are set from the tile, unless
    the config says ``EVEN=False`` (``even_default``: when the config does not say; the backward
    passes False, so its configs without ``EVEN`` keep every mask, as before the flag existed).
    """
    config = pick(config, default, cpu_config, consts["N"])
    if config == "auto":  # the autotuner's config supplies BLOCK_D, BLOCK_L and num_warps
        autotuned[lambda meta: grid_fn(meta["BLOCK_D"])](*args, **consts)
        return
    config = dict(config)  # a config may also override UNROLL
    keep_masks = not config.pop("EVEN", even_default)
    if even is not None:
        l, dpg = even
        config.setdefault("EVEN_L", not keep_masks and l % config["BLOCK_L"] == 0)
        config.setdefault("EVEN_D", not keep_masks and dpg % config["BLOCK_D"] == 0)
        if device.interpreted() and config.get("STAGES", 0) and _numpy_breaks_range():
            config["STAGES"] = 0  # same block body, `while` loop
    if device.interpreted():
        config.pop("maxnreg", None)  # a compile option the interpreter does not take
    kernel[grid_fn(config["BLOCK_D"])](*args, **{**consts, **config})
