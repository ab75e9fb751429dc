"""What every check shares, run as a student runs it (no grader): a failure names a seed that
replays the same case, hints come one more per failure of the same kind, the check's own tensors
are private (an input changed in place fails, and cannot change the expected answer), a non-tensor
result is named.
And the kinds of faked evidence: a loop reporting Blelloch's counts, a PyTorch loop behind a dummy
Triton launch, numpy behind a launch, autograd standing in for a hand-derived backward."""

import re

import numpy as np
import pytest
import torch

from mambalearn import check, device, discretize
from mambalearn.check import _core
from mambalearn.scan.layout import ScanCounter
from mambalearn.scan.sequential import linear_scan_sequential


def euler_zoh(A, B, delta):
    delta = torch.as_tensor(delta, dtype=A.dtype)
    if A.ndim == 1:
        return 1 + delta[..., None] * A, delta[..., None] * B
    return torch.eye(len(B), dtype=A.dtype) + delta[..., None, None] * A, delta[..., None] * B


def failure(fn, *args, **kwargs):
    with pytest.raises(AssertionError) as e:
        fn(*args, **kwargs)
    return str(e.value)


def test_a_failure_replays_with_its_seed_and_hints_come_one_by_one():
    _core.FAILURES.clear()
    first = failure(check.zoh, euler_zoh)
    seed = int(re.search(r"replay this case: check\.zoh\(euler_zoh, seed=(\d+)\)", first).group(1))
    assert "hint 1 of 3:" in first and "hint 2 of 3" not in first
    again = failure(check.zoh, euler_zoh, seed=seed)
    assert again.split("\nreplay")[0] == first.split("\nreplay")[0], "the same case, replayed"
    assert "hint 1 of 3:" in again and "hint 2 of 3:" in again
    other = failure(check.zoh, euler_zoh, seed=seed + 1)
    assert other.split("\nreplay")[0] != first.split("\nreplay")[0], "another seed, other inputs"


def test_hints_escalate_per_kind_of_failure_not_per_run():
    """Trying things out does not run through the hints: a crash, then a wrong value, then a
    wrong shape each get the first hint; only the same failure again gets the next; a pass
    starts the count again."""
    _core.FAILURES.clear()
    crash = lambda A, B, delta: 1 / 0
    shape = lambda A, B, delta: (A.sum(), B)  # a scalar for A_bar
    assert "hint 1 of 3:" in failure(check.zoh, euler_zoh)
    for wrong in (crash, shape):
        text = failure(check.zoh, wrong)
        assert "hint 1 of 3:" in text and "hint 2 of 3" not in text, text
    assert "hint 2 of 3:" in failure(check.zoh, crash)
    assert "hint 3 of 3" not in failure(check.zoh, shape)
    check.zoh(discretize.zoh)
    assert "hint 2 of 3" not in failure(check.zoh, crash)
    kinds = [_core.failure_kind(m) for m in (
        "the state h is wrong on b2 l7: …", "the state h is wrong on b3 l11: …",
        "f raised ZeroDivisionError on case 1: division by zero",
        "y on x: expected shape (2,), got (3,)")]
    assert kinds[0] == kinds[1] != kinds[2] != kinds[3]


def test_every_task_has_hints():
    for name in check.__all__:
        if name != "tree_order":
            assert len(getattr(check, name).hints) >= 2, name


def test_an_input_changed_in_place_fails_and_cannot_fake_the_answer():
    def zeroing_zoh(A, B, delta):  # zeroes the check's tensors, returns zeros: "equal" after all
        A.data.zero_(), B.data.zero_()
        return torch.zeros_like(A), torch.zeros_like(B)

    assert "changed its argument `A` in place" in failure(check.zoh, zeroing_zoh)

    def scaling_scan(u, delta, A, B, C, **kw):
        delta.mul_(2)  # a "harmless" in-place change is refused too
        from mambalearn.scan.sequential import selective_scan_sequential
        return selective_scan_sequential(u, delta / 2, A, B, C, **kw)

    assert "changed its argument `delta` in place" in failure(check.selective_scan_sequential,
                                                             scaling_scan)


def test_a_numpy_result_is_named_as_such():
    def numpy_zoh(A, B, delta):
        A_bar, B_bar = discretize.zoh(A, B, delta)
        return A_bar.numpy(), B_bar.numpy()

    msg = failure(check.zoh, numpy_zoh)
    assert "expected a torch.Tensor, got numpy.ndarray" in msg and "torch.from_numpy" in msg


def test_combine_must_handle_batched_steps():
    def every_2d_A_a_matrix(left, right):
        (A_l, u_l), (A_r, u_r) = left, right
        if getattr(A_r, "ndim", 0) == 2:
            return A_r @ A_l, (A_r @ u_l[..., None])[..., 0] + u_r
        return A_r * A_l, A_r * u_l + u_r

    assert "batch of diagonal" in failure(check.combine, every_2d_A_a_matrix)


def _counts(l):
    P = 1 << (l - 1).bit_length()
    up = [P >> i for i in range(1, P.bit_length())]
    return {"hillis_steele_scan": [l - 2**i for i in range(max(0, (l - 1).bit_length()))],
            "blelloch_scan": up + up[::-1]}


@pytest.mark.parametrize("name", ["hillis_steele_scan", "blelloch_scan"])
def test_a_loop_reporting_the_right_counts_fails_on_its_order(name):
    def loop(a, b, dim=-1, reverse=False, pad=True, counter=None):
        l = b.shape[dim]
        if name == "blelloch_scan" and not pad and l & (l - 1):
            raise ValueError("not a power of two")
        for n in _counts(l)[name] if counter is not None else []:
            counter.add(n)
        return linear_scan_sequential(a, b, dim, reverse)

    loop.__name__ = name
    msg = failure(getattr(check, name), loop)
    assert "does not combine in" in msg and "the left-to-right loop" in msg, msg


def test_hillis_steele_is_not_blellochs_order():
    from mambalearn.scan.blelloch import blelloch_scan

    def hillis_steele_scan(a, b, dim=-1, reverse=False, counter=None):
        h = blelloch_scan(a, b, dim, reverse)
        for n in _counts(b.shape[dim])["hillis_steele_scan"] if counter is not None else []:
            counter.add(n)
        return h

    assert "the sum of Blelloch's tree" in failure(check.hillis_steele_scan, hillis_steele_scan)


def test_scan_backward_may_not_be_autograd():
    from mambalearn.scan.chunked import scan_reference

    def scan_backward(a, h, grad_h, initial_state=None):
        h_prev = torch.cat([torch.zeros_like(h[..., :1, :]) if initial_state is None
                            else initial_state[..., None, :], h[..., :-1, :]], -2)
        b = (h - a * h_prev).requires_grad_()
        a = a.clone().requires_grad_()
        return torch.autograd.grad(scan_reference(a, b, initial_state), [a, b], grad_h)

    assert "ran PyTorch's autograd" in failure(check.scan_backward, scan_backward)


def test_counter_state_still_copies_back():
    c = ScanCounter()
    from mambalearn.scan.hillis_steele import hillis_steele_scan

    _core.call(hillis_steele_scan, torch.rand(8), torch.rand(8), case="x", counter=c)
    assert c.depth == 3 and c.work == 7 + 6 + 4


def test_triton_output_must_come_from_the_kernel():
    import triton

    from mambalearn.check import _probes

    @triton.jit
    def dummy(x_ptr):
        pass

    def pytorch_loop(a, b, block_l=16):  # one launch, then the answer in PyTorch
        h = torch.empty_like(b)
        dummy[(1,)](h)
        s = torch.zeros_like(b[:, 0])
        for t in range(b.shape[1]):
            s = a[:, t] * s + b[:, t]
            h[:, t] = s
        return h

    def numpy_before_launch(a, b, block_l=16):  # numpy writes h, then a launch receives it
        h = torch.empty_like(b)
        hn, s = h.numpy(), np.zeros(b.shape[0], np.float32)
        for t in range(b.shape[1]):
            s = a.numpy()[:, t] * s + b.numpy()[:, t]
            hn[:, t] = s
        dummy[(1,)](h)
        return h

    def numpy_result(a, b, block_l=16):
        dummy[(1,)](torch.empty_like(b))
        return torch.from_numpy(np.cumsum(b.numpy(), 1))

    cheats = [(pytorch_loop, "computed with PyTorch outside its Triton kernel")]
    if not torch.cuda.is_available():  # numpy sees the memory only of CPU tensors
        cheats += [(numpy_before_launch, "changed outside PyTorch and Triton"),
                   (numpy_result, "not made by PyTorch")]
    for cheat, words in cheats:
        assert words in failure(check.scan_kernel, cheat, check_ok_combine), cheat.__name__
    a, b = (torch.rand(2, 5, device=device.get()) for _ in range(2))
    _, seen = _probes.call_watching_triton(pytorch_loop, a, b)
    assert seen["launched"] == ["dummy"] and "aten.mul" in seen["computed"]


def _ok_combine():
    import triton

    @triton.jit
    def combine_fn(a_l, u_l, a_r, u_r):
        return a_r * a_l, a_r * u_l + u_r

    return combine_fn


check_ok_combine = _ok_combine()


def test_a_one_element_tensor_keeps_its_shape_in_messages():
    """θ of shape (1,) is a tensor of one angle, not a scalar: a message says which."""
    text = _core.describe(theta=torch.tensor([0.5]), delta=torch.tensor(0.25), x=torch.ones(2, 3))
    assert text == ("theta: (1,) torch.float32 = [0.5], delta: 0.25 (torch.float32), "
                    "x: (2, 3) torch.float32")
