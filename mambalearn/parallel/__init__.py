"""Chapter 14: the scan across GPUs — context parallelism on ``torch.distributed``.

The sequence is split into R contiguous shards, one per rank (a process; on GPUs one per GPU).
Each shard is one big chunk of chapter 06: its summary — (total decay, final state from a zero
start) — is one ⊗ element of chapter 03, and the states entering the ranks are a ⊗-scan of those.

    launch      spawn(fn, world_size): real process groups for notebooks and tests
    summary     rank_scan, rank_scan_backward, fix_up: the ⊗ math across ranks, no communication
    wire        the collectives (with timeouts) and the checks that keep ranks in step
    exchange    the summary scan over the wire: ring, all-gather or the log-depth scan
                (Hillis–Steele over point-to-point sends), forward and backward
    reshard     tokens ↔ channels (all-to-all), for the all-to-all algorithm
    selective   selective_scan_cp: Mamba-1 (chapter 09's signature), four algorithms
    ssd         mamba_chunk_scan_combined_cp: Mamba-2 (chapter 10's signature)
    block       the causal-conv halo and the chapter 13 model run context parallel
    cost        the α–β cost model of the four algorithms
"""

import importlib

_WHERE = {
    "spawn": "launch", "RankError": "launch", "NCCL_ENV": "launch",
    "rank_scan": "summary", "rank_scan_backward": "summary", "fix_up": "summary",
    "ALGORITHMS": "wire",
    "selective_scan_cp": "selective",
    "mamba_chunk_scan_combined_cp": "ssd",
    "conv_halo": "block", "ContextParallelLM": "block", "all_reduce_grads": "block",
}

__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
