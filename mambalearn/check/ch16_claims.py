"""Checks for chapter 16: a claim of the student's choosing, audited with ``mambalearn.claims``.

    settings()          → a list of 2–8 dicts (the same keys): the conditions the claim is for
    measure(**setting)  → a finite number computed for that setting (not looked up)
    holds(value)        → True or False: does this number support the claim?

A claim cell that asserts nothing or cannot fail is refused:

* ``holds`` is tried on numbers of every sign and size, near and far from the measured ones
  (``claims.probe_values``): it must say True to some and False to others, say the same twice
  for the same number, and the same for numbers one part in 10⁹ from a measured one (a test
  pinned to the measured numbers is not a claim);
* the evidence must be computed: ``measure`` runs under a count of its work
  (``_probes.call_counting_work``) and must run a PyTorch operation that computes or a Triton
  kernel, so a number typed in or a closed-form guess fails;
* the evidence must respond to the setting: not one number for every setting, and for every key
  the listed settings vary, changing that key alone (to another listed value) must change the
  number, so a ``measure`` that ignores a setting fails; ``measure`` is also called on settings
  nobody listed, drawn at random between the listed ones (an integer between the integers, a
  number between the numbers, one of the listed strings), so a table of pasted results fails;
* the evidence must be reproducible: each listed setting is measured twice, must give the same
  verdict both times, and the two numbers may differ by at most ``NOISE`` (10 %) of the spread
  between the settings' numbers, so noise passed off as a difference between settings fails.
"""

import json
import math

import torch

from mambalearn import claims
from mambalearn.check import _core, _probes

__all__ = ["claim_audit"]
REBUILDS = {"claim_audit": []}  # the harness is given; the claim is the student's own

HINTS = {
    "claim_audit": [
        "settings() lists the conditions the claim speaks of, e.g. [{'l': 256}, {'l': 4096}]; "
        "measure(**setting) reads them (setting['l']) and returns one number computed for that "
        "setting by running PyTorch or Triton code: a ratio, an error, a count",
        "holds(value) turns the number into the claim's verdict with a threshold that means "
        "something (a 2× speed-up is value ≥ 2): it must be able to come out False",
        "every key you list must change the number when it alone changes, and measuring twice "
        "must give (nearly) the same number: fix the seed of the inputs, or measure a quantity "
        "that does not depend on chance (a count, an error in float64)",
    ],
}

MAX_SETTINGS = 8
RESERVED = {"case", "mutable", "fn", "target"}  # keywords of _core.call and _core.probe
NOISE = 0.1  # two measurements of one setting may differ by this share of the settings' spread


def _number(x, what, case):
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise AssertionError(f"{what} must return one finite number (an int, a float or a "
                             f"one-element tensor), got {x!r} on {case}")
    return float(x)


def _verdict(holds, value, case):
    got = _core.call(holds, value, case=case)
    if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dtype == torch.bool:
        got = bool(got.item())
    if not isinstance(got, bool):
        raise AssertionError(f"holds({value!r}) must return True or False, got {got!r} "
                             f"({type(got).__name__})")
    return got


def _settings(settings):
    listed = _core.call(settings, case="settings()")
    if not isinstance(listed, (list, tuple)) or not all(isinstance(s, dict) for s in listed):
        raise AssertionError(f"settings() must return a list of dicts (one per condition the "
                             f"claim is tested under), got {listed!r}")
    if not 2 <= len(listed) <= MAX_SETTINGS:
        raise AssertionError(f"settings() returned {len(listed)} settings: list 2 to "
                             f"{MAX_SETTINGS} (a claim tested once cannot show where it stops "
                             f"holding; more would make grading slow)")
    keys = [sorted(s) for s in listed]
    if not keys[0] or any(k != keys[0] for k in keys) or not all(
            isinstance(k, str) for k in keys[0]):
        raise AssertionError(f"every setting must have the same non-empty string keys (the "
                             f"arguments of measure), got {keys}")
    taken = sorted(set(keys[0]) & RESERVED)
    if taken:
        raise AssertionError(f"a setting may not use the key {taken[0]!r} (a word of the "
                             f"check's own): rename it")
    return [dict(s) for s in listed]


def _unlisted(listed, g):
    """A setting nobody listed: per key, a value between the listed numbers, else a listed one."""
    out = {}
    for key in listed[0]:
        vals = [s[key] for s in listed]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)
        lo, hi = (min(vals), max(vals)) if numeric else (None, None)
        if numeric and all(isinstance(v, int) for v in vals) and hi - lo >= 2:
            fresh = [v for v in range(lo + 1, hi) if v not in vals] or list(range(lo + 1, hi))
            out[key] = fresh[int(torch.randint(len(fresh), (1,), generator=g))]
        elif numeric and not all(isinstance(v, int) for v in vals) and hi > lo:
            out[key] = float(lo + (hi - lo) * (0.2 + 0.6 * torch.rand((), generator=g).item()))
        else:
            out[key] = vals[int(torch.randint(len(vals), (1,), generator=g))]
    return out


def _measured(measure, s, case):
    """measure(**s) watched: (the number, whether it ran any computation: a PyTorch operation
    that computes, not one that only allocates or moves, or a Triton launch)."""
    got, seen = _core.probe(_probes.call_counting_work, measure, **s, case=case)
    return _number(got, "measure", s), bool(seen["computed"] or seen["launched"])


def claim_audit(settings, measure, holds):
    """Check a claim audit: ``settings()``, ``measure(**setting)`` and ``holds(value)``."""
    g = _core.generator()
    seed = f" [seed {g.initial_seed()}]"
    listed = _settings(settings)
    values, ran = [], []
    for s in listed:
        v, r = _measured(measure, s, case=f"measure(**{s})")
        values.append(v)
        ran.append(r)
    n = 1
    idle = [s for s, r in zip(listed, ran, strict=True) if not r]
    if idle:
        raise AssertionError(f"measure(**{idle[0]}) returned {values[listed.index(idle[0])]!r} "
                             f"without running any computation (no PyTorch operation that "
                             f"computes, no Triton kernel): a number typed in or given by a "
                             f"formula is a model of the claim, not evidence for it (run the "
                             f"code the claim is about, in that setting)")
    n += 1
    if len(set(values)) == 1:
        raise AssertionError(f"measure returns {values[0]!r} for every setting {listed}: "
                             f"evidence that does not respond to the conditions measures nothing "
                             f"(measure a quantity that varies, e.g. an error or a ratio, not a "
                             f"pass/fail)")
    n += 1
    outcomes = {}
    for v in claims.probe_values(values):
        outcomes[v] = _verdict(holds, v, case=f"holds({v!r})")
    if all(outcomes.values()):
        raise AssertionError(f"holds(value) is True for every number tried (0, ±1e-9, ±1e9, "
                             f"±1e300 and your measured values {values} scaled by −10 … 1000): a "
                             f"claim that no measurement can refute asserts nothing")
    if not any(outcomes.values()):
        raise AssertionError("holds(value) is False for every number tried: a test no "
                             "measurement can pass tests nothing")
    n += 1
    for v in values:
        if _verdict(holds, v, case=f"holds({v!r})") != _verdict(holds, v, case=f"holds({v!r})"):
            raise AssertionError(f"holds({v!r}) gave True once and False once: the test must be a "
                                 f"function of the number alone")
        near = {_verdict(holds, v * (1 + e), case=f"holds({v * (1 + e)!r})") for e in (-1e-9, 1e-9)}
        if near != {outcomes.get(v, _verdict(holds, v, case=f"holds({v!r})"))}:
            raise AssertionError(f"holds changes its answer between {v!r} and numbers one part in "
                                 f"10⁹ away: a test pinned to the number you measured is not a "
                                 f"claim (compare with a threshold that means something)")
    n += 1
    spread = max(values) - min(values)
    tol = 0.0
    for s, first in zip(listed, values, strict=True):
        again = _number(_core.call(measure, **s, case=f"measure(**{s})"), "measure", s)
        if _verdict(holds, again, case=f"holds({again!r})") != \
                _verdict(holds, first, case=f"holds({first!r})"):
            raise AssertionError(f"the verdict for {s} changed between two measurements ({first!r} "
                                 f"then {again!r}): evidence that flips from run to run is noise "
                                 f"(measure something that does not, or with margin){seed}")
        if abs(again - first) > NOISE * spread:
            raise AssertionError(f"measure(**{s}) gave {first!r}, then {again!r}: more than "
                                 f"{NOISE:.0%} of the spread between your settings "
                                 f"({min(values)!r} … {max(values)!r}), so the differences "
                                 f"between settings may be noise (fix the seed of the inputs, or "
                                 f"measure a quantity that does not depend on chance){seed}")
        tol = max(tol, abs(again - first))
        n += 1
    for key in listed[0]:
        others = sorted({json.dumps(s[key]) for s in listed})
        if len(others) < 2:
            continue  # a condition held fixed: nothing to compare
        tried = []
        for s, v in zip(listed, values, strict=True):
            for other in others:
                moved = {**s, key: json.loads(other)}
                if moved[key] == s[key] or moved in tried:
                    continue
                tried.append(moved)
                w = (values[listed.index(moved)] if moved in listed else _number(_core.call(
                    measure, **moved, case=f"measure(**{moved})"), "measure", moved))
                if abs(w - v) > tol:
                    break
            else:
                continue
            break
        else:
            raise AssertionError(f"measure gives the same number whatever {key!r} is (tried "
                                 f"{tried[:3]} against your settings): a setting measure ignores "
                                 f"is not a condition of the claim (use it in the computation, or "
                                 f"drop it)")
        n += 1
    for _ in range(2):
        fresh = _unlisted(listed, g)
        got = _core.call(measure, **fresh, case=f"measure(**{fresh}), a setting between yours")
        v = _number(got, "measure", f"{fresh} (a setting between the ones you list: the evidence "
                                    f"must be computed for it, not looked up){seed}")
        _verdict(holds, v, case=f"holds({v!r})")
        n += 1
    _core.passed("claim_audit", n)
