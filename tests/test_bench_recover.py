"""bench/gpu/recover.py reads a device run's logged rows back (types by key, values with spaces)."""

from bench.gpu import recover

LOG = "\n".join([
    "[   1.6s] step op=step, correct backend=ours default, float64 check "
    "shape=b1 h80 p64 n128 fp32 state rel_err=0.001648",
    "[  52.8s] mamba_ssm CUDA: ready",
    "[  62.6s] batch_one op=fwd backend=ours shape=b1 d2048 n16 l32768 tokens=32768 b=1 n=16 "
    "segments=8/2 ms=1.433 ratio=0.9591"])


def test_rows_come_back_with_their_types():
    rows = recover.parse(LOG)
    assert set(rows) == {"step", "batch_one"}  # the line without key=value is not a row
    assert rows["step"] == [{"op": "step, correct", "backend": "ours default, float64 check",
                             "shape": "b1 h80 p64 n128 fp32 state", "rel_err": 0.001648}]
    row = rows["batch_one"][0]
    assert row["tokens"] == 32768 and isinstance(row["b"], int) and row["segments"] == "8/2"
    assert row["ms"] == 1.433 and row["ratio"] == 0.9591
