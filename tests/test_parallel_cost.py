"""The α–β cost model of chapter 14, and a CPU dry run of its GPU timing script."""

import runpy
from pathlib import Path

import pytest
import torch

from mambalearn.parallel import cost

ROOT = Path(__file__).resolve().parent.parent


def test_collectives_follow_their_formulas():
    net = cost.Network(alpha=1e-5, beta=1e9)
    assert cost.p2p(net, 1e6) == pytest.approx(1e-5 + 1e-3)
    # NCCL's all-gather is a ring: R − 1 latencies; PAT (one GPU per node): ⌈log₂R⌉
    assert cost.all_gather(net, 8, 1e6) == pytest.approx(7e-5 + 7e-3)
    pat = cost.Network(alpha=1e-5, beta=1e9, allgather="pat")
    assert cost.all_gather(pat, 8, 1e6) == pytest.approx(3e-5 + 7e-3)
    assert cost.all_gather(pat, 5, 1e6) == pytest.approx(3e-5 + 4e-3)  # ⌈log₂5⌉ = 3
    assert cost.all_to_all(net, 4, 4e6) == pytest.approx(3e-5 + 3e-3)
    assert [cost.rounds(R) for R in (1, 2, 3, 4, 5, 1024, 1025)] == [0, 1, 2, 2, 3, 10, 11]
    with pytest.raises(ValueError, match="allgather must be 'ring' or 'pat'"):
        cost.all_gather(cost.Network(1e-5, 1e9, allgather="tree"), 4, 1.0)


def test_step_times_add_compute_and_communication():
    w = cost.Workload("w", state=1000, decay=10, inputs_bytes=3e6, output_bytes=1e6,
                      shared_bytes=1e5, t_fwd=1e-3, t_bwd=2e-3)
    net = cost.Network(alpha=1e-5, beta=1e9)
    ring = cost.step_time(w, 4, "ring", net)
    assert ring["fwd"] == pytest.approx(2e-3 + 3 * (1e-5 + 4000 / 1e9))
    assert ring["fwd_bwd"] == pytest.approx(ring["fwd"] + 4e-3 + ring["comm_bwd"])
    ag = cost.step_time(w, 4, "allgather", net)
    assert ag["comm_fwd"] == pytest.approx(3e-5 + 3 * 4040 / 1e9)
    scan = cost.step_time(w, 5, "logscan", net)  # ⌈log₂5⌉ = 3 rounds of one summary and one ⊗
    assert scan["comm_fwd"] == pytest.approx(3 * (1e-5 + 4040 / 1e9 + cost.combine_time(w)))
    assert scan["fwd"] - scan["comm_fwd"] == pytest.approx(2 * w.t_fwd)
    assert cost.combine_time(w, bandwidth=1e9) == pytest.approx(3 * 4040 / 1e9)
    assert scan["memory"] == 3 * 4040 < cost.step_time(w, 5, "allgather", net)["memory"]
    a2a = cost.step_time(w, 4, "alltoall", net)
    assert a2a["fwd"] - a2a["comm_fwd"] == pytest.approx(w.t_fwd)  # one scan, not two
    assert cost.step_time(w, 4, "serial", net)["fwd"] > 4 * w.t_fwd
    with pytest.raises(ValueError, match="algorithm"):
        cost.step_time(w, 4, "tree", net)


def test_winners_at_the_chapter_shapes():
    """All-to-all sends tokens and scans once: it wins inside a node; beyond, the log-depth scan
    of the summaries wins (its latency and bytes grow with log R, the ring's and the all-gather's
    with R)."""
    for w in (cost.mamba1(32768), cost.ssd(32768)):
        best = dict((R, name) for R, name, _ in cost.winners(w, [2, 8, 64, 1024]))
        assert best[2] == best[8] == "alltoall"
        assert best[64] == best[1024] == "logscan"
        t = {a: cost.step_time(w, 1024, a)["fwd_bwd"] for a in ("ring", "allgather", "logscan")}
        assert t["logscan"] < t["ring"] < t["allgather"]


@pytest.mark.cpu
def test_the_gpu_script_runs_tiny_on_cpu():
    g = runpy.run_path(str(ROOT / "bench/gpu/parallel.py"), run_name="dry")
    f32 = torch.float32
    rows = []
    g["accuracy_rows"](rows, l=8, m1=dict(b=1, d=2, n=2, dtype=f32),
                       s=dict(b=1, h=2, p=4, n=4, g=1, chunk=4, dtype=f32), dev="cpu")
    g["mamba1_rows"](rows, lengths=(8,), dims=dict(b=1, d=2, n=2, dtype=f32), dev="cpu")
    g["rank_scan_rows"](rows, ranks=(4,), m1=dict(b=1, d=2, n=2),
                        s=dict(b=1, h=2, p=4, n=4), dev="cpu")
    assert rows[0]["out"] < 1e-5 and rows[0]["final"] < 1e-5  # SSD from a state vs the oracle
    assert any(r.get("tokens") == 8 and r["fwd"] > 0 for r in rows)
    assert "mamba1" in g["table"](rows)


def test_the_summary_scan_follows_its_measured_table():
    w = cost.ssd(32768)
    for R, ms in cost.SSD_SUMMARY.items():
        assert cost.summary_time(w, R) == pytest.approx(ms * 1e-3)
    ts = [cost.summary_time(w, R) for R in (2, 8, 16, 64, 300, 1024, 4096)]
    assert ts == sorted(ts) and ts[-1] == pytest.approx(4 * ts[-2])  # ∝ R beyond the table
    assert cost.summary_time(w, 1) == 0.0
    net = cost.Network(alpha=1e-5, beta=1e9)
    bare = cost.Workload("w", w.state, w.decay, w.inputs_bytes, w.output_bytes, w.shared_bytes,
                         w.t_fwd, w.t_bwd)
    gap = cost.step_time(w, 64, "allgather", net)["fwd"] - cost.step_time(bare, 64, "allgather",
                                                                          net)["fwd"]
    assert gap == pytest.approx(cost.summary_time(w, 64))
    assert cost.ssd(32768, h=160).summary_scan[8] == pytest.approx(2 * cost.SSD_SUMMARY[8])
