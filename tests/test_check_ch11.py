"""Chapter 11 checks: the ticket order and the state-passing step, run through random schedules."""

import pytest

from mambalearn import check
from mambalearn.check import ch11_fused


def chunk_major(t, n_chains, n_chunks):
    return t % n_chains, t // n_chains


def right_ops(c):
    return [("acquire", c), ("load", c), ("store", c + 1), ("release", c + 1)]


def test_passes_the_right_order_and_step(capsys):
    check.work_of_ticket(chunk_major)
    check.pass_state_ops(right_ops)
    assert capsys.readouterr().out.count("✓") == 2


@pytest.mark.parametrize("order, says", [
    (lambda t, h, c: (t % h, c - 1 - t // h), "DEADLOCK"),  # last chunks first, like program_id
    (lambda t, h, c: (t // c, t % c), "not the chunk-major order"),  # chain-major: safe but slow
    (lambda t, h, c: (0, t % c), "both get"),  # not a bijection
    (lambda t, h, c: [t % h, t // h, 0], "pair of ints"),
    (lambda t, h, c: (t % h, t // h + 1), "outside"),
])
def test_rejects_wrong_ticket_orders(order, says):
    with pytest.raises(AssertionError, match=says):
        check.work_of_ticket(order)


@pytest.mark.parametrize("ops, says", [
    (lambda c: [("acquire", c), ("load", c), ("release", c + 1), ("store", c + 1)],
     "before it was stored"),
    (lambda c: [("load", c), ("store", c + 1), ("release", c + 1)], "before it was stored"),
    (lambda c: [("acquire", c + 1), ("load", c), ("store", c + 1), ("release", c + 1)], "DEADLOCK"),
    (lambda c: [("acquire", c), ("load", c), ("store", c + 1)], "DEADLOCK"),
    (lambda c: [("acquire", c), ("store", c + 1), ("load", c), ("release", c + 1)],
     "before loading"),
    (lambda c: [("acquire", c), ("load", c), ("store", c), ("release", c + 1)],
     "never stored|wrong"),
    (lambda c: [("wait", c)], "kind one of"),
])
def test_rejects_wrong_state_passing(ops, says):
    with pytest.raises(AssertionError, match=says):
        check.pass_state_ops(ops)


def test_the_scheduler_itself_finds_the_notebook_deadlock():
    """Chapter 11's picture: program_id as the work index, programs started in reverse, 3 slots."""
    import random

    import torch

    reverse = [(0, c) for c in reversed(range(8))]
    with pytest.raises(AssertionError, match="DEADLOCK"):
        ch11_fused.simulate(reverse, [right_ops(c) for c in range(8)], 1, 8, 3, random.Random(0),
                            torch.Generator().manual_seed(0))
    box = ch11_fused.simulate(reverse, [right_ops(c) for c in range(8)], 1, 8, 9,
                              random.Random(0), torch.Generator().manual_seed(0))
    assert all(h is not None for h in box.H[0])  # enough slots: every program resident, it finishes


def test_not_implemented_passes_through():
    def stub(*args):
        raise NotImplementedError()

    for fn in (check.work_of_ticket, check.pass_state_ops):
        with pytest.raises(NotImplementedError):
            fn(stub)
