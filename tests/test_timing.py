"""mambalearn.timing on a CPU: how often each timer calls, what it returns, what it refuses."""

import pytest

from mambalearn import timing


def counter():
    calls = []

    def fn():
        calls.append(1)
    return fn, calls


@pytest.mark.cpu
def test_time_ms_on_a_cpu_warms_once_then_takes_the_median():
    fn, calls = counter()
    assert timing.time_ms(fn) >= 0 and len(calls) == 1 + 3
    fn, calls = counter()
    assert timing.time_ms(fn, cpu_calls=5) >= 0 and len(calls) == 1 + 5
    fn, calls = counter()
    assert timing.time_ms(fn, cpu_calls=1) >= 0 and len(calls) == 1  # a smoke run: one call
    with pytest.raises(ValueError, match="cpu_calls"):
        timing.time_ms(fn, cpu_calls=0)


@pytest.mark.cpu
def test_compare_interleaves_and_takes_the_median_of_per_round_ratios():
    c = timing.Compared({"a": [1.0, 2.0, 9.0], "b": [2.0, 2.0, 3.0]})
    assert c.ms("a") == 2.0 and c.ms("b") == 2.0
    ratio, spread = c.ratio("a", "b")  # per round 0.5, 1, 3: median 1, spread (3 − 0.5) / 1
    assert ratio == 1.0 and spread == pytest.approx(2.5)
    order = []
    got = timing.compare({"x": lambda: order.append("x"), "y": lambda: order.append("y")},
                         warm_s=0.0, rounds=2)
    assert set(got.rounds) == {"x", "y"} and all(len(v) == 2 for v in got.rounds.values())
    timed = order[2:]  # after one warm call each: x's calls of a round, then y's, round by round
    assert timed == ["x"] * 4 + ["y"] * 4 + ["x"] * 4 + ["y"] * 4
    with pytest.raises(ValueError, match="rounds"):
        timing.compare({"x": lambda: None}, rounds=0)
