"""The H200 script of chapter 15's MIMO prefill, run tiny on the CPU: agreement rows, a timing
row pair and its table (the interpreter: a test of the script, not a measurement)."""

import runpy
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.cpu
def test_the_mimo_script_runs_tiny_on_cpu():
    g = runpy.run_path(str(ROOT / "bench/gpu/mimo.py"), run_name="dry")
    dims = dict(g["SMOKE"], l=9)
    rows = g["agreement_rows"](2, dims, torch.float32, "cpu")
    assert len(rows) == 1 + len(g["NAMES"]) and all(r["rel_err"] < 1e-4 for r in rows)
    rows += g["timing_rows"](2, dict(dims, p=16, n=16), torch.float32, "cpu", warm_s=0.0,
                             rounds=1, rep=1)
    mimo = [r for r in rows if r.get("rank") == 2 and "ms" in r]
    assert {r["op"] for r in mimo} == {"fwd", "fwd+bwd"} and all(r["ms"] > 0 for r in mimo)
    assert "ours MIMO rank 2 (chunk 32)" in g["table"](rows)
