"""check.selective_scan_kernel passes the library's kernels and the exercise's kernel, and rejects
the wrong versions of issue #5: a kernel missing the carry between time blocks, one that forgets
the D skip, and a combine that is right only in the interpreter's left fold."""

# isort: off
from mambalearn import device  # noqa: F401 - first: TRITON_INTERPRET=1 on a CPU before triton
# isort: on
import pytest
import torch
import triton
import triton.language as tl

from mambalearn import check
from mambalearn.mamba1 import args as interface
from mambalearn.mamba1.api import selective_scan_fn
from mambalearn.mamba1.kernel import (
    column,
    combine_fn,
    load_bc,
    load_delta,
    put_column,
    selective_scan_teaching,
)


@triton.jit
def combine_drops_a_l(a_l, u_l, a_r, u_r):
    return a_r, a_r * u_l + u_r  # right in a left fold (the interpreter), wrong in a tree


# --- the exercise's kernel, with switches for the two bugs the check must catch --------------
@triton.jit
def _fwd_kernel(u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, out_ptr, last_ptr,
                l, d, dpg, g, sB0, sB1, sB2, sC0, sC1, sC2,
                N: tl.constexpr, NP: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,
                HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
                SOFTPLUS: tl.constexpr, VAR_B: tl.constexpr, VAR_C: tl.constexpr,
                CARRY: tl.constexpr, D_SKIP: tl.constexpr, GATE: tl.constexpr):
    bi, gi = tl.program_id(0) // g, tl.program_id(0) % g
    d_loc = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d_loc < dpg
    d_idx = gi * dpg + d_loc  # (BLOCK_D,)
    row = (bi * d + d_idx).to(tl.int64) * l
    cols, ncols = tl.arange(0, BLOCK_L), tl.arange(0, NP)
    Bv_ptr, Cv_ptr = B_ptr + bi * sB0 + gi * sB1, C_ptr + bi * sC0 + gi * sC1
    H = tl.zeros((BLOCK_D, NP), dtype=tl.float32)
    t0 = 0
    while t0 < l:
        t = t0 + cols
        mask = d_mask[:, None] & (t < l)[None, :]
        offs = row[:, None] + t[None, :]
        x = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dt, _ = load_delta(delta_ptr, bias_ptr, offs, mask, d_idx, d_mask, HAS_BIAS, SOFTPLUS)
        y = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
        for n in tl.static_range(N):
            A_n = tl.load(A_ptr + d_idx * N + n, mask=d_mask, other=0.0)
            B_n = load_bc(B_ptr, Bv_ptr, n, t, l, d_idx, d_mask, sB0, sB1, sB2, VAR_B)
            C_n = load_bc(C_ptr, Cv_ptr, n, t, l, d_idx, d_mask, sC0, sC1, sC2, VAR_C)
            h_in = column(H, ncols, n)
            a = tl.exp(dt * A_n[:, None])
            bx = dt * x * B_n
            if CARRY:
                bx = tl.where(cols[None, :] == 0, a * h_in[:, None] + bx, bx)
            _, h = tl.associative_scan((a, bx), 1, combine_fn)
            H = put_column(H, ncols, n, column(h, cols, BLOCK_L - 1))
            y += C_n * h
        if HAS_D and D_SKIP:
            y += x * tl.load(D_ptr + d_idx, mask=d_mask, other=0.0)[:, None]
        if HAS_Z:
            zz = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            if GATE == 0:
                y *= zz * tl.sigmoid(zz)  # silu(z): right
            elif GATE == 1:
                y *= tl.sigmoid(zz)  # sigmoid instead of silu
            else:
                y *= zz  # no activation
        tl.store(out_ptr + offs, y, mask=mask)
        t0 += BLOCK_L
    n_mask = d_mask[:, None] & (ncols[None, :] < N)
    tl.store(last_ptr + (bi * d + d_idx).to(tl.int64)[:, None] * N + ncols[None, :], H, mask=n_mask)


def _strides(X):
    return (X.stride(0), X.stride(1), 0) if X.ndim == 2 else X.stride()[:3]


def exercise_kernel(carry=True, d_skip=True, gate=0):
    def selective_scan_kernel(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                              delta_softplus=False, return_last_state=False, block_d=4, block_l=8):
        (b, d, l, n, g), _ = interface.check_args(u, delta, A, B, C, D, z, delta_bias, None, None)
        u, delta, A = u.contiguous(), delta.contiguous(), A.contiguous()
        z = z.contiguous() if z is not None else None
        Bk, Ck = interface.bc_layout(B), interface.bc_layout(C)
        out = torch.empty_like(u)
        last = torch.empty((b, d, n), device=u.device, dtype=torch.float32)
        _fwd_kernel[(b * g, triton.cdiv(d // g, block_d))](
            u, delta, A, Bk, Ck, *interface.optional(D, z, delta_bias, dummy=A), out, last,
            l, d, d // g, g, *_strides(Bk), *_strides(Ck), N=n, NP=triton.next_power_of_2(n),
            BLOCK_D=block_d, BLOCK_L=block_l, HAS_D=D is not None, HAS_Z=z is not None,
            HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(delta_softplus), VAR_B=B.ndim != 2,
            VAR_C=C.ndim != 2, CARRY=carry, D_SKIP=d_skip, GATE=gate)
        return (out, last) if return_last_state else out
    return selective_scan_kernel


def library(fn):
    """The library's kernels take no time block: they pick their own (8 steps on a CPU)."""
    return lambda *args, block_l=None, **kw: fn(*args, **kw)


# --- tests ----------------------------------------------------------------------------------
def test_passes_the_library_kernels(capsys):
    check.selective_scan_kernel(library(selective_scan_fn), combine_fn)
    check.selective_scan_kernel(library(selective_scan_teaching))
    assert capsys.readouterr().out.count("selective_scan_kernel: all") == 2


def test_passes_the_exercise_kernel(capsys):
    check.selective_scan_kernel(exercise_kernel(), combine_fn)
    assert "selective_scan_kernel: all" in capsys.readouterr().out


def test_rejects_missing_carry():
    with pytest.raises(AssertionError, match="carried in from the previous block"):
        check.selective_scan_kernel(exercise_kernel(carry=False), combine_fn)


def test_rejects_missing_d_skip():
    with pytest.raises(AssertionError, match=r"the D skip \(y \+= D·x\) is missing"):
        check.selective_scan_kernel(exercise_kernel(d_skip=False), combine_fn)


@pytest.mark.parametrize("gate, says", [(1, r"sigmoid\(z\) instead of silu"),
                                        (2, "z itself, without the silu")])
def test_names_the_wrong_gate(gate, says):
    """One specific message per wrong activation, not the list of every option of the case."""
    with pytest.raises(AssertionError, match=says):
        check.selective_scan_kernel(exercise_kernel(gate=gate), combine_fn)


def test_rejects_a_torch_loop_in_place_of_the_kernel():
    """Right numbers from PyTorch, no Triton launch: the exercise is the kernel."""
    from mambalearn.scan.sequential import selective_scan_sequential

    def loop(*args, block_l=None, **kw):
        return selective_scan_sequential(*(a.double() if torch.is_tensor(a) else a for a in args),
                                         **{k: v.double() if torch.is_tensor(v) else v
                                            for k, v in kw.items()})

    with pytest.raises(AssertionError, match="launched no Triton kernel"):
        check.selective_scan_kernel(loop, combine_fn)


def test_rejects_combine_that_drops_a_l():
    with pytest.raises(AssertionError, match="combine_fn"):
        check.selective_scan_kernel(exercise_kernel(), combine_drops_a_l)


def test_rejects_missing_last_state():
    def no_last_state(*args, return_last_state=False, **kw):
        return exercise_kernel()(*args, **kw)

    with pytest.raises(AssertionError, match="last_state"):
        check.selective_scan_kernel(no_last_state)


def test_not_implemented_passes_through():
    def stub(*args, **kw):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        check.selective_scan_kernel(stub, combine_fn)
