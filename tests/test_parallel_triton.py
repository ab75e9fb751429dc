"""Context parallelism with the Triton kernels: under the CPU interpreter (tiny), and on ≥ 2 GPUs.

The Mamba-1 kernel gets its initial-state input and a differentiable last state in another branch;
until then the CP scan runs it forward by linearity and refuses to differentiate through a last
state without a gradient. The test below checks whichever of the two the kernel does.
"""

import pytest
import torch

from mambalearn.parallel import RankError, spawn
from mambalearn.parallel import verify as V
from mambalearn.parallel.selective import takes_initial_state

triton = pytest.importorskip("triton")

GPUS = torch.cuda.device_count()
several_gpus = pytest.mark.skipif(GPUS < 2, reason="needs ≥ 2 CUDA GPUs (NCCL)")


def _last_state_has_grad():
    from mambalearn.mamba1 import selective_scan_fn

    b, d, l, n = 1, 2, 3, 2
    u = torch.randn(b, d, l, requires_grad=True)
    _, last = selective_scan_fn(u, torch.rand(b, d, l), -torch.rand(d, n), torch.randn(b, n, l),
                                torch.randn(b, n, l), return_last_state=True)
    return last.requires_grad


def _run_no_grad(rank, c):
    from mambalearn.parallel import selective_scan_cp

    x, s = V.make_inputs(c), slice(sum(c["lengths"][:rank]), sum(c["lengths"][:rank + 1]))
    mine = {k: v[..., s] if k in V.TOKENS["mamba1"] and v.ndim > 2 else v for k, v in x.items()}
    if rank:
        mine["initial_state"] = None
    return selective_scan_cp(**mine, delta_softplus=True, return_last_state=True,
                             algorithm=c["algorithm"], backend="triton")


@pytest.mark.cpu  # ranks on the CPU (gloo), kernels in the interpreter; GPUs: the NCCL test
def test_triton_mamba1_backend_in_context_parallel():
    from mambalearn.mamba1 import selective_scan_fn

    c = V.case("mamba1", (2, 3), "allgather", backend="triton", b=1, d=4, n=2,
               dtype=torch.float32)
    with torch.no_grad():  # forward: by the kernel's initial state, or by linearity
        res = spawn(_run_no_grad, 2, args=(c,))
    want = V.reference(c)
    V.compare(c, [dict(out=o, last=h, grads={}) for o, h in res], dict(want, grads={}))
    if takes_initial_state(selective_scan_fn) and _last_state_has_grad():
        V.compare(c, spawn(V.run_rank, 2, args=(c,)), want)
    else:  # no gradient through the last state yet: a clear error on every rank, not a wrong one
        with pytest.raises(RankError, match="without a gradient") as e:
            spawn(V.run_rank, 2, args=(c,), timeout=30)
        assert sorted(e.value.errors) == [0, 1]


@pytest.mark.cpu  # as above
@pytest.mark.parametrize("algorithm", ["allgather", "alltoall"])
def test_triton_ssd_backend_in_context_parallel(algorithm):
    """The SSD kernels with initial_states in and final states out, gradients through both."""
    c = V.case("ssd", (5, 6), algorithm, backend="triton", b=1, h=2, p=4, n=4, g=1,
               chunk_size=4, dtype=torch.float32)
    V.compare(c, spawn(V.run_rank, 2, args=(c,), timeout=300), V.reference(c))


# ---------------------------------------------------------------------------------------------
# several GPUs, NCCL (issue 17's correctness part; not run on CPU-only machines)


def _gpu_cases(R):
    m1 = dict(b=2, d=2048, n=16, dtype=torch.bfloat16, device="cuda", backend="triton")
    ssd = dict(b=1, h=80, p=64, n=128, g=1, chunk_size=256, dtype=torch.bfloat16, device="cuda",
               backend="triton")
    algorithms = ("ring", "allgather", "logscan", "alltoall")
    cases = [V.case("ssd", (2048,) * R, a, **ssd) for a in algorithms]
    if _last_state_has_grad():
        cases += [V.case("mamba1", (2048,) * R, a, **m1) for a in algorithms]
    return cases


@pytest.mark.gpu
@several_gpus
@pytest.mark.parametrize("R", [r for r in (2, 4, 8) if r <= max(GPUS, 2)])
def test_context_parallel_on_gpus_equals_one_gpu(R):
    """Each algorithm on R GPUs (one process each, NCCL) vs the same kernel on one GPU."""
    from mambalearn.model import resolve

    cases = _gpu_cases(R)
    results = spawn(V.run_cases, R, backend="nccl", args=(cases,), timeout=300)
    for i, c in enumerate(cases):
        fn = resolve("triton", "mamba1" if c["model"] == "mamba1" else "mamba2")
        V.compare(c, [r[i] for r in results], V.reference(c, fn), norm=True)
