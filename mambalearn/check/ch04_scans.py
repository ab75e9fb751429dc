"""Checks for chapter 04: ``hillis_steele_scan`` and ``blelloch_scan`` against the oracle."""

import torch

from mambalearn.check import _core
from mambalearn.scan.layout import ScanCounter
from mambalearn.scan.sequential import linear_scan_sequential

__all__ = ["hillis_steele_scan", "blelloch_scan"]
REBUILDS = {
    "hillis_steele_scan": ["mambalearn.scan.hillis_steele.hillis_steele_scan"],
    "blelloch_scan": ["mambalearn.scan.blelloch.blelloch_scan",
                      "mambalearn.scan.blelloch.BlellochScan",
                      "mambalearn.scan.blelloch.scan_states", "mambalearn.scan.blelloch.up_sweep",
                      "mambalearn.scan.blelloch.down_sweep"],
}

f64 = torch.float64


def _cases(g):
    """(description, a, b, kwargs): 1-D first, then batches, other time axes, matrices, reverse."""
    ri = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
    decay = lambda *s: torch.rand(*s, generator=g, dtype=f64) * 0.5 + 0.5
    r = lambda *s: torch.randn(*s, generator=g, dtype=f64)
    odd, other, long = ri(2, 30) * 2 + 1, ri(9, 15) * 4 + 2, ri(600, 1100)
    cases = [(f"1-D steps of length {l}", decay(l), r(l), {}) for l in (1, 2, 3, 8, odd)]
    cases += [
        (f"a, b (2, 3, l={other}), time on dim=-1", decay(2, 3, other), r(2, 3, other), {}),
        (f"a, b (2, l={odd}, 3), time on dim=1", decay(2, odd, 3), r(2, odd, 3), dict(dim=1)),
        (f"a (1, l={odd}, 1) broadcast to b (2, l, 3), dim=1", decay(1, odd, 1), r(2, odd, 3),
         dict(dim=1)),
        (f"2×2 matrices: a (2, l={odd}, 2, 2), b (2, l, 2), dim=1 (order matters)",
         r(2, odd, 2, 2) / 2, r(2, odd, 2), dict(dim=1)),
        ("3×3 matrices, time first: a (l=16, 3, 3), b (16, 3), dim=0", r(16, 3, 3) / 3,
         r(16, 3), dict(dim=0)),
        (f"reverse=True, 1-D length {odd}", decay(odd), r(odd), dict(reverse=True)),
        (f"reverse=True, 2×2 matrices, length {other}", r(other, 2, 2) / 2, r(other, 2),
         dict(dim=0, reverse=True)),
        (f"a long sequence, length {long}", decay(2, long), r(2, long), {}),
    ]
    return cases


def _rounds(name, l):
    """The ⊗ applications of each round, as the exercise asks them to be counted."""
    if name == "hillis_steele_scan":  # rounds k = 1, 2, 4, … < l: the positions t ≥ k
        return [l - 2**i for i in range(max(0, (l - 1).bit_length()))]
    P = 1 << (l - 1).bit_length()  # Blelloch: up-sweep P/2, …, 1 combines; down-sweep 1, …, P/2
    up = [P >> i for i in range(1, P.bit_length())]
    return up + up[::-1]


def _check_counts(name, counter, l, desc, g):
    want = _rounds(name, l)
    got = [r.get("n") for r in getattr(counter, "rounds", [])]
    if counter.work == sum(want) and counter.depth == len(want) and got == want:
        return
    how = ("counter.add(l − k) once per round k = 1, 2, 4, … < l" if name == "hillis_steele_scan"
           else "counter.add(m) once per round, m = the combines of that round: the up-sweep's "
                "P/2, P/4, …, 1, then the down-sweep's 1, 2, …, P/2 (P = l padded to a power of "
                "two)")
    raise AssertionError(
        f"{name} counted its work wrong on {desc}: call {how}. For l = {l} that is rounds "
        f"{want} (work {sum(want)}, depth {len(want)}); your counter got rounds {got} (work "
        f"{counter.work}, depth {counter.depth}) [seed {g.initial_seed()}]")


def _check_scan(name, fn, g, cases):
    for desc, a, b, kw in cases:
        counter = ScanCounter()
        got = _core.call(fn, a, b, **kw, counter=counter, case=desc)
        want = linear_scan_sequential(a, b, kw.get("dim", -1), kw.get("reverse", False))
        _core.compare(got, want, what=f"{name} (the inclusive h_t)", case=desc, g=g)
        _check_counts(name, counter, b.shape[kw.get("dim", -1)], desc, g)
    return len(cases)


def hillis_steele_scan(fn):
    """Check ``fn(a, b, dim=-1, reverse=False, counter=None) -> h`` (inclusive, h_{−1} = 0) and
    the work it counts (``counter.add(l − k)`` per round)."""
    g = _core.generator()
    _core.passed("hillis_steele_scan", _check_scan("hillis_steele_scan", fn, g, _cases(g)))


def blelloch_scan(fn):
    """Check ``fn(a, b, dim=-1, reverse=False, pad=True, counter=None) -> h``, and ``pad=False``."""
    g = _core.generator()
    n_checks = _check_scan("blelloch_scan", fn, g, _cases(g))
    a, b = torch.rand(2, 16, dtype=f64, generator=g), torch.randn(2, 16, dtype=f64, generator=g)
    n_checks += _check_scan("blelloch_scan", fn, g, [("pad=False, length 16", a, b,
                                                      dict(pad=False))])
    try:
        fn(a[:, :12].contiguous(), b[:, :12].contiguous(), pad=False)
    except ValueError:
        n_checks += 1
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"blelloch_scan(pad=False) on length 12 must raise ValueError (not a "
                             f"power of two), not {type(e).__name__}: {e}") from e
    else:
        raise AssertionError("blelloch_scan(pad=False) on length 12 must raise ValueError: 12 is "
                             "not a power of two and padding was forbidden")
    _core.passed("blelloch_scan", n_checks)
