"""Chapter 06 check passes the library's chunked_scan and rejects a scan that forgets the carry."""

import pytest
import torch

from mambalearn import check
from mambalearn.scan import chunked


def missing_carry(a, b, chunk_size, initial_state=None, return_final_state=False):
    """Every chunk starts from the initial state (or zero): the state passing step is left out."""
    l, hs, last = a.shape[-2], [], None
    for start in range(0, l, chunk_size):
        s = slice(start, start + chunk_size)
        h, last = chunked.scan_reference(a[..., s, :], b[..., s, :], initial_state, True)
        hs.append(h)
    h = torch.cat(hs, dim=-2)
    return (h, last) if return_final_state else h


def carry_not_decayed(a, b, chunk_size, initial_state=None, return_final_state=False):
    """The carry is added to every state of the next chunk without the gate products P."""
    l, q = a.shape[-2], chunk_size
    H = torch.zeros_like(b[..., 0, :]) if initial_state is None else initial_state
    hs = []
    for start in range(0, l, q):
        s = slice(start, start + q)
        h_local = chunked.scan_reference(a[..., s, :], b[..., s, :])
        h = h_local + H[..., None, :]
        H = h[..., -1, :]
        hs.append(h)
    h = torch.cat(hs, dim=-2)
    return (h, H) if return_final_state else h


def test_library_passes(capsys):
    check.chunked_scan(chunked.chunked_scan)
    assert capsys.readouterr().out.startswith("✓ chunked_scan")


@pytest.mark.parametrize("wrong", [missing_carry, carry_not_decayed])
def test_rejects(wrong):
    with pytest.raises(AssertionError, match="chunked_scan"):
        check.chunked_scan(wrong)


def test_rejects_missing_final_state():
    def no_final(a, b, chunk_size, initial_state=None, return_final_state=False):
        return chunked.chunked_scan(a, b, chunk_size, initial_state)

    with pytest.raises(AssertionError, match="return_final_state"):
        check.chunked_scan(no_final)


def test_stub_raises_not_implemented():
    def stub(a, b, chunk_size, initial_state=None, return_final_state=False):
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check.chunked_scan(stub)
