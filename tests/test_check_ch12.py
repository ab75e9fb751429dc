"""The chapter 12 check passes the library's decode step and rejects the wrong versions."""

import pytest
import torch

from mambalearn import check, inference


def solution(state, x, delta, A, B, C, D):
    return inference.decode_step(state, x, delta, A, B, C, D)


def stub(state, x, delta, A, B, C, D):
    raise NotImplementedError


def forgets_D(state, x, delta, A, B, C, D):
    return inference.decode_step(state, x, delta, A, B, C)  # no skip connection


def reads_old_state(state, x, delta, A, B, C, D):
    # y from h_{t−1}: the output is read before the state is updated (one step late)
    y = (state * C[:, None, :]).sum(-1) + D * x
    Bx = delta[..., None] * B[:, None] * x[..., None]
    state.copy_(torch.exp(delta[..., None] * A) * state + Bx)
    return y


def overwrites_state_before_reading_it(state, x, delta, A, B, C, D):
    # the new input is written into the state first, then that (not h_{t−1}) is decayed
    state.copy_(delta[..., None] * B[:, None] * x[..., None])
    state.mul_(torch.exp(delta[..., None] * A)).add_(delta[..., None] * B[:, None] * x[..., None])
    return (state * C[:, None, :]).sum(-1) + D * x


def not_in_place(state, x, delta, A, B, C, D):
    state = torch.exp(delta[..., None] * A) * state + delta[..., None] * B[:, None] * x[..., None]
    return (state * C[:, None, :]).sum(-1) + D * x  # right y, but the cache never changes


def euler_decay(state, x, delta, A, B, C, D):
    state.copy_((1 + delta[..., None] * A) * state + delta[..., None] * B[:, None] * x[..., None])
    return (state * C[:, None, :]).sum(-1) + D * x


def bf16_decay(state, x, delta, A, B, C, D):
    A_bar = torch.exp(delta[..., None] * A).to(torch.bfloat16).to(state.dtype)  # rounded Ā
    state.copy_(A_bar * state + delta[..., None] * B[:, None] * x[..., None])
    return (state * C[:, None, :]).sum(-1) + D * x


def test_passes_the_library_step(capsys):
    check.decode_step(solution)
    assert "decode_step: all" in capsys.readouterr().out


def test_stub_raises_not_implemented():
    with pytest.raises(NotImplementedError):
        check.decode_step(stub)


@pytest.mark.parametrize("wrong", [forgets_D, reads_old_state, overwrites_state_before_reading_it,
                                   not_in_place, euler_decay, bf16_decay])
def test_rejects_wrong_versions(wrong):
    with pytest.raises(AssertionError):
        check.decode_step(wrong)


def test_message_says_in_place():
    with pytest.raises(AssertionError, match="in place"):
        check.decode_step(not_in_place)


@pytest.mark.parametrize("wrong, says", [(reads_old_state, "old state"),
                                         (forgets_D, r"skip term D·x is missing")])
def test_names_the_part_of_y_that_differs(wrong, says):
    """Issue 19 §1.8: one message per bug, not "the output y is wrong" for both."""
    with pytest.raises(AssertionError, match=says):
        check.decode_step(wrong)


def decays_in_float32(state, x, delta, A, B, C, D):
    # Ā rounded to float32 on float64 inputs: right to 7 digits, wrong at float64's tolerance
    A_bar = torch.exp((delta[..., None] * A).float()).to(state.dtype)
    state.copy_(A_bar * state + delta[..., None] * B[:, None] * x[..., None])
    return (state * C[:, None, :]).sum(-1) + D * x


def test_a_float32_step_is_told_it_is_a_precision_fault():
    """"expected -0.12941, got -0.12941" cannot happen: the values are printed to the digit that
    differs, with the tolerance, and a result right only to float32 precision is named as such."""
    with pytest.raises(AssertionError) as e:
        check.decode_step(decays_in_float32)
    text = str(e.value)
    assert "precision" in text and "float32" in text and "allowed" in text, text
    line = next(s for s in text.splitlines() if s.startswith("first wrong index"))
    want, got = (s.split(",")[0] for s in line.split("expected ")[1].split("got "))
    assert want.strip() != got.strip(), line
