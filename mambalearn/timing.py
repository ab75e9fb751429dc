"""Timers the chapters and the benchmarks share.

    time_ms(fn)  median milliseconds: ``triton.testing.do_bench`` (CUDA events) on a GPU, a wall
                 clock on a CPU (where it times Triton's interpreter, not a kernel)
    peak_gb(fn)  peak GPU memory of ``fn()`` beyond what was allocated before it (None on a CPU)
    compare(fns) several callables timed side by side, the way a ratio is measured here: each
                 warmed for ≥ 1 s, then ≥ 5 interleaved rounds (one median per callable a round);
                 a ratio is the median of the per-round ratios, with its spread

One short ``do_bench`` per kernel is not a measurement of a ratio: clocks, caches and the other
kernels of the process move between calls (one fused SSD kernel read 0.43–0.81 ms across
processes that way, and 0.4365 ± 0.001 interleaved after a warm-up).
"""

import statistics
import time
from dataclasses import dataclass

import torch


def time_ms(fn, warmup=25, rep=100, cpu_calls=3):
    """Median milliseconds of ``fn()``; GPU: CUDA events via ``triton.testing.do_bench``; CPU: the
    median of ``cpu_calls`` calls after a warm one. ``cpu_calls=1``: one call, nothing warmed (a
    smoke run on a CPU, where the Triton kernels run in the interpreter and their time says
    nothing about them)."""
    if torch.cuda.is_available():
        import triton.testing

        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    if cpu_calls < 1:
        raise ValueError(f"cpu_calls must be ≥ 1, got {cpu_calls}")
    if cpu_calls > 1:
        fn()  # compile / warm caches
    times = []
    for _ in range(cpu_calls):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


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


@dataclass(frozen=True)
class Compared:
    """The result of `compare`: each callable's median per round (ms), in the rounds' order."""

    rounds: dict  # name -> [ms of round 1, round 2, ...]

    def ms(self, name):
        """The median over the rounds of ``name``'s per-round medians."""
        return statistics.median(self.rounds[name])

    def ratio(self, name, base):
        """(median of the per-round ratios name / base, their spread (max − min) / median)."""
        r = [a / b for a, b in zip(self.rounds[name], self.rounds[base], strict=True)]
        m = statistics.median(r)
        return m, (max(r) - min(r)) / m


def _warm(fn, seconds):
    """Run ``fn`` until ``seconds`` have passed (compilation, autotuning, clocks up)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    t0 = time.perf_counter()
    fn()
    sync()
    while time.perf_counter() - t0 < seconds:
        fn()
        sync()


def compare(fns, warm_s=1.0, rounds=5, rep=100):
    """Time ``fns`` ({name: callable}) interleaved: every callable warmed for ``warm_s`` seconds,
    then ``rounds`` rounds, each timing every callable once (`time_ms`, ``rep`` ms of repeats).
    Returns a `Compared`. A peer is passed as its users call it (its own autotuning included:
    the warm-up is where that runs)."""
    if rounds < 1:
        raise ValueError(f"rounds must be ≥ 1, got {rounds}")
    for fn in fns.values():
        _warm(fn, warm_s)
    per = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            per[name].append(time_ms(fn, warmup=5, rep=rep))
    return Compared(per)
