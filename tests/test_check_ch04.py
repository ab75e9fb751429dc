"""Chapter 04 checks pass the library scans and reject the classic wrong ones."""

import pytest
import torch

from mambalearn import check, ops
from mambalearn.scan.blelloch import blelloch_scan
from mambalearn.scan.hillis_steele import hillis_steele_scan
from mambalearn.scan.layout import time_first


def test_library_passes(capsys):
    check.hillis_steele_scan(hillis_steele_scan)
    check.blelloch_scan(blelloch_scan)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line.startswith("✓") for line in out)


def hs_with(bug):
    def scan(a, b, dim=-1, reverse=False, counter=None):
        A, U, restore = time_first(a, b, dim, reverse)
        l, k = U.shape[0], 1
        while (2 * k if bug == "one_round_short" else k) < l:
            earlier, later = (A[:-k], U[:-k]), (A[k:], U[k:])
            A_new, U_new = (ops.combine(later, earlier) if bug == "swapped"
                            else ops.combine(earlier, later))
            A, U = torch.cat([A[:k], A_new]), torch.cat([U[:k], U_new])
            if counter is not None and bug != "no_count":
                counter.add(l if bug == "counts_l" else l - k)
            k *= 2
        if bug == "exclusive":
            U = torch.cat([torch.zeros_like(U[:1]), U[:-1]])
        return restore(U)

    scan.__name__ = f"hillis_steele_{bug}"
    return scan


def blelloch_with(bug):
    def scan(a, b, dim=-1, reverse=False, pad=True, counter=None):
        A, U, restore = time_first(a, b, dim, reverse)
        l = U.shape[0]
        P = 1 << (l - 1).bit_length()
        if P != l:
            if not pad and bug != "pads_anyway":
                raise ValueError("not a power of two")
            if bug != "no_pad":
                A_id, U_id = ops.identity(A[: P - l], U[: P - l])
                A, U = torch.cat([A, A_id]), torch.cat([U, U_id])
        levels = []  # the up-sweep, one tensor per level (the library works in place instead)
        while U.shape[0] > 1:
            levels.append((A, U))
            A, U = ops.combine((A[0::2], U[0::2]), (A[1::2], U[1::2]))
            if counter is not None and bug != "no_count":
                counter.add(U.shape[0])
        root = (A[0], U[0])
        E_A, E_U = (x[None] for x in ops.identity(*root))
        for A_, U_ in reversed(levels):
            left = (A_[1::2], U_[1::2]) if bug == "down_off_by_one" else (A_[0::2], U_[0::2])
            R_A, R_U = ops.combine(left, (E_A, E_U)) if bug == "swapped" else ops.combine(
                (E_A, E_U), left)
            E_A = torch.stack([E_A, R_A], 1).flatten(0, 1)
            E_U = torch.stack([E_U, R_U], 1).flatten(0, 1)
            if counter is not None and bug not in ("no_count", "counts_only_up"):
                counter.add(R_U.shape[0])
        if bug == "exclusive":
            return restore(E_U[:l])
        return restore(torch.cat([E_U[1:], root[1][None]]) if l == len(E_U) else E_U[1: l + 1])

    scan.__name__ = f"blelloch_{bug}"
    return scan


def test_mutant_templates_are_right_without_a_bug():
    check.hillis_steele_scan(hs_with(None))
    check.blelloch_scan(blelloch_with(None))


@pytest.mark.parametrize("bug", ["swapped", "one_round_short", "exclusive"])
def test_hillis_steele_rejects(bug):
    with pytest.raises(AssertionError):
        check.hillis_steele_scan(hs_with(bug))


@pytest.mark.parametrize("bug", ["swapped", "down_off_by_one", "no_pad", "exclusive",
                                 "pads_anyway"])
def test_blelloch_rejects(bug):
    with pytest.raises(AssertionError):
        check.blelloch_scan(blelloch_with(bug))


@pytest.mark.parametrize("scan", ["hs no_count", "hs counts_l", "blelloch no_count",
                                  "blelloch counts_only_up"])
def test_scans_must_count_their_work(scan):
    """Right h but no (or the wrong) counter.add calls: the notebook asks for the work counted."""
    kind, bug = scan.split()
    fn, check_fn = ((hs_with(bug), check.hillis_steele_scan) if kind == "hs"
                    else (blelloch_with(bug), check.blelloch_scan))
    with pytest.raises(AssertionError, match="counted its work wrong"):
        check_fn(fn)


def test_hillis_steele_is_not_a_blelloch():
    with pytest.raises(AssertionError, match="pad=False|counted its work wrong"):
        check.blelloch_scan(lambda a, b, dim=-1, reverse=False, pad=True, counter=None:
                            hillis_steele_scan(a, b, dim, reverse))


def test_not_implemented_passes_through():
    def stub(a, b, dim=-1, reverse=False, pad=True, counter=None):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        check.blelloch_scan(stub)
    with pytest.raises(NotImplementedError):
        check.hillis_steele_scan(stub)
