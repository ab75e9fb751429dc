"""The claims harness: the verdict rule, and an audit that refuses a test that cannot fail."""

import pytest

from mambalearn import claims

C = lambda holds, test="x < 1": claims.Claim("a claim", 5, test, holds)
E = lambda *vs: [claims.Evidence(f"s{i}", v) for i, v in enumerate(vs)]


def test_the_verdict_rule():
    assert claims.verdict([True, True]) == claims.VERIFIED
    assert claims.verdict([False, False]) == claims.REFUTED
    assert claims.verdict([True, False, True]) == claims.DEPENDS
    with pytest.raises(ValueError, match="at least one"):
        claims.verdict([])


def test_audit_and_show(capsys):
    a = claims.audit(C(lambda v: v < 1), E(0.5, 2.0))
    assert (a.verdict, a.outcomes) == (claims.DEPENDS, (True, False))
    a.show()
    out = capsys.readouterr().out
    assert out.startswith("DEPENDS") and "holds" in out and "fails" in out and "chapter 05" in out
    assert claims.audit(C(lambda v: v > 0), E(3.0)).verdict == claims.VERIFIED


@pytest.mark.parametrize("holds, match", [
    (lambda v: True, "cannot fail"), (lambda v: v > -1e308, "cannot fail"),
    (lambda v: False, "tests nothing"), (lambda v: v, "True or False")])
def test_audit_refuses_a_test_that_cannot_fail(holds, match):
    with pytest.raises((ValueError, TypeError), match=match):
        claims.audit(C(holds), E(0.5, 2.0))


def test_probes_cross_any_threshold_near_the_values():
    for value, threshold in ((0.013, 0.01), (210.0, 40.0), (-3.0, -2.9), (1e-6, 1e-7)):
        probes = claims.probe_values([value])
        assert any(p < threshold for p in probes) and any(p > threshold for p in probes)


def test_audit_refuses_bad_evidence():
    with pytest.raises(TypeError, match="finite number"):
        claims.audit(C(lambda v: v < 1), E(float("nan")))
    with pytest.raises(ValueError, match="non-empty"):
        claims.audit(C(lambda v: v < 1), [])
    with pytest.raises(TypeError, match="claims.Claim"):
        claims.audit("a claim", E(1.0))
