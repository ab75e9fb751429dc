"""mambalearn.testing: the whole-tensor (norm=True) comparison used for matrix-unit results."""

import pytest
import torch

from mambalearn.testing import assert_close, rel_error


def test_norm_mode_accepts_a_few_outliers_the_elementwise_check_rejects():
    g = torch.Generator().manual_seed(0)
    want = torch.randn(1000, generator=g, dtype=torch.float64)
    got = want.clone()
    got[:3] += 0.05  # three elements off by far more than rtol/atol, the tensor still 3e-3 close
    with pytest.raises(AssertionError):
        assert_close(got, want, dtype="tf32")
    assert_close(got, want, dtype="tf32", norm=True)
    assert rel_error(got, want) == pytest.approx((0.05**2 * 3) ** 0.5 / want.norm().item())


@pytest.mark.parametrize("bad", ["scaled", "nan"])
def test_norm_mode_rejects_a_wrong_tensor(bad):
    want = torch.randn(64, generator=torch.Generator().manual_seed(1))
    got = want * 1.01 if bad == "scaled" else want.clone()
    if bad == "nan":
        got[5] = float("nan")
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(got, want, dtype="tf32", norm=True, msg="case")
