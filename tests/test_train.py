"""Chapter 13's task and training: the selective-copying batch, and a tiny model that learns it."""

import pytest
import torch

from mambalearn import model as M
from mambalearn import train as T

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def test_selective_copying_batch_layout():
    g = torch.Generator().manual_seed(10)
    x, y = T.selective_copying(5, n_data=3, n_blank=6, n_symbols=4, generator=g)
    assert x.shape == y.shape == (5, 12)
    for xi, yi in zip(x, y, strict=True):
        data = xi[:9][xi[:9] != T.BLANK]  # the symbols, in order of appearance
        assert len(data) == 3 and bool((data >= T.FIRST_DATA).all())
        assert xi[9] == T.SEP and torch.equal(xi[10:], data[:2])
        assert torch.equal(yi[9:], data) and bool((yi[:9] == -100).all())


# The CPU training run stated in chapter 13: seed 0, 150 steps, batch 32, lr 1e-2; the task has
# 3 symbols (of 4) among 6 blanks. Chance is loss ln 4 ≈ 1.39, accuracy 0.25.
# Measured on the 2-core dev box: ~7 s; final training loss 0.11, held-out accuracy 0.96.
CPU_RUN = dict(steps=150, batch=32, lr=1e-2, task=dict(n_data=3, n_blank=6, n_symbols=4), seed=0)
CPU_THRESHOLD = dict(loss=0.35, acc=0.9)


def test_tiny_model_learns_selective_copying_on_cpu():
    torch.manual_seed(0)
    m = M.MambaLM(M.MambaConfig(vocab_size=6, d_model=32, n_layers=2, d_state=8))
    hist = T.train(m, progress=False, log_every=25, **CPU_RUN)
    loss, acc = T.evaluate(m.eval(), task=CPU_RUN["task"])
    assert hist["loss"][0] > 1.0  # it started near chance
    assert loss < CPU_THRESHOLD["loss"] and acc > CPU_THRESHOLD["acc"], (loss, acc, hist["seconds"])
    assert hist["seconds"] < 60
