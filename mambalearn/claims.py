"""Chapter 16 — a claims lab: a claim, the evidence for it, and a verdict that could have gone
the other way.

A claim about a kernel or a model ("fusion gives 20–40×", "the tree scan is 4.2× faster") is
audited in five steps:

    1. where it is made, and the conditions it is stated under: the article's file and every
       condition it gives (sequence length, device, dtype, baseline, model size);
    2. a test on a number:   holds(value) → True / False        e.g. 20 ≤ speed-up ≤ 40
    3. the evidence: numbers, each of one kind
           measured    timed or counted on a device (a results file of ``mambalearn.results``)
           computed    produced here by running code (a CPU computation, Triton's interpreter,
                       a kernel compiled for sm_90)
           modelled    predicted by a formula (a byte count, a roofline, a cost model)
           simulated   produced by running a stand-in for the real system
       and the setting it was taken in, with its conditions;
    4. which evidence counts: measured or computed numbers taken at the claim's setting (every
       condition the claim states is met by the evidence). Other evidence is shown as context;
       it never decides;
    5. the verdict over the k numbers that count:

           VERIFIED     if holds(v_i) for every i
           REFUTED      if holds(v_i) for no i
           DEPENDS      otherwise (the claim is true somewhere: say where)
           UNCHECKABLE  if no number counts: nothing was measured or computed at the setting
                        the claim is made for (the audit says what would be needed)

A verdict that would rest only on modelled or simulated numbers is refused (a model checks
nothing about the world), and so is a test that no number can fail (it asserts nothing) or none
can pass (it tests nothing): :func:`audit` probes the test over numbers far from and near the
evidence (:func:`falsifiable`).

    Claim(name, chapter, test, holds, article, conditions)   the claim, where it is made
    Evidence(setting, value, source, kind, conditions)        one number and where it came from
    from_store(topic, value, ...)    evidence from every current results row that matches
    audit(claim, evidence, needs)    the verdict; ``Audit.show()`` prints it with the table
    verdict(outcomes)                step 5 on a list of booleans
    probe_values(values)             the numbers a test is tried on
    falsifiable(holds, values)       (can it fail, can it pass) on those numbers
"""

import math
from dataclasses import dataclass, field
from typing import Callable

from mambalearn import results

VERIFIED, REFUTED, DEPENDS, UNCHECKABLE = "VERIFIED", "REFUTED", "DEPENDS", "UNCHECKABLE"
MEASURED, COMPUTED, MODELLED, SIMULATED = "measured", "computed", "modelled", "simulated"
KINDS = (MEASURED, COMPUTED, MODELLED, SIMULATED)
DECIDING = (MEASURED, COMPUTED)  # the kinds a verdict may rest on
CONDITIONS = ("length", "device", "dtype", "baseline", "model size", "batch", "state size",
              "width", "chunk", "op")  # the conditions a claim or a setting may name


def _conditions(conditions, what):
    conditions = dict(conditions or {})
    unknown = [k for k in conditions if k not in CONDITIONS]
    if unknown:
        raise ValueError(f"{what}: unknown condition {unknown}; conditions are named "
                         f"{list(CONDITIONS)}")
    return conditions


@dataclass(frozen=True)
class Claim:
    """A falsifiable claim: ``holds(value)`` says whether one number supports it.

    ``test`` is the test in words ("attention / Mamba time > 1"), ``chapter`` the chapter that
    tells the full story. ``article`` names the source article's file (e.g.
    ``"002_bc9831347276afa0.txt"``) or, for a claim of one's own, says so (``"my own"``);
    ``conditions`` are the conditions it is stated under, as the article gives them
    (``{"length": 8192, "device": "A100"}``): evidence counts only where it meets every one. A
    condition's value is one value or a tuple of the values it allows.
    """

    name: str
    chapter: int
    test: str
    holds: Callable = field(repr=False)
    article: str = ""
    conditions: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.article, str) or not self.article.strip():
            raise ValueError(f"claim {self.name!r}: name its article (the source file, e.g. "
                             f"'002_bc9831347276afa0.txt'), or say it is your own")
        object.__setattr__(self, "conditions", _conditions(self.conditions, f"claim {self.name!r}"))


@dataclass(frozen=True)
class Evidence:
    """One number taken in one setting: its kind (measured, computed, modelled or simulated),
    where it comes from (``results.source(path)`` for a results file) and the setting's
    conditions (``{"length": 4096, "device": "NVIDIA H200"}``)."""

    setting: str
    value: float
    source: str = "computed here"
    kind: str = COMPUTED
    conditions: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"evidence {self.setting!r}: kind must be one of {KINDS}, got "
                             f"{self.kind!r}")
        object.__setattr__(self, "conditions",
                           _conditions(self.conditions, f"evidence {self.setting!r}"))


def at_setting(claim, evidence):
    """Whether ``evidence`` was taken where ``claim`` is stated: it names every condition the
    claim states, with a value the claim allows."""
    for key, want in claim.conditions.items():
        if key not in evidence.conditions:
            return False
        allowed = want if isinstance(want, tuple) else (want,)
        if evidence.conditions[key] not in allowed:
            return False
    return True


def from_store(topic, value, *, setting=None, conditions=None, kind=MEASURED, device="h200",
               store=None, **match):
    """One :class:`Evidence` for **every** current row of ``topic`` whose fields equal ``match``
    (``results.current``: the newest run of each measurement), so no row that would count
    against the claim is left out by hand.

    ``value(found)`` → the number (``found.row``, ``found.meta``; ``results.same_run(found, …)``
    for a peer of the same run), or a key of the row; ``setting(row)`` → its label (default:
    its shape); ``conditions(found)`` → its conditions (default: the device). A row whose
    ``value`` returns None is not evidence for this claim (say why in ``value``)."""
    get = (lambda f: f.row[value]) if isinstance(value, str) else value
    out = []
    for f in results.current(topic, device, store):
        if not all(k in f.row and f.row[k] == v for k, v in match.items()):
            continue
        v = get(f)
        if v is None:
            continue
        label = setting(f.row) if setting else str(f.row.get("shape", results.identity(f.row)))
        cond = conditions(f) if conditions else {"device": f.meta["device"]}
        out.append(Evidence(label, v, f.source, kind, cond))
    if not out:
        raise LookupError(f"no current row of topic {topic!r} ({device}) matches {match}")
    return out


@dataclass(frozen=True)
class Audit:
    """The verdict on a claim and the evidence it rests on: ``outcomes[i]`` = holds(value i),
    ``counts[i]`` whether evidence i decides (measured or computed, at the claim's setting)."""

    claim: Claim
    evidence: tuple
    outcomes: tuple
    counts: tuple
    verdict: str
    needs: str = ""

    def show(self, fmt=".3g"):
        """Print the verdict, the article and its conditions, the test, one line per piece of
        evidence (its kind; whether it counts) and what an UNCHECKABLE claim would need."""
        c = self.claim
        said = ", ".join(f"{k} {v}" for k, v in c.conditions.items()) or "no condition stated"
        print(f"{self.verdict:11s} “{c.name}”   (test: {c.test})")
        print(f"    said in {c.article}: {said}")
        width = max([len(e.setting) for e in self.evidence] + [1])
        for e, ok, counts in zip(self.evidence, self.outcomes, self.counts, strict=True):
            why = "" if counts else ("   (context: not at the claim's setting)"
                                      if e.kind in DECIDING else f"   (context: {e.kind})")
            print(f"    {e.setting:{width}s}  {e.value:>10{fmt}}  {'holds' if ok else 'fails'}  "
                  f"{e.kind:9s} [{e.source}]{why}")
        if self.verdict == UNCHECKABLE:
            print(f"    to decide it: {self.needs}")
        print(f"    the full story: chapter {c.chapter:02d}")
        return self


def verdict(outcomes):
    """VERIFIED if every outcome is True, REFUTED if none is, DEPENDS otherwise; UNCHECKABLE
    when there is none (nothing counts)."""
    outcomes = [bool(o) for o in outcomes]
    if not outcomes:
        return UNCHECKABLE
    return VERIFIED if all(outcomes) else REFUTED if not any(outcomes) else DEPENDS


def probe_values(values, dense=False):
    """Numbers a test is tried on: each measured value scaled and shifted, and fixed numbers of
    every sign and magnitude (so a threshold anywhere is crossed by some of them); ``dense``
    adds ±m·10^k for m in 1 … 9 (and 1.2, 1.5, 2.5), k = −12 … 12 (a test's window is found
    without measured values)."""
    base = [0.0, 1.0, -1.0, 1e-9, -1e-9, 1e-3, 0.5, 2.0, 10.0, 100.0, 1e6, 1e9, -1e9, 1e300,
            -1e300]
    if dense:
        mantissas = (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)
        base += [s * m * 10.0**k for s in (1, -1) for m in mantissas for k in range(-12, 13)]
    scales = (-10.0, -1.0, 0.0, 0.1, 0.5, 0.9, 0.99, 1.01, 1.1, 2.0, 10.0, 1e3)
    near = [v * s for v in values for s in scales] + [v + d for v in values for d in (-1.0, 1.0)]
    return sorted({float(x) for x in base + near if math.isfinite(x)})


def _bool(x, what):
    if hasattr(x, "item") and getattr(x, "numel", lambda: 1)() == 1:  # a 0-d tensor or array
        x = x.item()
    if not isinstance(x, bool):
        raise TypeError(f"{what} must return True or False, got {x!r} ({type(x).__name__})")
    return x


def falsifiable(holds, values, dense=True):
    """(some probe fails, some probe passes) for the test ``holds`` over
    :func:`probe_values` of ``values``; a test must be able to do both."""
    seen = {_bool(holds(v), "holds(value)") for v in probe_values(values, dense)}
    return False in seen, True in seen


def _number(x, what):
    if hasattr(x, "item") and getattr(x, "numel", lambda: 1)() == 1:
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise TypeError(f"{what} must be a finite number, got {x!r}")
    return float(x)


def audit(claim, evidence, needs=""):
    """The verdict on ``claim`` from ``evidence`` (a list of :class:`Evidence`, possibly empty).

    Checks that the evidence is finite numbers and that the test can both fail and pass; takes
    the verdict over the measured and computed numbers at the claim's setting; refuses (a
    ValueError) a verdict that would rest only on modelled or simulated numbers. With no number
    that counts the verdict is UNCHECKABLE, and ``needs`` must say what run would decide it."""
    if not isinstance(claim, Claim):
        raise TypeError(f"claim must be a claims.Claim, got {type(claim).__name__}")
    evidence = tuple(evidence)
    if not all(isinstance(e, Evidence) for e in evidence):
        raise ValueError(f"{claim.name!r}: evidence must be a list of claims.Evidence")
    values = [_number(e.value, f"the evidence of {e.setting!r}") for e in evidence]
    can_fail, can_pass = falsifiable(claim.holds, values)
    if not can_fail:
        raise ValueError(f"{claim.name!r}: its test ({claim.test}) holds for every number tried "
                         f"(0, ±m·10^k, ±1e300, the measured values scaled): a claim that cannot "
                         f"fail asserts nothing")
    if not can_pass:
        raise ValueError(f"{claim.name!r}: its test ({claim.test}) fails for every number tried: "
                         f"it tests nothing either")
    outcomes = tuple(_bool(claim.holds(v), f"{claim.name!r}: holds") for v in values)
    here = [at_setting(claim, e) for e in evidence]
    counts = tuple(h and e.kind in DECIDING for h, e in zip(here, evidence, strict=True))
    if any(here) and not any(counts):
        kinds = sorted({e.kind for e, h in zip(evidence, here, strict=True) if h})
        raise ValueError(f"{claim.name!r}: the evidence at its setting is only "
                         f"{' and '.join(kinds)}: a verdict may not rest on a model or a "
                         f"simulation alone (measure or compute the number)")
    decided = verdict([o for o, c in zip(outcomes, counts, strict=True) if c])
    if decided == UNCHECKABLE and not (isinstance(needs, str) and needs.strip()):
        raise ValueError(f"{claim.name!r}: no measured or computed number at its setting "
                         f"({claim.conditions or 'none stated'}): the claim is UNCHECKABLE here; "
                         f"say what run would decide it (needs=...)")
    return Audit(claim, evidence, outcomes, counts, decided, needs if decided == UNCHECKABLE
                 else "")
