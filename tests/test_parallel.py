"""Context parallelism (chapter 14) on real gloo process groups: all four algorithms, 2–4 ranks.

Each (world size, model) runs all its cases in one ``spawn`` (a few forked processes, tiny
shapes); each case is then compared, shard by shard, with the whole sequence computed in one
process — by the float64 oracle and by the same backend — outputs, every rank's last state and
every gradient (the initial state's included).
"""

import functools

import pytest
import torch

from mambalearn.model import resolve
from mambalearn.parallel import spawn
from mambalearn.parallel import verify as V
from mambalearn.scan.chunked import selective_scan_chunked

WORLDS = (2, 3, 4)
UNEQUAL = {2: (3, 6), 3: (2, 5, 4), 4: (5, 1, 3, 4)}  # a shard of one token at R = 4
ALGORITHMS = ("ring", "allgather", "logscan", "alltoall")


def no_initial_state(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                     return_last_state=False):
    """A backend without an initial-state input (like mamba_ssm's): the fix-up goes by linearity."""
    return selective_scan_chunked(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                  return_last_state, chunk_size=4)


def _cases(model, R):
    out, layouts = [], ("shared", "grouped", "fixed")
    for i, (alg, lengths) in enumerate((a, ls) for a in ALGORITHMS
                                       for ls in ((4,) * R, UNEQUAL[R])):
        if model == "mamba1":
            lay = layouts[i % 3]
            out.append(V.case("mamba1", lengths, alg, layout=lay, g=3 if lay == "grouped" else 1,
                              init=i % 2 == 0, seed=i))
        else:
            out.append(V.case("ssd", lengths, alg, g=(1, 2, 3)[i % 3], init=i % 2 == 0, seed=i))
    if model == "mamba1":  # float32 through chapter 07's recomputation; a backend without h₀
        out.append(V.case("mamba1", UNEQUAL[R], "allgather", backend="recompute",
                          dtype=torch.float32, seed=50))
        out += [V.case("mamba1", UNEQUAL[R], a, backend=no_initial_state, seed=60 + k)
                for k, a in enumerate(ALGORITHMS)]
    return out


def _work(rank, cases):
    return [V.run_rank(rank, c) for c in cases]


@functools.lru_cache(maxsize=None)
def _run(model, R):
    return spawn(_work, R, args=(_cases(model, R),), timeout=60)


def _ids(model):
    return [f"R{R}-{i}-{c['algorithm']}-{'eq' if len(set(c['lengths'])) == 1 else 'uneq'}"
            for R in WORLDS for i, c in enumerate(_cases(model, R))]


def _params(model):
    return [(R, i) for R in WORLDS for i in range(len(_cases(model, R)))]


@pytest.mark.parametrize("R, i", _params("mamba1"), ids=_ids("mamba1"))
def test_selective_scan_cp_equals_one_process(R, i):
    c = _cases("mamba1", R)[i]
    results = [r[i] for r in _run("mamba1", R)]
    V.compare(c, results, V.reference(c), what="vs the oracle: ")
    if isinstance(c["backend"], str):  # the same backend on the whole sequence, one process
        V.compare(c, results, V.reference(c, resolve(c["backend"], "mamba1")),
                  what="vs one process: ")


@pytest.mark.parametrize("R, i", _params("ssd"), ids=_ids("ssd"))
def test_ssd_cp_equals_one_process(R, i):
    c = _cases("ssd", R)[i]
    results = [r[i] for r in _run("ssd", R)]
    V.compare(c, results, V.reference(c), what="vs the oracle: ")
    V.compare(c, results, V.reference(c, resolve("chunked", "mamba2")), what="vs one process: ")


def test_cases_cover_what_they_claim():
    """Every algorithm with equal and unequal shards, every B/C layout, with and without h₀."""
    for model in ("mamba1", "ssd"):
        for R in WORLDS:
            cs = _cases(model, R)
            assert {c["algorithm"] for c in cs} == set(ALGORITHMS)
            assert {len(set(c["lengths"])) == 1 for c in cs} == {True, False}
            assert {c["init"] for c in cs} == {True, False}
            key = "layout" if model == "mamba1" else "g"
            assert len({c[key] for c in cs}) == 3
