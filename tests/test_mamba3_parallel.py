"""Mamba-3 context parallel (chapter 15) on real gloo process groups: all four algorithms, 2–4
ranks, against one process (the float64 loop): outputs, every rank's four final states and every
gradient, the initial states' included. Each world size runs all its cases in one ``spawn``."""

import functools

import pytest
import torch

from mambalearn.mamba3 import verify as V3
from mambalearn.parallel import RankError, spawn
from mambalearn.parallel.verify import rank_slice

WORLDS = (2, 3, 4)
UNEQUAL = {2: (3, 6), 3: (2, 5, 4), 4: (5, 1, 3, 2)}  # a shard of one token at R = 4
ALGORITHMS = ("ring", "allgather", "logscan", "alltoall")


def _cases(R):
    return [V3.case(lengths, alg, h=12, g=(1, 2, 3)[i % 3], init=i % 2 == 0, seed=10 * R + i)
            for i, (alg, lengths) in enumerate((a, ls) for a in ALGORITHMS
                                               for ls in ((3,) * R, UNEQUAL[R]))]


@functools.lru_cache(maxsize=None)
def _run(R):
    return spawn(V3.run_cases, R, args=(_cases(R),), timeout=120)


def _id(R, c):
    return f"R{R}-{c['algorithm']}-{'eq' if len(set(c['lengths'])) == 1 else 'uneq'}"


@pytest.mark.parametrize("R, i", [(R, i) for R in WORLDS for i in range(len(_cases(R)))],
                         ids=[_id(R, c) for R in WORLDS for c in _cases(R)])
def test_mamba3_cp_equals_one_process(R, i):
    c = _cases(R)[i]
    V3.compare(c, [r[i] for r in _run(R)], V3.reference(c))


def test_cases_cover_what_they_claim():
    for R in WORLDS:
        cs = _cases(R)
        assert {c["algorithm"] for c in cs} == set(ALGORITHMS)
        assert {len(set(c["lengths"])) == 1 for c in cs} == {True, False}
        assert {c["init"] for c in cs} == {True, False} and len({c["g"] for c in cs}) == 3


@pytest.mark.cpu  # ranks on the CPU (gloo), kernels in the interpreter; GPUs: the NCCL tests
def test_the_triton_kernel_as_the_backend():
    """Chapter 15's kernels (the interpreter on a CPU) scan each shard from Input_States."""
    c = V3.case((5, 7), "logscan", backend="triton", dtype=torch.float32, chunk_size=16, n=16,
                na=4, seed=3)
    V3.compare(c, spawn(V3.run_rank, 2, args=(c,), timeout=300), V3.reference(c))


def _bad(rank, what):
    from mambalearn.mamba3.parallel import mamba3_siso_combined_cp

    c = V3.case((4, 4, 4), "alltoall" if what == "heads" else "allgather", h=4, g=1)
    x, states = V3.make_inputs(c)
    mine = {k: V3._shard(v, k, rank_slice(c, rank)) for k, v in x.items()}
    if what == "states":  # Input_States handed to every rank, not rank 0 alone
        return mamba3_siso_combined_cp(**mine, Input_States=states, algorithm="allgather")
    return mamba3_siso_combined_cp(**mine, algorithm=c["algorithm"])


@pytest.mark.parametrize("what, match", [("states", "on rank 0 only"),
                                         ("heads", "3 must divide h")])
def test_bad_input_is_the_same_clear_error_on_every_rank(what, match):
    with pytest.raises(RankError) as info:
        spawn(_bad, 3, args=(what,), timeout=30)
    assert sorted(info.value.errors) == [0, 1, 2]
    assert all(match in str(e) for e in info.value.errors.values())


def _lm_work(rank, algorithm, tokens):
    import torch.distributed as dist

    from mambalearn import model as M
    from mambalearn.mamba3 import parallel  # noqa: F401  (registers the Mamba-3 mixer)
    from mambalearn.mamba3.mixer import Mamba3Config
    from mambalearn.parallel.block import ContextParallelLM, all_reduce_grads

    torch.manual_seed(0)
    model = M.MambaLM(Mamba3Config(vocab_size=6, d_model=12, n_layers=2, d_state=4, headdim=4,
                                   chunk_size=4, backend="chunked")).double()
    mine = torch.tensor_split(tokens, dist.get_world_size(), dim=1)[rank]
    logits = ContextParallelLM(model, algorithm=algorithm)(mine)
    weights = torch.randn(*tokens.shape, 6, generator=torch.Generator().manual_seed(9),
                          dtype=torch.float64)
    (logits * torch.tensor_split(weights, dist.get_world_size(), dim=1)[rank]).sum().backward()
    all_reduce_grads(model)
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("R, algorithm", [(2, "logscan"), (3, "ring")])
def test_the_mamba3_lm_context_parallel_equals_the_model(R, algorithm):
    """Chapter 13's LM with Mamba-3 blocks on R shards: its logits and every parameter's
    gradient equal the model's on the whole sequence."""
    from mambalearn import model as M
    from mambalearn.mamba3.mixer import Mamba3Config
    from mambalearn.testing import assert_close

    tokens = torch.randint(0, 6, (2, 11), generator=torch.Generator().manual_seed(1))
    res = spawn(_lm_work, R, args=(algorithm, tokens), timeout=120)
    torch.manual_seed(0)
    model = M.MambaLM(Mamba3Config(vocab_size=6, d_model=12, n_layers=2, d_state=4, headdim=4,
                                   chunk_size=4, backend="chunked")).double()
    logits = model(tokens)
    weights = torch.randn(*tokens.shape, 6, generator=torch.Generator().manual_seed(9),
                          dtype=torch.float64)
    (logits * weights).sum().backward()
    assert_close(torch.cat([r[0] for r in res], 1), logits.detach())
    for name, p in model.named_parameters():
        assert_close(res[0][1][name], p.grad, grad=True, msg=name)


GPUS = torch.cuda.device_count()


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason="needs ≥ 2 CUDA GPUs (NCCL)")
@pytest.mark.parametrize("R", [r for r in (2, 4, 8) if r <= max(GPUS, 2)])
def test_mamba3_cp_on_gpus_equals_one_gpu(R):
    """Chapter 15's kernels on R GPUs (one process each, NCCL), every algorithm, vs the same
    kernel on one GPU: bf16 at h32 p64 n128, 512 tokens per rank."""
    from mambalearn.mamba3 import mamba3_siso_combined

    kw = dict(backend="triton", b=1, h=32, p=64, g=1, n=128, na=32, chunk_size=64,
              dtype=torch.bfloat16, device="cuda")
    cases = [V3.case((512,) * R, a, seed=i, **kw) for i, a in enumerate(ALGORITHMS)]
    results = spawn(V3.run_cases, R, backend="nccl", args=(cases,), timeout=300)
    for i, c in enumerate(cases):
        V3.compare(c, [r[i] for r in results], V3.reference(c, mamba3_siso_combined), norm=True)
