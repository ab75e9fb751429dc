"""Past 2³¹ elements: a huge launch's last rows equal a small launch of those rows alone (GPU).

Offsets into tensors with more than 2³¹ elements overflow 32-bit arithmetic; Triton computes
`ptr + i` in int32 unless an operand is int64. Channels (Mamba-1) and state slots (the decode
step) are independent, so the rows at the far end of a huge tensor can be recomputed on their own:
any overflow shows up as a mismatch (or a fault) there. Each test needs tens of GB of GPU memory.
"""

import pytest
import torch

from mambalearn import testing

pytestmark = pytest.mark.gpu
BIG = 2**31


def _mamba1_inputs(b, d, l, n):
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s, dt=torch.bfloat16: torch.randn(*s, device="cuda", generator=g).to(dt)
    return dict(u=r(b, d, l), delta=(0.5 * r(b, d, l, dt=torch.float32) - 4).to(torch.bfloat16),
                A=-torch.rand(d, n, device="cuda", generator=g) - 0.5, B=r(b, n, l),
                C=r(b, n, l), D=r(d, dt=torch.float32), z=r(b, d, l),
                delta_bias=0.1 * r(d, dt=torch.float32))


def test_selective_scan_past_2_31():
    from mambalearn.mamba1 import selective_scan_fn
    b, d, l, n, tail = 1, 4096, BIG // 4096 + 4096, 16, 4  # 2.16e9 elements a (b, d, l) tensor
    x = _mamba1_inputs(b, d, l, n)
    leaves = {k: v.requires_grad_() for k, v in x.items()}
    out = selective_scan_fn(**leaves, delta_softplus=True)
    dout = torch.randn_like(out[:, -tail:])
    out[:, -tail:].backward(dout)  # the gradient reaches the tail channels only
    per_channel = {"u": 1, "delta": 1, "z": 1, "A": 0, "D": 0, "delta_bias": 0}
    small = {k: (v.detach()[:, -tail:] if per_channel.get(k) == 1 else v.detach()[-tail:]
                 if k in per_channel else v.detach()).clone().requires_grad_()
             for k, v in x.items()}
    out_s = selective_scan_fn(**small, delta_softplus=True)
    out_s.backward(dout)
    testing.assert_close(out[:, -tail:], out_s, msg="out, the last channels")
    for k, dim in per_channel.items():
        got = leaves[k].grad[:, -tail:] if dim == 1 else leaves[k].grad[-tail:]
        testing.assert_close(got, small[k].grad, grad=True, msg=f"d{k}, the last channels")
    for k in ("B", "C"):  # summed over the channels: only the tail channels contribute
        testing.assert_close(leaves[k].grad, small[k].grad, grad=True, msg=f"d{k}")


def test_decode_step_past_2_31():
    from course.bench.step import mamba2_step_inputs
    from mambalearn.mamba2.step import selective_state_update
    b, h, p, n = BIG // (80 * 64 * 128) + 8, 80, 64, 128  # 2.2e9 state values
    inp = mamba2_step_inputs(b, h, p, n, torch.float32)
    state = inp.pop("state")
    small = state[-3:].clone()
    out = selective_state_update(state, **inp)
    want = selective_state_update(small, **{k: v[-3:] if k in ("x", "dt", "B", "C") else v
                                            for k, v in inp.items()})
    testing.assert_close(out[-3:], want, msg="out, the last rows")
    testing.assert_close(state[-3:], small, msg="state, the last slots")
    # a batch that names the last slots through state_batch_indices
    idx = torch.arange(b - 3, b, device="cuda", dtype=torch.int32)
    got = selective_state_update(state, **{k: v[:3] if k in ("x", "dt", "B", "C") else v
                                           for k, v in inp.items()}, state_batch_indices=idx)
    ref = selective_state_update(small, **{k: v[:3] if k in ("x", "dt", "B", "C") else v
                                           for k, v in inp.items()})
    testing.assert_close(got, ref, msg="out through state_batch_indices")
