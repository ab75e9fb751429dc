"""The SSD bench topic runs end to end (CPU: interpreter, tiny shapes); its rows are well formed."""

import pytest
import torch

from course.bench import ssd as S


@pytest.mark.cpu
def test_run_cpu_rows_are_checked_against_the_oracle():
    rows = S.run(False)
    names = [r["backend"] for r in rows]
    assert names == [
        "ours unfused fwd",
        "ours fused fwd",
        "ours fused fwd q16",
        "ours fused fwd q16 one launch float32 state",
        "ours fused fwd q16 one launch float16 state",
        "ours fwd+bwd (bwd: PyTorch recompute)",
        "ours fwd+bwd",
    ]
    for r in rows:
        assert r["topic"] == "ssd" and r["ms"] is not None and r["ms"] > 0, r
    for r in rows[:5]:  # every forward agrees with the float32 oracle
        assert r["rel_err"] < (2e-3 if "float16" in r["backend"] else 1e-5), r


@pytest.mark.cpu
def test_gpu_branch_logic_on_cpu(monkeypatch):
    """The GPU path (several fused chunk sizes, floors, mamba_ssm absent) with CPU tensors."""
    monkeypatch.setenv("MAMBA_SSM_PATH", "/nonexistent/mamba_ssm")
    rows = S.run(
        True,
        shapes=[dict(b=1, l=20, h=2, p=4, g=1, n=8)],
        chunk=8,
        fused_chunks=(8, 16),
        dtype=torch.float32,
        device="cpu",
    )
    assert len(rows) == 2 + 2 * 3 + 2  # unfused, fused; 3 per extra chunk; fwd+bwd
    assert all(r["floor_pct"] is not None for r in rows[:8]) and rows[-1]["floor_pct"] is None
    assert all(r["ratio"] is None and r["ratio_fla"] is None for r in rows)  # no peers


def test_measure_records_a_crash():
    def boom():
        raise RuntimeError("out of memory")

    m = S._measure(boom)
    assert m["ms"] is None and "out of memory" in m["error"]


@pytest.mark.cpu
def test_precision_table_cpu():
    t = S.precision(False, shape=dict(b=1, l=64, h=2, p=8, g=1, n=8))
    designs = ("two launches", "one launch float32 state", "one launch float16 state")
    assert set(t) == {f"{d} q{q}" for d in designs for q in (32, 64)}
    for shares in t.values():
        assert 0 <= shares["tol 0"] <= shares["tol 0.001"] <= shares["tol 0.01"] <= 1
        assert shares["tol 0.01"] > 0.99 and shares["rel"] < 1e-3


def test_bench_json_and_plot(tmp_path):
    """`mambalearn bench TOPIC --json FILE` writes the rows and a bar chart of them."""
    import json

    from course import bench

    out = tmp_path / "bench.json"
    rows = bench.main(["step"], str(out))
    assert json.loads(out.read_text()) == rows and rows
    assert (tmp_path / "bench.png").stat().st_size > 1000
