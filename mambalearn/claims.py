"""Chapter 16 — a claims lab: a claim, the evidence for it, and a verdict that could have gone
the other way.

A claim about a kernel or a model ("fusion gives 20–40×", "a bf16 state is fine") is audited in
four steps:

    1. a test on a number:   holds(value) → True / False        e.g. 20 ≤ speed-up ≤ 40
    2. the settings it is meant for (shapes, lengths, dtypes, devices)
    3. the number, measured in each setting by running code (a CPU computation, Triton's
       interpreter) or read from a recorded run (``mambalearn.results``)
    4. the verdict over the settings s₁ … s_k:

           VERIFIED  if holds(v_i) for every i
           REFUTED   if holds(v_i) for no i
           DEPENDS   otherwise (the claim is true somewhere: say where)

A test that no number can fail asserts nothing (and one no number can pass tests nothing):
:func:`audit` refuses both, probing the test over numbers far from and near the measured ones
(:func:`falsifiable`).

    Claim(name, chapter, test, holds)      the claim, where its story is told, its test
    Evidence(setting, value, source)       one measured number and where it came from
    audit(claim, evidence) → Audit         the verdict; ``Audit.show()`` prints it with the table
    verdict(outcomes)                      step 4 on a list of booleans
    probe_values(values)                   the numbers a test is tried on
    falsifiable(holds, values)             (can it fail, can it pass) on those numbers
"""

import math
from dataclasses import dataclass, field
from typing import Callable

VERIFIED, REFUTED, DEPENDS = "VERIFIED", "REFUTED", "DEPENDS"


@dataclass(frozen=True)
class Claim:
    """A falsifiable claim: ``holds(value)`` says whether one measured number supports it.

    ``test`` is the test in words ("attention / Mamba time > 1"), ``chapter`` the chapter that
    tells the full story, ``source`` where the claim is made (optional).
    """

    name: str
    chapter: int
    test: str
    holds: Callable = field(repr=False)
    source: str = ""


@dataclass(frozen=True)
class Evidence:
    """One number measured in one setting, and where it comes from (a computation here, or a
    results file: ``results.source(path)``)."""

    setting: str
    value: float
    source: str = "computed here"


@dataclass(frozen=True)
class Audit:
    """The verdict on a claim and the evidence it rests on (``outcomes[i]`` = holds(value i))."""

    claim: Claim
    evidence: tuple
    outcomes: tuple
    verdict: str

    def show(self, fmt=".3g"):
        """Print the verdict, the test, one line per setting and the chapter with the story."""
        print(f"{self.verdict:8s} “{self.claim.name}”   (test: {self.claim.test})")
        width = max(len(e.setting) for e in self.evidence)
        for e, ok in zip(self.evidence, self.outcomes, strict=True):
            print(f"    {e.setting:{width}s}  {e.value:>10{fmt}}  {'holds' if ok else 'fails'}"
                  f"   [{e.source}]")
        print(f"    the full story: chapter {self.claim.chapter:02d}")
        return self


def verdict(outcomes):
    """VERIFIED if every outcome is True, REFUTED if none is, DEPENDS otherwise."""
    outcomes = [bool(o) for o in outcomes]
    if not outcomes:
        raise ValueError("a verdict needs at least one outcome (one measured setting)")
    return VERIFIED if all(outcomes) else REFUTED if not any(outcomes) else DEPENDS


def probe_values(values):
    """Numbers a test is tried on: each measured value scaled and shifted, and fixed numbers of
    every sign and magnitude (so a threshold anywhere is crossed by some of them)."""
    base = [0.0, 1.0, -1.0, 1e-9, -1e-9, 1e-3, 0.5, 2.0, 10.0, 100.0, 1e6, 1e9, -1e9, 1e300,
            -1e300]
    scales = (-10.0, -1.0, 0.0, 0.1, 0.5, 0.9, 0.99, 1.01, 1.1, 2.0, 10.0, 1e3)
    near = [v * s for v in values for s in scales] + [v + d for v in values for d in (-1.0, 1.0)]
    return sorted({float(x) for x in base + near if math.isfinite(x)})


def _bool(x, what):
    if hasattr(x, "item") and getattr(x, "numel", lambda: 1)() == 1:  # a 0-d tensor or array
        x = x.item()
    if not isinstance(x, bool):
        raise TypeError(f"{what} must return True or False, got {x!r} ({type(x).__name__})")
    return x


def falsifiable(holds, values):
    """(some probe fails, some probe passes) for the test ``holds`` over
    :func:`probe_values` of ``values``; a test must be able to do both."""
    seen = {_bool(holds(v), "holds(value)") for v in probe_values(values)}
    return False in seen, True in seen


def _number(x, what):
    if hasattr(x, "item") and getattr(x, "numel", lambda: 1)() == 1:
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise TypeError(f"{what} must be a finite number, got {x!r}")
    return float(x)


def audit(claim, evidence):
    """The verdict on ``claim`` from ``evidence`` (a list of :class:`Evidence`), after checking
    that the evidence is finite numbers and that the test can both fail and pass."""
    if not isinstance(claim, Claim):
        raise TypeError(f"claim must be a claims.Claim, got {type(claim).__name__}")
    evidence = tuple(evidence)
    if not evidence or not all(isinstance(e, Evidence) for e in evidence):
        raise ValueError(f"{claim.name!r}: evidence must be a non-empty list of claims.Evidence")
    values = [_number(e.value, f"the evidence of {e.setting!r}") for e in evidence]
    can_fail, can_pass = falsifiable(claim.holds, values)
    if not can_fail:
        raise ValueError(f"{claim.name!r}: its test ({claim.test}) holds for every number tried "
                         f"(0, ±1e±9, ±1e300, the measured values scaled): a claim that cannot "
                         f"fail asserts nothing")
    if not can_pass:
        raise ValueError(f"{claim.name!r}: its test ({claim.test}) fails for every number tried: "
                         f"it tests nothing either")
    outcomes = tuple(_bool(claim.holds(v), f"{claim.name!r}: holds") for v in values)
    return Audit(claim, evidence, outcomes, verdict(outcomes))
