"""The attention-vs-Mamba device script: its control flow on a CPU at tiny sizes, its crossover."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu import attention

SCRIPT = Path(attention.__file__)


def test_crossover_is_the_first_length_where_attention_is_slower():
    rows = [dict(op="fwd", backend="attention", l=512, ms=1.0),
            dict(op="fwd", backend="mamba1", l=512, ms=2.0),
            dict(op="fwd", backend="mamba2", l=512, ms=1.5),
            dict(op="fwd", backend="attention", l=1024, ms=1.6),
            dict(op="fwd", backend="mamba2", l=1024, ms=1.5),
            dict(op="decode", backend="mamba2", l=0, ms=0.05),
            dict(op="decode", backend="attention", l=512, ms=0.01),
            dict(op="decode", backend="attention", l=8192, ms=0.2)]
    assert attention.crossover(rows, "fwd") == 1024
    assert attention.crossover(rows, "decode") == 8192
    assert attention.crossover(rows, "fwd+bwd") is None


@pytest.mark.slow
@pytest.mark.cpu
def test_cpu_smoke_run_writes_json_and_png(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "MAMBALEARN_PROGRESS": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    [recorded] = tmp_path.glob("cpu_attention_*.json")  # bench.gpu.record's file
    res = json.loads(recorded.read_text())
    meta = res["meta"]
    assert (tmp_path / "attention_cpu_smoke.png").stat().st_size > 10_000
    assert meta["cpu_smoke"] and meta["checks"]["ok"] and not meta["skipped"]
    assert meta["device"] == "cpu" and meta["command"].startswith("python3 -m bench.gpu.attention")
    got = {(r["op"], r["backend"]) for r in res["rows"]}
    want = {(op, b) for op in ("fwd", "fwd+bwd", "decode")
            for b in ("attention", "mamba1", "mamba2")}
    assert got == want
    assert all(r["ms"] > 0 and r["us_per_token"] > 0 for r in res["rows"])
    assert set(meta["crossover"]) == {"fwd", "fwd+bwd", "decode"}
