"""The single-launch SSD forward (chapter 11) against the oracle and the unfused kernels."""

import pytest
import torch

from mambalearn.testing import assert_close
from mambalearn.triton.ssd import forward as T
from mambalearn.triton.ssd.fused import ssd_fused_forward
from tests.test_ssd_triton import dev, make, ref


@pytest.mark.parametrize("chunk_major,share_cb", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("l,q,g", [(37, 16, 2), (16, 16, 1), (3, 16, 1)])
def test_fused_forward_matches_oracle(l, q, g, chunk_major, share_cb):
    b, h, p, n = 2, 2, 4, 8
    x, dt, A, B, C = make(b, l, h, p, g, n)
    kw = dict(D=torch.randn(h, p, device=dev), z=torch.randn(b, l, h, p, device=dev),
              dt_bias=torch.randn(h, device=dev), initial_states=torch.randn(b, h, p, n, device=dev),
              dt_softplus=True)
    out, final = ssd_fused_forward(x, dt, A, B, C, q, chunk_major=chunk_major, share_cb=share_cb, **kw)
    want, want_f = ref(x, dt, A, B, C, q, return_final_states=True, **kw)
    assert_close(out, want)
    assert_close(final, want_f)


def test_fused_flag_selects_it_and_backward_reuses_ch10():
    b, l, h, p, g, n, q = 1, 20, 2, 4, 1, 8, 16
    x, dt, A, B, C = make(b, l, h, p, g, n, softplus=False)
    x1 = x.clone().requires_grad_()
    x2 = x.clone().requires_grad_()
    o1 = T.mamba_chunk_scan_combined(x1, dt, A, B, C, q, fused=True)
    o2 = T.mamba_chunk_scan_combined(x2, dt, A, B, C, q)
    assert_close(o1, o2)
    o1.sum().backward()
    o2.sum().backward()
    assert_close(x1.grad, x2.grad, grad=True)


def test_fp16_state_is_close():
    b, l, h, p, g, n, q = 1, 40, 2, 4, 1, 8, 16
    x, dt, A, B, C = make(b, l, h, p, g, n)
    out, _ = ssd_fused_forward(x, dt, A, B, C, q, dt_softplus=True, state_dtype=torch.float16)
    assert_close(out, ref(x, dt, A, B, C, q, dt_softplus=True), dtype=torch.float16)


def test_fused_rejects_seq_idx():
    x, dt, A, B, C = make(1, 8, 2, 4, 1, 8)
    with pytest.raises(ValueError, match="seq_idx"):
        ssd_fused_forward(x, dt, A, B, C, 8, seq_idx=torch.zeros(1, 8, dtype=torch.int32))


@pytest.mark.parametrize("chunk_major,share_cb", [(True, False), (False, False), (True, True)])
def test_fused_with_p_split_over_programs(chunk_major, share_cb):
    b, l, h, p, g, n, q = 2, 40, 3, 32, 1, 8, 16
    x, dt, A, B, C = make(b, l, h, p, g, n)
    h0 = torch.randn(b, h, p, n, device=dev)
    out, final = ssd_fused_forward(x, dt, A, B, C, q, dt_softplus=True, initial_states=h0, block_p=16,
                                   chunk_major=chunk_major, share_cb=share_cb)
    want, want_f = ref(x, dt, A, B, C, q, dt_softplus=True, initial_states=h0, return_final_states=True)
    assert_close(out, want)
    assert_close(final, want_f)
