"""How a GPU runs a kernel: SMs, warps, the resources a program holds, and occupancy (chapter 05).

A kernel launch is a grid of *programs* (CUDA: thread blocks). Each program runs on one streaming
multiprocessor (SM) as ``num_warps`` warps of 32 threads; a warp issues one instruction for its
32 lanes at a time (SIMT). An SM keeps several programs *resident* at once and switches between
their warps every cycle, which is how it hides the latency of memory loads. How many fit is
limited by four resources of the SM; the smallest limit wins:

    warps:      ⌊W_SM / w⌋                            W_SM resident warps per SM, w = num_warps
    blocks:     P_SM                                  resident programs per SM
    registers:  ⌊4 · ⌊(R_SM / 4) / r_warp⌋ / w⌋       r_warp = ⌈32 · r / 256⌉ · 256
    shared:     ⌊S_SM / ⌈s + s_res, 128⌉⌉             s bytes per program, s_res reserved

    resident warps = w · min(...),        occupancy = resident warps / W_SM

Registers are allocated per warp in units of 256 and each of the SM's four scheduler partitions
owns a quarter of the register file, so a warp must fit inside one partition: at 96 registers a
thread a 1-warp program fits 20 times, not ⌊65536 / 3072⌋ = 21 (Nsight Compute agrees on every
kernel of ``docs/profiles``; ``tests/test_machine.py`` checks all of them).

Occupancy is a means, not the goal: a warp waiting on memory issues nothing, and other warps (or
independent instructions of the same warp) must fill the gap. Little's law says how much work
must be in flight: bytes in flight = bandwidth × latency.

    GPU, H200, A100, RTX4090, GPUS     per-SM limits of a few GPUs (tuning guides, CUDA guide)
    occupancy(gpu, num_warps, registers, shared_bytes)
    max_registers(gpu, warps)          the most registers a thread may use for ``warps`` resident
    sectors(addresses, ...)            32-byte memory sectors a warp's load touches (coalescing)
    bank_conflict(addresses, ...)      the n-way shared-memory bank conflict of a warp's access
    round_to_tf32(x)                   what tensor cores see of an fp32 operand of ``tl.dot``
                                       (its low 13 mantissa bits dropped)
"""

from dataclasses import dataclass

import torch

WARP = 32  # threads per warp on every NVIDIA GPU
PARTITIONS = 4  # warp schedulers (SM sub-partitions) per SM since Volta
REGISTER_UNIT = 256  # registers are allocated per warp in multiples of 256
SHARED_UNIT = 128  # shared memory is allocated per program in multiples of 128 bytes


@dataclass(frozen=True)
class GPU:
    """The per-SM limits that decide occupancy, and where they come from.

    ``shared_per_sm`` is the largest shared-memory carve-out of the unified L1/shared array;
    ``shared_per_block`` the most one program may ask for; ``shared_reserved`` what the driver
    keeps per program for itself (1 KB on compute capability 8.x and 9.0).
    """

    name: str
    arch: tuple
    sms: int
    warps_per_sm: int
    blocks_per_sm: int
    shared_per_sm: int
    shared_per_block: int
    registers_per_sm: int = 65536
    max_registers: int = 255
    shared_reserved: int = 1024
    source: str = ""


_GUIDE = "CUDA C++ Programming Guide, technical specifications per compute capability"
H200 = GPU("NVIDIA H200 (sm_90)", (9, 0), sms=132, warps_per_sm=64, blocks_per_sm=32,
           shared_per_sm=228 * 1024, shared_per_block=227 * 1024,
           source=f"Hopper tuning guide (docs.nvidia.com/cuda/hopper-tuning-guide); {_GUIDE}; "
                  "132 SMs as PyTorch reports (multi_processor_count)")
A100 = GPU("NVIDIA A100 (sm_80)", (8, 0), sms=108, warps_per_sm=64, blocks_per_sm=32,
           shared_per_sm=164 * 1024, shared_per_block=163 * 1024,
           source=f"Ampere tuning guide (docs.nvidia.com/cuda/ampere-tuning-guide); {_GUIDE}")
RTX4090 = GPU("NVIDIA RTX 4090 (sm_89)", (8, 9), sms=128, warps_per_sm=48, blocks_per_sm=24,
              shared_per_sm=100 * 1024, shared_per_block=99 * 1024,
              source=f"Ada tuning guide (docs.nvidia.com/cuda/ada-tuning-guide); {_GUIDE}")
GPUS = {g.name: g for g in (H200, A100, RTX4090)}


def _round_up(x, unit):
    return -(-x // unit) * unit


def _check_launch(gpu, num_warps, registers, shared_bytes):
    if not isinstance(gpu, GPU):
        raise TypeError(f"gpu must be a mambalearn.machine.GPU, got {type(gpu).__name__}")
    for name, v in (("num_warps", num_warps), ("registers", registers),
                    ("shared_bytes", shared_bytes)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if not 1 <= num_warps <= 1024 // WARP:
        raise ValueError(f"num_warps must be in 1..32 (at most 1024 threads), got {num_warps}")
    if not 1 <= registers <= gpu.max_registers:
        raise ValueError(f"registers must be in 1..{gpu.max_registers} per thread, got {registers}")
    if not 0 <= shared_bytes <= gpu.shared_per_block:
        raise ValueError(f"shared_bytes must be in 0..{gpu.shared_per_block} on {gpu.name} "
                         f"(a program cannot launch with more), got {shared_bytes}")


def occupancy(gpu, num_warps, registers, shared_bytes=0):
    """Resident programs and warps per SM, and the resource that limits them.

        blocks = min(⌊W_SM / w⌋, P_SM, ⌊4·⌊(R_SM/4) / ⌈32 r, 256⌉⌋ / w⌋, ⌊S_SM / ⌈s + s_res, 128⌉⌋)

    Shapes: scalars. ``num_warps`` w (Triton's ``num_warps``), ``registers`` r per thread (what
    ptxas reports, ``REG`` of ``cuobjdump -res-usage``), ``shared_bytes`` s per program (Triton's
    ``kernel.metadata.shared``). Returns dict(blocks, warps, occupancy (0..1), limits: the block
    count each resource allows, limited_by: the sorted names of the resources that reach the
    minimum). Matches Nsight Compute's ``launch__occupancy_limit_*`` and theoretical occupancy.
    """
    _check_launch(gpu, num_warps, registers, shared_bytes)
    regs_per_warp = _round_up(registers * WARP, REGISTER_UNIT)
    warps_per_partition = gpu.registers_per_sm // PARTITIONS // regs_per_warp
    limits = {
        "warps": gpu.warps_per_sm // num_warps,
        "blocks": gpu.blocks_per_sm,
        "registers": PARTITIONS * warps_per_partition // num_warps,
        # at least one 128-byte unit: a program that needs none is never limited by shared memory
        "shared": gpu.shared_per_sm // _round_up(max(shared_bytes + gpu.shared_reserved, 1),
                                                 SHARED_UNIT),
    }
    blocks = min(limits.values())
    return {"blocks": blocks, "warps": blocks * num_warps,
            "occupancy": blocks * num_warps / gpu.warps_per_sm, "limits": limits,
            "limited_by": sorted(k for k, v in limits.items() if v == blocks)}


def max_registers(gpu, warps):
    """The most registers per thread that still let ``warps`` warps be resident on one SM.

        r_max = ⌊ ⌊(R_SM / 4) / ⌈warps / 4⌉⌋_256 / 32 ⌋,  capped at the 255 a thread may address

    (⌊·⌋_256: rounded down to a multiple of 256). What Triton's ``maxnreg`` is chosen from:
    96 registers keep 20 warps of 64 resident on an H200, 128 keep 16, 255 keep 8.
    """
    if not isinstance(warps, int) or not 1 <= warps <= gpu.warps_per_sm:
        raise ValueError(f"warps must be an int in 1..{gpu.warps_per_sm}, got {warps!r}")
    per_warp = gpu.registers_per_sm // PARTITIONS // -(-warps // PARTITIONS)
    return min(gpu.max_registers, per_warp // REGISTER_UNIT * REGISTER_UNIT // WARP)


def sectors(addresses, sector_bytes=32):
    """How many 32-byte sectors of memory one warp-wide load touches (what DRAM/L2 really move).

        sectors = |{ ⌊a / 32⌋ : a in the warp's byte addresses }|,  efficiency = useful / moved

    Shapes: ``addresses`` (32,) byte addresses, one per lane (a tensor or a list of ints).
    32 lanes reading consecutive fp32 touch 4 sectors (128 B, coalesced); with a stride of 32
    elements every lane touches its own sector: 32 sectors for the same 128 useful bytes.
    """
    a = torch.as_tensor(addresses, dtype=torch.int64)
    if a.ndim != 1 or a.numel() == 0:
        raise ValueError(f"addresses must be a non-empty 1-D list, got shape {tuple(a.shape)}")
    return int(torch.unique(a // sector_bytes).numel())


def bank_conflict(addresses, banks=32, word_bytes=4):
    """The n-way bank conflict of one warp's shared-memory access (1 = conflict free).

        bank(a) = ⌊a / 4⌋ mod 32;   ways = max over banks of |{distinct 4-byte words in it}|

    Shapes: ``addresses`` (32,) byte addresses into shared memory. Lanes reading the *same* word
    are served by one broadcast, so only distinct words in one bank serialize. A column of a
    32 × 32 fp32 tile (stride 32 words) is a 32-way conflict; padding rows to 33 words removes it.
    """
    a = torch.as_tensor(addresses, dtype=torch.int64)
    if a.ndim != 1 or a.numel() == 0:
        raise ValueError(f"addresses must be a non-empty 1-D list, got shape {tuple(a.shape)}")
    words = torch.unique(a // word_bytes)  # distinct words: equal ones are a broadcast
    return int(torch.bincount(words % banks, minlength=banks).max())


def round_to_tf32(x):
    """x as the tensor cores read an fp32 operand of ``tl.dot``: its mantissa cut to tf32's 10 bits.

        tf32(x) = x with the low 13 of its 23 mantissa bits set to 0 (round toward zero):
                  |tf32(x)| ≤ |x|, relative error < 2⁻¹⁰ ≈ 9.8e-4 (per operand; < 2⁻⁹ per product)

    Shapes: any float32 tensor → the same shape, float32. On Ampere and Hopper the tensor cores
    behind ``tl.dot`` (``input_precision="tf32"``, Triton's default for fp32) drop those bits,
    multiply the cut values exactly and accumulate in fp32. Measured on an H200 (x · I through
    ``tl.dot``): 1 + 0.75·2⁻¹⁰, 1 + 0.625·2⁻¹⁰ and 1 + 0.501·2⁻¹⁰ all come back as 1, where rounding
    to nearest would give 1 + 2⁻¹⁰ (chapter 05 prints the run, ``results.load("tf32")``).
    """
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError("x must be a float32 tensor")
    bits = x.contiguous().view(torch.int32)
    drop = 13  # fp32 has 23 mantissa bits, tf32 keeps 10
    cut = (bits >> drop) << drop  # sign and exponent kept: the magnitude rounds toward zero
    finite = torch.isfinite(x)
    return torch.where(finite, cut.view(torch.float32), x)
