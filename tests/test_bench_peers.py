"""bench/gpu/peers.py (the peers timed as their users run them) at toy sizes on the CPU: its control
flow end to end (fresh processes, prewarm, results file), a stand-in peer checked and compared,
and the time limit (the interpreter: a test of the script, not a measurement)."""

import json

import pytest
import torch

from bench.gpu import peers
from mambalearn.mamba2.step import selective_state_update
from mambalearn.mamba3 import mamba3_siso_combined


def by(rows, **match):
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


@pytest.mark.cpu
def test_the_smoke_run_times_ours_skips_the_peers_and_records(tmp_path, monkeypatch):
    monkeypatch.setenv("MAMBA_SSM_PATH", str(tmp_path / "absent"))
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "0")  # (main sets it: restored after the test)
    rows = peers.main(["--cpu-smoke", "--out", str(tmp_path)])
    for z in ("with z", "without z"):
        (check,) = by(rows, op="step check", z=z, backend="ours")
        assert check["check"] == "ok" and check["rel_err"] < 1e-2, check
        for k in peers.SMOKE["calls"]:
            (r,) = by(rows, op=f"step graph{k}", z=z, backend="ours")
            assert r["ms"] > 0 and "ratio" not in r, r
    # the Mamba-3 rows came back from two fresh processes, one a path
    for path in peers.M3_PATHS:
        (r,) = by(rows, op=f"mamba3 {path}", backend="ours")
        assert r["tuned_on"] == path and r["shape"] == "b1 l20 h1 p8 n8 fp32" and r["ms"] > 0
    (warm,) = by(rows, op="prewarm", backend="ours")
    assert warm["done"] == warm["jobs"] == 2 and warm["workers"] == 1  # ours: a job a path
    skipped = by(rows, backend="mamba_ssm")
    assert {r["op"] for r in skipped} == {"step", "mamba3"}
    assert all(r["error"].startswith("not timed") for r in skipped)
    assert not [r for r in rows if "error" in r and r.get("backend") != "mamba_ssm"]
    (path,) = tmp_path.glob("cpu_peers_*.json")
    saved = json.loads(path.read_text())
    assert saved["rows"] == rows and saved["meta"]["peers"] == {}
    assert saved["meta"]["command"] == "python3 -m bench.gpu.peers --cpu-smoke --out " + str(
        tmp_path)
    for r in saved["rows"]:
        assert all(isinstance(r[k], str) for k in ("op", "backend", "shape", "z", "tuned_on")
                   if k in r)
        assert all(isinstance(r[k], float) for k in ("ms", "ratio", "spread", "rel_err") if k in r)
    assert "mamba3 fwd+bwd" in peers.table(rows)


@pytest.mark.cpu
def test_a_peer_is_checked_before_it_is_timed():
    """Ours standing in for the peer: the checks pass (the same arithmetic), ratios come out;
    a peer that computes something else is caught by the check."""
    run = peers.Run(600, smoke=True)
    with torch.no_grad():
        peers.step_case(run, (1, 2, 4, 8), True, selective_state_update, calls=(1,))
    (check,) = by(run.rows, op="step check", backend="mamba_ssm")
    assert check["check"] == "ok" and check["state_rel_err"] < 1e-6
    (r,) = by(run.rows, op="step graph1", backend="ours")
    assert r["ratio"] > 0 and r["spread"] == 0.0  # one round on a CPU
    peers.m3_case(run, (1, 20), "fwd+bwd", mamba3_siso_combined, True)
    (check,) = by(run.rows, op="mamba3 fwd+bwd check")
    grads = [k for k in check if k.startswith("rel_err_d")]
    assert check["check"] == "ok" and len(grads) == 11, check
    assert all(check[k] < 1e-6 for k in grads + ["rel_err_out"])
    (r,) = by(run.rows, op="mamba3 fwd+bwd", backend="ours")
    assert r["ratio"] > 0 and r["tuned_on"] == "fwd+bwd"
    (r,) = by(run.rows, op="mamba3 fwd+bwd", backend="mamba_ssm")
    assert r["tune_s"] > 0 and "ratio" not in r
    off = lambda **kw: 1.1 * mamba3_siso_combined(**kw)
    peers.m3_case(run, (1, 20), "fwd", off, True)
    (check,) = by(run.rows, op="mamba3 fwd check")
    assert check["check"] == "FAILED: out" and check["rel_err_out"] == pytest.approx(0.1 / 1.1)


def test_parts_start_only_while_the_limit_leaves_them_time():
    run = peers.Run(0, smoke=True)
    peers.step_part(run)
    peers.m3_part(run, [((1, 20), "fwd"), ((1, 20), "fwd+bwd")])
    skipped = [r for r in run.rows if r.get("error") == "skipped: time limit"]
    assert [(r["op"], r.get("z")) for r in skipped] == [
        ("step", "with z"), ("step", "without z"), ("mamba3 fwd", None), ("mamba3 fwd+bwd", None)]
