"""Checks for chapter 04: ``hillis_steele_scan`` and ``blelloch_scan`` against the oracle.

Besides the values (and the work the exercise asks the scan to count), each check makes the
computation show its order. With every a_t = 1 the scan is a running sum of b, and floating-point
addition rounds differently in every bracketing: on b spanning 10⁻³…10¹⁶ the left-to-right loop,
Hillis–Steele's doubling rounds and Blelloch's tree give sums that differ in their last digits. The
check replays each order here (Python floats round as torch's float64 does) and compares bit for
bit: only a scan that combines in its algorithm's order returns its algorithm's bits, whatever it
reports to its counter.
"""

import random

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

HINTS = {
    "hillis_steele_scan": [
        "A, U, restore = time_first(a, b, dim, reverse) puts time on dim 0; return restore(U)",
        "round k = 1, 2, 4, … < l: new = ops.combine((A[:-k], U[:-k]), (A[k:], U[k:])), then "
        "A, U = torch.cat([A[:k], new_A]), torch.cat([U[:k], new_U]); counter.add(l − k) once per "
        "round",
        "every position of a round is combined at once, from the values of the previous round: a "
        "loop over t (even one that reports the right counts) sums in the wrong order",
    ],
    "blelloch_scan": [
        "pad to P = 1 << (l − 1).bit_length() with ops.identity(A[:P − l], U[:P − l]) at the end "
        "(or raise ValueError if pad=False and P ≠ l); up-sweep: keep each level, combine "
        "A[0::2], U[0::2] with A[1::2], U[1::2]",
        "down-sweep from h = zeros (1, …): per level, top down, right = ops.apply((A[0::2], "
        "U[0::2]), h), h = torch.stack([h, right], 1).flatten(0, 1); counter.add once per level "
        "of each sweep",
        "the leaves now hold the exclusive prefixes (the state before each step): the inclusive "
        "h_t is entry t + 1, the root's u the last one; cut the padding off",
    ],
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
        f"{counter.work}, depth {counter.depth})")


def _check_scan(name, fn, g, cases):
    for desc, a, b, kw in cases:
        counter = ScanCounter()
        got = _core.call(fn, a, b, **kw, counter=counter, case=desc)
        want = linear_scan_sequential(a, b, kw.get("dim", -1), kw.get("reverse", False))
        _core.compare(got, want, what=f"{name} (the inclusive h_t)", case=desc, g=g)
        _check_counts(name, counter, b.shape[kw.get("dim", -1)], desc, g)
    return len(cases)


# --------------------------------------------------------------------------------------------
# the order of the sums: each scan's bracketing replayed in Python floats
def _sequential(x):
    out, s = [], 0.0
    for v in x:
        s = s + v
        out.append(s)
    return out


def _hillis_steele(x):
    x, k = list(x), 1
    while k < len(x):  # round k: x_t ← x_{t−k} ⊗ x_t for every t ≥ k at once
        x = [x[t] if t < k else x[t - k] + x[t] for t in range(len(x))]
        k *= 2
    return x


def _blelloch(x, inclusive):
    """The tree of Blelloch's scan (padded at the end with zeros, the identity steps): the
    up-sweep adds siblings, the down-sweep hands each first child the state h entering the pair
    and each second child h + (first child). ``inclusive``: "shift" reads h_t at slot t + 1 (the
    root last), "own" adds step t to the state entering it."""
    l = len(x)
    P = 1 << (l - 1).bit_length()
    level, levels = list(x) + [0.0] * (P - l), []
    while len(level) > 1:
        levels.append(level)
        level = [level[2 * i] + level[2 * i + 1] for i in range(len(level) // 2)]
    h = [0.0]
    for below in reversed(levels):
        h = [v for i, e in enumerate(h) for v in (e, below[2 * i] + e)]
    if inclusive == "shift":
        return (h[1:] + level)[:l]
    return [h[t] + x[t] for t in range(l)]


ORDERS = {
    "hillis_steele_scan": {"Hillis–Steele's doubling rounds": _hillis_steele},
    "blelloch_scan": {"Blelloch's tree": lambda x: _blelloch(x, "shift"),
                      "Blelloch's tree (inclusive as exclusive ⊗ own step)":
                          lambda x: _blelloch(x, "own")},
}
OTHERS = {"the left-to-right loop h_t = h_{t−1} + b_t": _sequential,
          "Hillis–Steele's doubling rounds": _hillis_steele,
          "Blelloch's tree": lambda x: _blelloch(x, "shift")}


def _sums(g, l):
    """b of length l whose running sums differ in every order above (redrawn until they do)."""
    rnd = random.Random(g.initial_seed() + l)
    orders = [*OTHERS.values(), lambda x: _blelloch(x, "own")]
    for _ in range(100):
        x = [rnd.gauss(0, 1) * 10 ** rnd.uniform(-3, 16) for _ in range(l)]
        results = [order(x) for order in orders]
        if all(results[i] != results[j] for i in range(len(results)) for j in range(i)):
            return x
    raise RuntimeError("no distinguishing input found")  # never seen: ~3 in 4 draws work


def _check_order(name, fn, g):
    """The scan of a = 1 must return its algorithm's sums, bit for bit."""
    for l in (13, 16):
        x = _sums(g, l)
        a, b = torch.ones(l, dtype=f64), torch.tensor(x, dtype=f64)
        case = f"a = 1, b of length {l} spanning 1e-3…1e16 (an order check)"
        got = _core.call(fn, a, b, case=case, counter=ScanCounter())
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (l,):
            raise AssertionError(f"{name} on {case}: expected a tensor of shape ({l},), got "
                                 f"{_core.kind(got)}")
        got = got.double().tolist()
        if any(got == order(x) for order in ORDERS[name].values()):
            continue
        (algorithm, order), *_ = ORDERS[name].items()
        like = next((what for what, other in OTHERS.items() if got == other(x)), None)
        raise AssertionError(
            f"{name} does not combine in {algorithm} order: on {case}, where floating-point sums "
            f"round differently in every bracketing, its h is the sum of "
            f"{like or 'no scan order we know'} (h_{l - 1} = {got[-1]!r} here, {order(x)[-1]!r} in "
            f"{algorithm}). Apply ⊗ round by round to all positions at once (ops.combine on "
            f"slices), as the algorithm does: counting the rounds is not enough")
    return 2


def hillis_steele_scan(fn):
    """Check ``fn(a, b, dim=-1, reverse=False, counter=None) -> h`` (inclusive, h_{−1} = 0), the
    work it counts (``counter.add(l − k)`` per round) and that it sums in Hillis–Steele's order."""
    g = _core.generator()
    n_checks = _check_scan("hillis_steele_scan", fn, g, _cases(g))
    n_checks += _check_order("hillis_steele_scan", fn, g)
    _core.passed("hillis_steele_scan", n_checks)


def blelloch_scan(fn):
    """Check ``fn(a, b, dim=-1, reverse=False, pad=True, counter=None) -> h``, and ``pad=False``."""
    g = _core.generator()
    n_checks = _check_scan("blelloch_scan", fn, g, _cases(g))
    a, b = torch.rand(2, 16, dtype=f64, generator=g), torch.randn(2, 16, dtype=f64, generator=g)
    n_checks += _check_scan("blelloch_scan", fn, g, [("pad=False, length 16", a, b,
                                                      dict(pad=False))])
    _core.refuses(fn, ValueError, a[:, :12].contiguous(), b[:, :12].contiguous(), pad=False,
                  case="pad=False, length 12",
                  rule="12 is not a power of two and padding was forbidden")
    n_checks += 1 + _check_order("blelloch_scan", fn, g)
    _core.passed("blelloch_scan", n_checks)
