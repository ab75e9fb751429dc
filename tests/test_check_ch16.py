"""Chapter 16 checks: a claim audit passes when it can fail, and every kind of empty claim fails."""

import itertools
import math
import random

import pytest
import torch

from mambalearn import check
from mambalearn.check import ch16_claims


def settings():
    return [dict(steps=10, delta=0.1), dict(steps=400, delta=0.1), dict(steps=400, delta=0.001)]


def measure(**setting):
    """Relative error of a state rounded to bf16 after every step (the solution's claim)."""
    steps, delta = setting["steps"], setting["delta"]
    g = torch.Generator().manual_seed(0)
    A_bar = torch.exp(delta * -torch.linspace(0.05, 1.0, 8, dtype=torch.float64).repeat(4, 1))
    h = h16 = torch.zeros(4, 8, dtype=torch.float64)
    for _ in range(steps):
        Bx = delta * torch.randn(4, 8, generator=g, dtype=torch.float64)
        h, h16 = A_bar * h + Bx, (A_bar * h16 + Bx).to(torch.bfloat16).double()
    return ((h16 - h).norm() / h.norm()).item()


def holds(value):
    return value < 0.01


def test_passes_a_claim_that_can_fail(capsys):
    check.claim_audit(settings, measure, holds)
    assert capsys.readouterr().out.startswith("✓ claim_audit")


TABLE = {(s["steps"], s["delta"]): measure(**s) for s in settings()}
counter = itertools.count()
WRONG = {
    "cannot fail": (settings, measure, lambda v: True),
    "cannot fail, dressed up": (settings, measure, lambda v: v < 1e308 or v != v),
    "cannot pass": (settings, measure, lambda v: False),
    "returns the number": (settings, measure, lambda v: v),
    "a tensor of several values": (settings, measure, lambda v: torch.tensor([v < 0.01] * 2)),
    "ignores the setting": (settings, lambda steps, delta: 0.5, holds),
    "a pasted table": (settings, lambda steps, delta: TABLE[(steps, delta)], holds),
    "noise": (settings, lambda steps, delta: random.random() * 0.02, holds),
    "ignores delta": (settings, lambda steps, delta: measure(steps=steps, delta=0.1), holds),
    "noise that keeps its verdict": (settings, lambda steps, delta: torch.rand(()).item() * 0.005,
                                     holds),
    "a closed-form guess": (settings, lambda steps, delta: 2**-9 * math.sqrt(steps * delta), holds),
    "not deterministic": (settings, measure, lambda v: next(counter) % 2 == 0),
    "pinned to the measured values": (settings, measure, lambda v: v > 1e6 or any(
        abs(v - t) < 1e-15 for t in TABLE.values())),
    "one setting": (lambda: settings()[:1], measure, holds),
    "different keys": (lambda: [dict(steps=10), dict(delta=0.1)], measure, holds),
    "not a list": (lambda: dict(steps=10), measure, holds),
    "nan evidence": (settings, lambda steps, delta: float("nan"), holds),
    "a string": (settings, lambda steps, delta: "0.01", holds),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_rejects_an_empty_claim(name):
    random.seed(1)  # "noise" flips one of its verdicts with this seed (and almost any other)
    with pytest.raises(AssertionError):
        check.claim_audit(*WRONG[name])


@pytest.mark.parametrize("name, match", [
    ("ignores delta", "whatever 'delta' is"), ("noise that keeps its verdict", "may be noise"),
    ("a closed-form guess", "without running any computation")])
def test_each_planted_wrong_measure_is_caught_by_its_rule(name, match):
    for _ in range(3):  # fresh noise each time
        with pytest.raises(AssertionError, match=match):
            check.claim_audit(*WRONG[name])


def test_a_measure_with_noise_below_its_spread_passes():
    """Timing-like noise, small next to the differences between settings, is evidence."""
    noisy = lambda **s: measure(**s) * (1 + 0.001 * torch.rand(()).item())
    check.claim_audit(settings, noisy, holds)


def test_the_unlisted_settings_lie_between_the_listed_ones():
    g = torch.Generator().manual_seed(0)
    listed = [dict(l=8, x=0.5, kind="a"), dict(l=64, x=2.0, kind="b")]
    for _ in range(20):
        s = ch16_claims._unlisted(listed, g)
        assert 8 < s["l"] < 64 and isinstance(s["l"], int) and 0.5 < s["x"] < 2.0
        assert s["kind"] in ("a", "b")


def test_not_written_yet_passes_through():
    def stub():
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        check.claim_audit(stub, measure, holds)


def test_a_vacuous_claim_fails_when_graded(tmp_path):
    """Through the grader's box (the student's functions called from the grader): a test that
    cannot fail is refused there too, and the report says why."""
    from _grading_cases import edited

    from course.classroom import grade

    nb = edited("solutions/16_claims.ipynb", tmp_path / "16_claims.ipynb",
                replace={"holds": "def holds(value):\n    return value == value  # always true\n"})
    rows = {r["task"]: r for r in grade.grade(nb, timeout=120)}
    assert rows["claim_audit"]["status"] == "fail", rows
    assert "asserts nothing" in rows["claim_audit"]["reason"]
