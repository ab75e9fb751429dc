"""check.scan_kernel passes the library's kernel and rejects the wrong versions of issue #5:
a swapped combine, a combine that drops a_l in the product, a missing carry between blocks."""

# isort: off
from mambalearn import device  # first: sets TRITON_INTERPRET=1 on a CPU before triton is imported
# isort: on
import pytest
import torch
import triton
import triton.language as tl

from mambalearn import check, testing
from mambalearn.triton import scan as S


# --- wrong combines -------------------------------------------------------------------------
@triton.jit
def combine_swapped(a_l, u_l, a_r, u_r):
    return a_l * a_r, a_l * u_r + u_l  # later step applied first: wrong in any order


@triton.jit
def combine_drops_a_l(a_l, u_l, a_r, u_r):
    return a_r, a_r * u_l + u_r  # right in a left fold (the interpreter), wrong in a tree


# --- kernels for the wrong versions: one row per program, like the exercise ------------------
@triton.jit
def _single_block_swapped(a_ptr, b_ptr, h_ptr, l, BLOCK_L: tl.constexpr):
    t = tl.arange(0, BLOCK_L)
    row = tl.program_id(0) * l
    a = tl.load(a_ptr + row + t, mask=t < l, other=1.0)
    b = tl.load(b_ptr + row + t, mask=t < l, other=0.0)
    _, h = tl.associative_scan((a, b), axis=0, combine_fn=combine_swapped)
    tl.store(h_ptr + row + t, h, mask=t < l)


@triton.jit
def _single_block_drops_a_l(a_ptr, b_ptr, h_ptr, l, BLOCK_L: tl.constexpr):
    t = tl.arange(0, BLOCK_L)
    row = tl.program_id(0) * l
    a = tl.load(a_ptr + row + t, mask=t < l, other=1.0)
    b = tl.load(b_ptr + row + t, mask=t < l, other=0.0)
    _, h = tl.associative_scan((a, b), axis=0, combine_fn=combine_drops_a_l)
    tl.store(h_ptr + row + t, h, mask=t < l)


@triton.jit
def _blocked_no_carry(a_ptr, b_ptr, h_ptr, l, BLOCK_L: tl.constexpr):
    offs = tl.arange(0, BLOCK_L)
    row = tl.program_id(0) * l
    start = 0
    while start < l:
        t = start + offs
        a = tl.load(a_ptr + row + t, mask=t < l, other=1.0)
        b = tl.load(b_ptr + row + t, mask=t < l, other=0.0)
        _, h = tl.associative_scan((a, b), axis=0, combine_fn=S.combine_fn)
        tl.store(h_ptr + row + t, h, mask=t < l)  # BUG: every block starts from h = 0
        start += BLOCK_L


def _launcher(kernel, single_block):
    def scan_kernel(a, b, block_l=16):
        a, b = a.contiguous(), b.contiguous()
        h = torch.empty_like(a)
        r, l = a.shape
        block = triton.next_power_of_2(l) if single_block else block_l
        kernel[(r,)](a, b, h, l, BLOCK_L=block)
        return h
    return scan_kernel


def library_scan_kernel(a, b, block_l=16):
    return S.scan(a, b, block_l=block_l)


# --- tests ----------------------------------------------------------------------------------
def test_passes_the_library_kernel(capsys):
    check.scan_kernel(library_scan_kernel, S.combine_fn)
    assert "scan_kernel: all" in capsys.readouterr().out


def test_not_implemented_passes_through():
    @triton.jit
    def combine_stub(a_l, u_l, a_r, u_r):
        raise NotImplementedError()

    def scan_kernel(a, b, block_l=16):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        check.scan_kernel(scan_kernel, combine_stub)
    with pytest.raises(NotImplementedError):  # combine written, launcher not yet
        check.scan_kernel(scan_kernel, S.combine_fn)


def test_rejects_swapped_combine():
    with pytest.raises(AssertionError, match="combine_fn"):
        check.scan_kernel(_launcher(_single_block_swapped, True), combine_swapped)
    # the swapped combine is wrong even in a left fold: the kernel alone is wrong too
    with pytest.raises(AssertionError, match="scan_kernel"):
        check.scan_kernel(_launcher(_single_block_swapped, True), S.combine_fn)


def test_rejects_combine_that_drops_a_l():
    launcher = _launcher(_single_block_drops_a_l, True)
    with pytest.raises(AssertionError, match="combine_fn"):
        check.scan_kernel(launcher, combine_drops_a_l)


@pytest.mark.skipif(not device.interpreted(), reason="shows what the CPU interpreter hides")
def test_interpreter_hides_the_dropped_a_l():
    # Why the check runs tree_order: in the interpreter's left fold this kernel is right.
    a = torch.rand(3, 13) * 0.5 + 0.5
    b = torch.randn(3, 13)
    h = _launcher(_single_block_drops_a_l, True)(a, b)
    testing.assert_close(h, S.scan_reference(a, b))


@pytest.mark.gpu
@pytest.mark.skipif(device.interpreted(), reason="needs a compiled kernel on a GPU")
def test_gpu_shows_the_dropped_a_l():
    # The same kernel compiled for a GPU scans in a tree and uses the wrong A: its h is wrong.
    a = torch.rand(64, 1000, device="cuda") * 0.5 + 0.5
    b = torch.randn(64, 1000, device="cuda")
    h = _launcher(_single_block_drops_a_l, True)(a, b)
    with pytest.raises(AssertionError):
        testing.assert_close(h, S.scan_reference(a, b))


def test_rejects_missing_carry():
    with pytest.raises(AssertionError, match="carried in from the previous block"):
        check.scan_kernel(_launcher(_blocked_no_carry, False), S.combine_fn)


def test_rejects_ignored_strides():
    def scan_kernel(a, b, block_l=16):  # reads the storage as if rows were contiguous
        h = torch.empty_like(a)
        r, l = a.shape
        a_flat = torch.as_strided(a, (r, l), (l, 1))
        b_flat = torch.as_strided(b, (r, l), (l, 1))
        return S.scan(a_flat, b_flat, block_l=block_l).view_as(h)

    with pytest.raises(AssertionError, match="transposed"):
        check.scan_kernel(scan_kernel, S.combine_fn)


@triton.jit
def _blocked_strided(a_ptr, b_ptr, h_ptr, l, stride_r, stride_l, BLOCK_L: tl.constexpr):
    """The exercise's kernel: one stride pair, for a, b and h alike."""
    offs = tl.arange(0, BLOCK_L)
    row = tl.program_id(0).to(tl.int64)
    carry = 0.0
    start = 0
    while start < l:
        t = start + offs
        ptrs = row * stride_r + t * stride_l
        a = tl.load(a_ptr + ptrs, mask=t < l, other=1.0)
        b = tl.load(b_ptr + ptrs, mask=t < l, other=0.0)
        A, U = tl.associative_scan((a, b), axis=0, combine_fn=S.combine_fn)
        h = A * carry + U
        tl.store(h_ptr + ptrs, h, mask=t < l)
        carry = tl.sum(tl.where(offs == BLOCK_L - 1, h, 0.0), axis=0)
        start += BLOCK_L


def test_rejects_one_tensors_strides_for_both():
    """Issue 19 §1.3: launched with b's strides for a as well. Right whenever a and b share a
    layout (every case of the old check), wrong as soon as they do not."""
    def scan_kernel(a, b, block_l=16):
        h = torch.empty_like(b)  # b's layout
        _blocked_strided[(b.shape[0],)](a, b, h, b.shape[1], *b.stride(), BLOCK_L=block_l)
        return h

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # where the kernel runs
    same = (torch.rand(2, 9, device=dev).t().contiguous().t(),
            torch.randn(2, 9, device=dev).t().contiguous().t())
    testing.assert_close(scan_kernel(*same), S.scan_reference(*same))  # one layout: right
    with pytest.raises(AssertionError, match="different layouts"):
        check.scan_kernel(scan_kernel, S.combine_fn)


def test_accepts_the_exercise_launcher_with_contiguous_copies(capsys):
    def scan_kernel(a, b, block_l=16):
        a, b = a.contiguous(), b.contiguous()
        h = torch.empty_like(a)
        _blocked_strided[(a.shape[0],)](a, b, h, a.shape[1], *a.stride(), BLOCK_L=block_l)
        return h

    check.scan_kernel(scan_kernel, S.combine_fn)
    assert "scan_kernel: all" in capsys.readouterr().out


def test_rejects_a_torch_loop_in_place_of_the_kernel():
    with pytest.raises(AssertionError, match="launched no Triton kernel"):
        check.scan_kernel(lambda a, b, block_l=16: S.scan_reference(a, b).float(), S.combine_fn)


def test_combine_fn_is_its_own_task(capsys):
    check.combine_fn(S.combine_fn)
    assert "combine_fn: all" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="combine_fn"):
        check.combine_fn(combine_drops_a_l)
