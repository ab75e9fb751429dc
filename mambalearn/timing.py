"""Timers the chapters and the benchmarks share.

    time_ms(fn)  median milliseconds: ``triton.testing.do_bench`` (CUDA events) on a GPU, a wall
                 clock on a CPU (where it times Triton's interpreter, not a kernel)
    peak_gb(fn)  peak GPU memory of ``fn()`` beyond what was allocated before it (None on a CPU)
"""

import time

import torch


def time_ms(fn, warmup=25, rep=100):
    """Median milliseconds of ``fn()``; GPU: CUDA events via ``triton.testing.do_bench``."""
    if torch.cuda.is_available():
        import triton.testing

        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    fn()  # compile / warm caches
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[1]


def peak_gb(fn):
    """Peak GPU memory of ``fn()`` beyond what was allocated before it, in GB (None on CPU)."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 1e9
