"""chunked_scan and selective_scan_chunked against the loop oracles, on odd sizes and layouts."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mambalearn import ops
from mambalearn.scan.chunked import chunked_scan, scan_reference, selective_scan_chunked
from mambalearn.scan.sequential import selective_scan_sequential
from mambalearn.testing import assert_close


def steps(shape, dtype=torch.float64):
    return torch.rand(shape, dtype=dtype) * 0.8 + 0.25, torch.randn(shape, dtype=dtype)


@pytest.mark.parametrize("l", [1, 2, 7, 12, 33])
@pytest.mark.parametrize("q", [1, 3, 4, 16, 64])
@pytest.mark.parametrize("with_h0", [False, True])
def test_chunked_equals_loop(l, q, with_h0):
    a, b = steps((2, 3, l, 4))
    h0 = torch.randn(2, 3, 4, dtype=torch.float64) if with_h0 else None
    h, last = chunked_scan(a, b, q, h0, return_final_state=True)
    want, want_last = scan_reference(a, b, h0, return_final_state=True)
    assert_close(h, want)
    assert_close(last, want_last)


@settings(max_examples=25, deadline=None)
@given(l=st.integers(1, 40), q=st.integers(1, 12), lead=st.lists(st.integers(1, 3), max_size=3))
def test_any_leading_dims(l, q, lead):
    a, b = steps((*lead, l, 2))
    assert_close(chunked_scan(a, b, q), scan_reference(a, b))


def test_reference_is_the_fold_of_combine():
    """A second oracle: the last state is the u part of s_0 ⊗ s_1 ⊗ … applied to h_{−1} = 0."""
    a, b = steps((9, 3))
    _, u = ops.fold([(a[t], b[t]) for t in range(9)])
    assert_close(scan_reference(a, b)[-1], u)


def test_float32_and_non_contiguous():
    a, b = (x.transpose(-1, -2) for x in steps((2, 3, 5, 50), torch.float32))  # (2, 3, 50, 5)
    assert not a.is_contiguous()
    assert_close(chunked_scan(a, b, 8), scan_reference(a.double(), b.double()))


@pytest.mark.parametrize("bad, match", [
    (lambda a, b: chunked_scan(a, b[..., :3, :], 4), "same shape"),
    (lambda a, b: chunked_scan(a[..., :0, :], b[..., :0, :], 4), "l = 0"),
    (lambda a, b: chunked_scan(a, b, 0), "chunk_size"),
    (lambda a, b: chunked_scan(a, b, 4, torch.zeros(2, 3)), "initial_state"),
    (lambda a, b: chunked_scan(a[0, 0, 0], b[0, 0, 0], 4), "at least 2"),
])
def test_bad_input_raises(bad, match):
    a, b = steps((2, 3, 6, 4))
    with pytest.raises(ValueError, match=match):
        bad(a, b)


def test_float_chunk_size_raises_type_error():
    a, b = steps((2, 3, 6, 4))
    with pytest.raises(TypeError, match="chunk_size must be an int"):
        chunked_scan(a, b, 2.0)


def test_integer_input_raises_type_error():
    with pytest.raises(TypeError, match="a must"):
        chunked_scan(torch.ones(2, 3, dtype=torch.int64), torch.ones(2, 3), 2)


def _selective(b, d, l, n, layout, dtype=torch.float64):
    g = torch.Generator().manual_seed(l * 7 + n)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)
    BC = {"fixed": lambda: r(d, n), "shared": lambda: r(b, n, l), "grouped": lambda: r(b, 2, n, l)}
    return dict(u=r(b, d, l), delta=r(b, d, l) * 0.5, A=-torch.exp(r(d, n) * 0.3),
                B=BC[layout](), C=BC["grouped" if layout != "grouped" else "shared"](),
                D=r(d), z=r(b, d, l), delta_bias=r(d) * 0.1)


@pytest.mark.parametrize("layout", ["fixed", "shared", "grouped"])
@pytest.mark.parametrize("l, q", [(1, 4), (13, 4), (16, 8)])
def test_selective_scan_chunked_equals_sequential(layout, l, q):
    x = _selective(2, 4, l, 3, layout)
    mask = torch.rand(2, l) > 0.25
    h0 = torch.randn(2, 4, 3, dtype=torch.float64)
    kw = dict(delta_softplus=True, return_last_state=True, mask=mask, initial_state=h0)
    out, last = selective_scan_chunked(**x, **kw, chunk_size=q)
    want, want_last = selective_scan_sequential(**x, **kw)
    assert_close(out, want)
    assert_close(last, want_last)


def test_selective_scan_chunked_minimal_args_bf16():
    x = _selective(1, 8, 20, 4, "shared", torch.float32)
    u = x["u"].bfloat16()
    out = selective_scan_chunked(u, x["delta"], x["A"], x["B"], x["C"], chunk_size=6)
    assert out.dtype == torch.bfloat16
    assert_close(out, selective_scan_sequential(u, x["delta"], x["A"], x["B"], x["C"]))
