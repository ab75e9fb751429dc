"""Serving a recurrent model: speculative decoding with both rollbacks equals greedy decoding,
a slot pool with preemption equals each sequence alone, the functional step equals the step."""

import pytest
import torch

from mambalearn import inference, serving
from mambalearn import model as M
from mambalearn.scan.sequential import selective_scan_sequential
from mambalearn.testing import assert_close


def tiny(seed=0):
    torch.manual_seed(seed)
    return M.MambaLM(M.MambaConfig(vocab_size=9, d_model=8, n_layers=2, d_state=3)).eval()


@pytest.mark.parametrize("rollback", ["checkpoint", "rerun"])
@pytest.mark.parametrize("agree", [1.0, 0.6, 0.0])
def test_speculative_decoding_is_greedy_decoding(rollback, agree):
    m = tiny()
    prompt = torch.randint(0, 9, (1, 5), generator=torch.Generator().manual_seed(1))
    want = m.generate(prompt, 11)[0]
    g = torch.Generator().manual_seed(2)

    def draft(pos, k):  # right with probability `agree`, else a random token
        right = want[pos:pos + k]
        wrong = torch.randint(0, 9, right.shape, generator=g)
        return torch.where(torch.rand(right.shape, generator=g) < agree, right, wrong)

    got, stats = serving.speculative_generate(m, prompt, 11, draft, k=4, rollback=rollback)
    assert torch.equal(got, want)
    assert stats["peak_copies"] == (5 if rollback == "checkpoint" else 1)
    if agree == 1.0:
        assert stats["accepted"] >= 8 and stats["rounds"] == 3  # 4 + 1 bonus token a round


def test_rerun_costs_steps_checkpoint_costs_copies():
    m = tiny()
    prompt = torch.tensor([[1, 2, 3]])
    want = m.generate(prompt, 9)[0]
    draft = lambda pos, k: torch.cat([want[pos:pos + k - 1], torch.tensor([0])])[:k]
    _, ck = serving.speculative_generate(m, prompt, 9, draft, k=3, rollback="checkpoint")
    _, rr = serving.speculative_generate(m, prompt, 9, draft, k=3, rollback="rerun")
    assert rr["steps"] == ck["steps"] + rr["accepted"] and rr["accepted"] == ck["accepted"] > 0
    assert rr["replayed"] == rr["accepted"] and ck["replayed"] == 0  # every round rejects its last
    assert ck["copy_bytes"] > rr["copy_bytes"]


def test_speculative_errors():
    m = tiny()
    with pytest.raises(ValueError, match="rollback"):
        serving.speculative_generate(m, torch.tensor([[1]]), 2, None, rollback="truncate")
    with pytest.raises(ValueError, match="one sequence"):
        serving.speculative_generate(m, torch.tensor([[1], [2]]), 2, None)


def test_a_pool_with_preemption_equals_each_sequence_alone():
    g = torch.Generator().manual_seed(0)
    d, n = 3, 2
    A = -torch.rand(d, n, generator=g) - 0.1
    seqs = [[torch.randn(d, l, generator=g), torch.rand(d, l, generator=g),
             torch.randn(n, l, generator=g), torch.randn(n, l, generator=g)] for l in (5, 4, 6)]
    want = [selective_scan_sequential(*(t[None] for t in s[:2]), A, *(t[None] for t in s[2:]))[0]
            for s in seqs]
    pool = serving.StatePool(2, d, n)
    slot = {0: pool.admit(), 1: pool.admit()}
    t_of = {0: 0, 1: 0, 2: 0}
    out = {i: [] for i in range(3)}

    def tick(active):
        rows = [slot[i] for i in active] + [-1]  # an empty row in the batch too
        take = lambda j: torch.stack([seqs[i][j][:, t_of[i]] for i in active] +
                                     [torch.zeros_like(seqs[0][j][:, 0])])
        y = pool.step(rows, take(0), take(1), A, take(2), take(3))
        assert torch.equal(y[-1], torch.zeros(d))
        for r, i in enumerate(active):
            out[i].append(y[r])
            t_of[i] += 1

    tick([0, 1])
    tick([0, 1])
    saved = pool.swap_out(slot[0])  # request 0 preempted: request 2 takes its slot
    slot[2] = pool.admit()
    with pytest.raises(RuntimeError, match="slots are taken"):
        pool.admit()
    for _ in range(2):
        tick([1, 2])
    pool.release(slot[1])
    slot[0] = pool.swap_in(saved)  # back, in another slot
    while t_of[0] < 5 or t_of[2] < 6:
        tick([i for i in (0, 2) if t_of[i] < (5, 4, 6)[i]])
    for i in range(3):
        assert_close(torch.stack(out[i], -1), want[i])


def test_the_functional_step_is_the_step_and_touches_nothing():
    g = torch.Generator().manual_seed(3)
    b, d, n = 2, 4, 3
    args = (torch.randn(b, d, generator=g), torch.rand(b, d, generator=g),
            -torch.rand(d, n, generator=g), torch.randn(b, n, generator=g),
            torch.randn(b, n, generator=g), torch.randn(d, generator=g))
    state = torch.randn(b, d, n, generator=g)
    before = state.clone()
    y, h = serving.step_functional(state, *args)
    assert torch.equal(state, before)
    y_ref = inference.decode_step(before, *args)
    assert_close(y, y_ref)
    assert_close(h, before)


def test_cache_follows_each_layer_device():
    m = tiny()
    m.layers[1].to("meta")
    cache = serving.cache_on_layer_devices(m, 2)
    assert [c.ssm_state.device.type for c in cache.layers] == ["cpu", "meta"]
    assert m.empty_cache(2).layers[1].ssm_state.device.type == "cpu"  # the pitfall
