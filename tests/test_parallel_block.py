"""spawn, the conv halo, the context-parallel Mamba blocks and LM, and bad input on every rank."""

import os
import time

import pytest
import torch
import torch.distributed as dist

from mambalearn import inference, ops
from mambalearn import model as M
from mambalearn.parallel import RankError, spawn
from mambalearn.parallel import verify as V
from mambalearn.parallel.block import ContextParallelLM, all_reduce_grads, conv_halo, train_cp
from mambalearn.testing import assert_close
from mambalearn.train import train

# ---------------------------------------------------------------------------------------------
# spawn


def _env_and_rank(rank):
    return rank, dist.get_world_size(), os.environ.get("NCCL_NVLS_ENABLE"), \
        torch.full((2,), float(rank))


def test_spawn_returns_every_rank_in_order_with_nvls_off():
    out = spawn(_env_and_rank, 3)
    assert [o[:3] for o in out] == [(r, 3, "0") for r in range(3)]
    assert_close(torch.stack([o[3] for o in out]), torch.arange(3.0)[:, None].expand(3, 2))


def _fail_on_odd(rank):
    if rank % 2:
        raise KeyError(f"rank {rank} fails")
    return rank


def test_spawn_reports_the_exception_of_every_failed_rank():
    with pytest.raises(RankError) as e:
        spawn(_fail_on_odd, 4)
    assert sorted(e.value.errors) == [1, 3]
    assert all(isinstance(x, KeyError) for x in e.value.errors.values())


def _hang(rank):
    if rank == 1:
        dist.recv(torch.empty(1), src=0)  # rank 0 never sends
    else:
        time.sleep(30)


def test_spawn_ends_a_hang_with_the_collective_timeout():
    t = time.monotonic()
    with pytest.raises((RankError, TimeoutError)):
        spawn(_hang, 2, timeout=2, grace=2)
    assert time.monotonic() - t < 15


def test_spawn_rejects_bad_arguments():
    with pytest.raises(ValueError, match="world_size"):
        spawn(_env_and_rank, 0)
    with pytest.raises(ValueError, match="backend"):
        spawn(_env_and_rank, 2, backend="mpi")
    with pytest.raises(ValueError, match="start_method"):
        spawn(_env_and_rank, 2, start_method="forkserver")


def test_fresh_processes_run_notebook_functions_and_backward():
    """start_method="spawn" (the default wherever CUDA is): a function defined in a notebook's
    namespace (module "__main__", no file) and a closure travel by value; each rank runs a
    backward after the parent ran one (what a forked child cannot do on a GPU machine)."""
    w = torch.randn(3, requires_grad=True)
    (w * w).sum().backward()  # the parent's autograd engine has run
    scale = torch.tensor([2.0, -1.0, 0.5])
    ns = {"torch": torch, "ops": ops, "scale": scale, "__name__": "__main__"}
    exec("def grad_of_rank(rank):\n"  # (torch and a name `ops`: cloudpickle meets torch.ops)
         "    v = (torch.arange(3.0) + rank).requires_grad_()\n"
         "    (scale * ops.apply((v, 0 * v), v)).sum().backward()\n"
         "    return v.grad\n", ns)
    got = spawn(ns["grad_of_rank"], 2, start_method="spawn", timeout=60)
    for r, g in enumerate(got):
        assert_close(g, 2 * scale * (torch.arange(3.0) + r))


# ---------------------------------------------------------------------------------------------
# the conv halo


def _halo_work(rank, lengths, k):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, sum(lengths), generator=g, dtype=torch.float64)
    w, bias = torch.randn(3, k, generator=g, dtype=torch.float64), torch.randn(3, generator=g,
                                                                               dtype=torch.float64)
    g_out = torch.randn(x.shape, generator=g, dtype=torch.float64)
    lo = sum(lengths[:rank])
    mine = x[..., lo:lo + lengths[rank]].clone().requires_grad_()
    halo = conv_halo(mine, k)
    out, _ = inference.causal_conv1d(mine, w, bias, torch.nn.functional.pad(halo, (1, 0)))
    (out * g_out[..., lo:lo + lengths[rank]]).sum().backward()
    return out.detach(), mine.grad


@pytest.mark.parametrize("lengths", [(5, 4), (3, 6, 4), (3, 3, 5, 3)])
def test_conv_halo_gives_the_whole_sequence_conv_and_its_gradient(lengths):
    k = 4
    res = spawn(_halo_work, len(lengths), args=(lengths, k))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, sum(lengths), generator=g, dtype=torch.float64).requires_grad_()
    w, bias = torch.randn(3, k, generator=g, dtype=torch.float64), torch.randn(3, generator=g,
                                                                               dtype=torch.float64)
    g_out = torch.randn(x.shape, generator=g, dtype=torch.float64)
    want, _ = inference.causal_conv1d(x, w, bias)
    (want * g_out).sum().backward()
    assert_close(torch.cat([r[0] for r in res], -1), want.detach())
    assert_close(torch.cat([r[1] for r in res], -1), x.grad, grad=True)


# ---------------------------------------------------------------------------------------------
# the model, context parallel


def _cfg(block):
    return M.MambaConfig(vocab_size=6, d_model=12, n_layers=2, d_state=4, block=block, headdim=4,
                         ngroups=1, chunk_size=4)


def _lm_work(rank, block, algorithm, tokens):
    torch.manual_seed(0)
    model = M.MambaLM(_cfg(block)).double()
    cp = ContextParallelLM(model, algorithm=algorithm)
    mine = torch.tensor_split(tokens, dist.get_world_size(), dim=1)[rank]
    logits = cp(mine)
    g = torch.Generator().manual_seed(9)
    weights = torch.tensor_split(torch.randn(*tokens.shape, 6, generator=g, dtype=torch.float64),
                                 dist.get_world_size(), dim=1)[rank]
    (logits * weights).sum().backward()
    all_reduce_grads(model)
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("block, R, algorithm", [("mamba1", 2, "ring"), ("mamba1", 3, "alltoall"),
                                                 ("mamba2", 2, "alltoall"),
                                                 ("mamba2", 3, "allgather")])
def test_context_parallel_lm_equals_the_model(block, R, algorithm):
    """Logits and every parameter's gradient: the CP model on R shards vs the model on all."""
    tokens = torch.randint(0, 6, (2, 13), generator=torch.Generator().manual_seed(1))
    res = spawn(_lm_work, R, args=(block, algorithm, tokens))
    torch.manual_seed(0)
    model = M.MambaLM(_cfg(block)).double().set_backend("chunked")
    logits = model(tokens)
    g = torch.Generator().manual_seed(9)
    (logits * torch.randn(*tokens.shape, 6, generator=g, dtype=torch.float64)).sum().backward()
    assert_close(torch.cat([r[0] for r in res], 1), logits.detach())
    for name, p in model.named_parameters():
        assert_close(res[0][1][name], p.grad, grad=True, msg=name)


def _train_work(rank, block, algorithm, run):
    torch.manual_seed(0)
    return train_cp(ContextParallelLM(M.MambaLM(_cfg(block)), algorithm=algorithm), **run)


@pytest.mark.parametrize("block", ["mamba1", "mamba2"])
def test_training_context_parallel_follows_one_process(block):
    run = dict(steps=6, batch=8, lr=1e-2, seed=0, log_every=1,
               task=dict(n_data=3, n_blank=6, n_symbols=4))
    hist = spawn(_train_work, 2, args=(block, "allgather", run))
    torch.manual_seed(0)
    model = M.MambaLM(_cfg(block)).set_backend("chunked")
    want = train(model, progress=False, **run)
    assert hist[0]["loss"] == hist[1]["loss"]  # every rank reports the global loss
    assert_close(torch.tensor(hist[0]["loss"]), torch.tensor(want["loss"]))


# ---------------------------------------------------------------------------------------------
# bad input: the same clear error on every rank, fast (no collective timeout)


def _bad(rank, what):
    from mambalearn.parallel import mamba_chunk_scan_combined_cp, selective_scan_cp

    d = 5 if what == "d disagrees" and rank == 1 else 4
    lengths = (3, 4, 2, 3)
    c = V.case("mamba1", lengths[:dist.get_world_size()], d=d)
    x = {k: v for k, v in V.make_inputs(c).items()}
    x["initial_state"] = None
    kw = dict(algorithm="alltoall" if what == "indivisible" else "allgather")
    if what == "offsets":  # rank 1 claims to start at token 0: not contiguous after rank 0
        kw["offset"] = [0, 0, 7, 9][rank]
    if what == "local" and rank == 1:
        x["delta"] = x["delta"][..., :-1]
    if what == "not a tensor" and rank == 1:
        x["u"] = x["u"].tolist()
    if what == "h0 off rank 0" and rank == 1:
        x["initial_state"] = torch.zeros(2, 4, 3, dtype=torch.float64)
    if what.startswith("one rank's ") and rank == 1:  # valid locally, not with the others
        name = what.split()[2]
        x[name] = x[name].float() if what.endswith("dtype") else x[name] * 2
    if what == "algorithms differ":
        kw["algorithm"] = ("ring", "allgather")[rank % 2]
    if what.startswith("ssd"):
        s = V.case("ssd", lengths[:dist.get_world_size()], h=5 if "indivisible" in what else 4)
        y = V.make_inputs(s)
        y["initial_states"] = None
        if what == "ssd one rank's dt dtype" and rank == 1:
            y["dt"] = y["dt"].float()
        return mamba_chunk_scan_combined_cp(
            **y, chunk_size=4, algorithm="alltoall" if "indivisible" in what else "allgather")
    return selective_scan_cp(**x, **kw)


@pytest.mark.parametrize("what, R, match", [
    ("d disagrees", 2, "disagree on d"),
    ("offsets", 3, "not contiguous"),
    ("local", 3, "rank 1: ValueError: delta"),
    ("not a tensor", 2, "rank 1: TypeError: u must be a torch.Tensor"),
    ("h0 off rank 0", 2, "rank 0 only"),
    ("indivisible", 3, "3 must divide d"),
    ("ssd indivisible", 2, "2 must divide h"),
    ("one rank's delta dtype", 2, "disagree on delta"),
    ("one rank's B dtype", 3, "disagree on B"),
    ("one rank's A values", 2, "disagree on A"),
    ("one rank's D values", 2, "disagree on D"),
    ("algorithms differ", 2, "disagree on algorithm"),
    ("ssd one rank's dt dtype", 2, "disagree on dt"),
])
def test_bad_input_raises_the_same_error_on_every_rank(what, R, match):
    t = time.monotonic()
    with pytest.raises(RankError) as e:
        spawn(_bad, R, args=(what,), timeout=20)
    assert sorted(e.value.errors) == list(range(R)), "every rank must raise"
    for err in e.value.errors.values():
        assert isinstance(err, ValueError) and match in str(err), err
    assert time.monotonic() - t < 15, "the error must come from the checks, not a timeout"


def test_a_group_of_one_and_an_unknown_algorithm_are_refused():
    for what, match in (("one", "≥ 2 ranks"), ("algorithm", "algorithm must be one of")):
        def work(rank, what=what):
            from mambalearn.parallel import selective_scan_cp

            x = V.make_inputs(V.case("mamba1", (3,)))
            return selective_scan_cp(**x, algorithm="tree" if what == "algorithm" else "ring")

        with pytest.raises(RankError, match=match):
            spawn(work, 1 if what == "one" else 2, timeout=20)
