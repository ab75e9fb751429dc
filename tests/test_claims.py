"""The claims method: the verdict rule, evidence kinds, UNCHECKABLE, the refusal of a verdict that
rests on a model alone or on a test that cannot fail, and evidence read from every current row."""

import json
import random

import pytest

from mambalearn import claims, results

ART = "002_bc9831347276afa0.txt"
C = lambda holds, test="x < 1", **kw: claims.Claim("a claim", 5, test, holds, ART, **kw)
E = lambda *vs, **kw: [claims.Evidence(f"s{i}", v, **kw) for i, v in enumerate(vs)]


def test_the_verdict_rule():
    assert claims.verdict([True, True]) == claims.VERIFIED
    assert claims.verdict([False, False]) == claims.REFUTED
    assert claims.verdict([True, False, True]) == claims.DEPENDS
    assert claims.verdict([]) == claims.UNCHECKABLE


def test_audit_and_show(capsys):
    a = claims.audit(C(lambda v: v < 1), E(0.5, 2.0))
    assert (a.verdict, a.outcomes, a.counts) == (claims.DEPENDS, (True, False), (True, True))
    a.show()
    out = capsys.readouterr().out
    assert out.startswith("DEPENDS") and "holds" in out and "fails" in out and "chapter 05" in out
    assert ART in out and "computed" in out
    assert claims.audit(C(lambda v: v > 0), E(3.0)).verdict == claims.VERIFIED


def test_a_claim_names_its_article_and_known_conditions():
    with pytest.raises(ValueError, match="name its article"):
        claims.Claim("a claim", 5, "x < 1", lambda v: v < 1)
    with pytest.raises(ValueError, match="unknown condition"):
        C(lambda v: v < 1, conditions={"colour": "red"})
    with pytest.raises(ValueError, match="kind must be one of"):
        claims.Evidence("s", 1.0, kind="guessed")


@pytest.mark.parametrize("kinds", [(claims.MODELLED,), (claims.SIMULATED,),
                                   (claims.MODELLED, claims.SIMULATED)])
def test_a_verdict_on_models_alone_is_refused(kinds):
    ev = [claims.Evidence(f"s{i}", random.uniform(0.1, 3), kind=k) for i, k in enumerate(kinds)]
    with pytest.raises(ValueError, match="may not rest on a model or a simulation"):
        claims.audit(C(lambda v: v < 1), ev)


def test_models_are_shown_but_never_decide():
    """One measured number decides; a modelled one that disagrees is context."""
    ev = E(0.5) + E(7.0, kind=claims.MODELLED)
    a = claims.audit(C(lambda v: v < 1), ev)
    assert a.verdict == claims.VERIFIED and a.counts == (True, False)
    assert a.outcomes == (True, False)


def test_only_evidence_at_the_claims_setting_counts(capsys):
    claim = C(lambda v: v > 4, conditions={"length": 8192, "device": ("A100", "H100")})
    off = [claims.Evidence(f"l = {l}", 8.0, conditions={"length": l, "device": "A100"})
           for l in (256, 4096)]
    unnamed = [claims.Evidence("no conditions named", 9.0)]
    with pytest.raises(ValueError, match="UNCHECKABLE"):  # must say what would decide it
        claims.audit(claim, off + unnamed)
    a = claims.audit(claim, off + unnamed, needs="a run at l = 8192 on an A100").show()
    assert a.verdict == claims.UNCHECKABLE and not any(a.counts)
    assert "to decide it: a run at l = 8192" in capsys.readouterr().out
    at = claims.Evidence("l = 8192, H100", 3.0, conditions={"length": 8192, "device": "H100"})
    a = claims.audit(claim, off + [at])
    assert a.verdict == claims.REFUTED and a.counts == (False, False, True)


def test_a_claim_with_no_evidence_at_all_is_uncheckable():
    a = claims.audit(C(lambda v: v < 1), [], needs="an A100 and the article's model")
    assert a.verdict == claims.UNCHECKABLE and a.needs.startswith("an A100")
    lo = random.uniform(1e-6, 1e6)  # a window [lo, 1.4 lo] is found without measured values
    a = claims.audit(C(lambda v: lo <= v <= lo * 1.4), [], needs="a run")
    assert a.verdict == claims.UNCHECKABLE


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
    with pytest.raises(ValueError, match="list of claims.Evidence"):
        claims.audit(C(lambda v: v < 1), [0.5])
    with pytest.raises(TypeError, match="claims.Claim"):
        claims.audit("a claim", E(1.0))


def _store(tmp_path, runs):
    for name, (date, rows) in runs.items():
        meta = {k: "not recorded" for k in results.META} | {"peers": {}, "date": date,
                                                            "device": "NVIDIA H200"}
        (tmp_path / name).write_text(json.dumps({"meta": meta, "rows": rows}))
    return tmp_path


def test_from_store_reads_every_current_row_that_matches(tmp_path):
    """Fresh rows over two runs: every matching current row becomes evidence (the newest of each
    measurement), none of another op, none superseded."""
    rng = random.Random()
    batches = rng.sample(range(1, 65), rng.randint(2, 6))
    shapes = [f"b{b} l{2 ** rng.randint(8, 17)}" for b in batches]
    old = {s: rng.uniform(0.1, 9) for s in shapes}
    new = {s: rng.uniform(0.1, 9) for s in shapes[::2]}
    row = lambda s, ms, op="fwd", backend="ours": dict(op=op, backend=backend, shape=s, ms=ms)
    store = _store(tmp_path, {
        "h200_demo_2026-01-01.json": ("2026-01-01", [row(s, v) for s, v in old.items()]
                                      + [row(s, 99.0, op="bwd") for s in shapes]
                                      + [row(s, 1.0, backend="peer") for s in shapes]),
        "h200_demo_2026-01-02.json": ("2026-01-02", [row(s, v) for s, v in new.items()])})
    ev = claims.from_store("demo", "ms", store=store, op="fwd", backend="ours")
    want = old | new
    assert sorted((e.setting, e.value) for e in ev) == sorted(want.items())
    assert all(e.kind == claims.MEASURED and e.conditions == {"device": "NVIDIA H200"} for e in ev)
    assert {e.source.split(", ")[1] for e in ev} == {"2026-01-01", "2026-01-02"}
    peer = claims.from_store("demo", lambda f: results.same_run(f, backend="peer").row["ms"]
                             / f.row["ms"] if f.path.name.endswith("01.json") else None,
                             store=store, op="fwd", backend="ours")
    assert len(peer) == len(old) - len(new)  # rows whose value is None are not evidence
    with pytest.raises(LookupError, match="no current row"):
        claims.from_store("demo", "ms", store=store, op="fwd", backend="nobody")
