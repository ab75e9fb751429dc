"""One table of tolerances and one comparison function for the whole project.

Start from mamba_ssm's own test tolerances (fp32 rtol 6e-4 / atol 2e-3, bf16 3e-2 / 5e-2);
gradients accumulate more rounding, so they get a looser row. Always compare a fast path against
a slow oracle computed in float64 (or float32 for bf16/fp16 inputs).
"""

import torch

# dtype -> (rtol, atol) for forward outputs.
TOLERANCES = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (6e-4, 2e-3),
    torch.float16: (3e-3, 5e-3),
    torch.bfloat16: (3e-2, 5e-2),
}
# Matrix units: on NVIDIA GPUs Triton's tl.dot multiplies float32 inputs in tf32 by default, as
# mamba_ssm's SSD kernels do: the tensor cores drop the low 13 of the 23 mantissa bits of each
# operand (round toward zero, `machine.round_to_tf32`), so a product is off by < 2·2⁻¹⁰ ≈ 2e-3 and
# a sum of products whose terms share a sign keeps that bias. Compare such outputs with this row,
# ~2.5× that bound (see `dot_dtype`).
TOLERANCES["tf32"] = (5e-3, 5e-3)
# A whole tensor of sums of tf32 products (``norm=True``): each product is off by < 2·2⁻¹⁰ and
# rounding toward zero biases a sum of same-signed terms by about half that, ‖a − e‖/‖e‖ ≈ 1e-3;
# gradients chain two or three such products. A wrong term, index or mask moves it by O(1).
TF32_NORM = {False: 5e-3, True: 1e-2}  # {grad: rtol of rel_error}
# Gradients: a reverse scan plus reductions over l; mamba_ssm loosens these by 2-5x.
GRAD_TOLERANCES = {
    torch.float64: (1e-6, 1e-8),
    torch.float32: (2e-3, 5e-3),
    torch.float16: (1e-2, 2e-2),
    torch.bfloat16: (6e-2, 1e-1),
}


def dot_dtype(x):
    """The precision a Triton matmul really computed ``x`` in: "tf32" for float32 on a GPU."""
    return "tf32" if x.dtype == torch.float32 and x.is_cuda else x.dtype


def tolerance(dtype, grad=False):
    """(rtol, atol) for ``dtype``; ``grad=True`` for gradients."""
    table = GRAD_TOLERANCES if grad else TOLERANCES
    if grad and dtype == "tf32":
        dtype = torch.bfloat16  # gradients through tf32 products: treat like bf16
    if dtype not in table:
        raise TypeError(f"no tolerance for dtype {dtype}; expected one of {list(table)}")
    return table[dtype]


def rel_error(actual, expected):
    """‖actual − expected‖ / ‖expected‖ over the whole tensor, in float64."""
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(device=a.device, dtype=torch.float64)
    if not e.norm():  # an expected zero tensor: 0 only for zeros (inf otherwise, NaN included)
        return 0.0 if a.norm() == 0 else float("inf")
    return ((a - e).norm() / e.norm()).item()


def assert_close(actual, expected, *, dtype=None, grad=False, msg=None, rtol=None, atol=None,
                 norm=False):
    """``torch.testing.assert_close`` with the tolerance of ``dtype`` (default: ``actual.dtype``).

    ``expected`` may be of a wider dtype (the float64 oracle); it is cast to ``actual``'s dtype
    after the tolerance is chosen. ``msg`` is prepended to torch's report (which already names the
    worst element and its index).
    ``dtype="dot"``: the result of a kernel whose ``tl.dot`` runs in tf32 on a GPU
    (``dot_dtype``): there it is compared as a whole tensor (``norm``) at ``TF32_NORM``, on a CPU
    at ``actual``'s dtype, element by element.
    ``norm=True`` checks the whole tensor instead, ``rel_error(actual, expected) ≤ rtol``: the test
    for large matrix-unit (tf32, bf16) results, where sums of hundreds of rounded products leave a
    few elements near zero beyond any elementwise tolerance while the tensor is right.
    """
    if dtype == "dot":  # what a kernel's tl.dot computed in: tf32 on a GPU, as a whole tensor
        dtype = dot_dtype(actual)
        norm = norm or dtype == "tf32"
        if norm and rtol is None:
            rtol = TF32_NORM[grad]
    dtype = dtype or actual.dtype
    if rtol is None or atol is None:
        rtol, atol = tolerance(dtype, grad)
    if norm:
        err = rel_error(actual, expected)
        if not err <= rtol:  # also catches NaN
            raise AssertionError(f"{msg + chr(10) if msg else ''}relative error ‖a − e‖/‖e‖ = "
                                 f"{err:.3g} > {rtol:g} (tolerance for {dtype})")
        return
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(device=a.device, dtype=torch.float64)

    def report(m):
        # torch names the *worst* element; a student debugging a loop wants the *first* one.
        lines = [msg] if msg else []
        if a.shape == e.shape:
            bad = (~torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)).nonzero()
            if len(bad):
                i = tuple(bad[0].tolist())
                want, got = e[i].item(), a[i].item()
                k = next((k for k in range(6, 18) if f"{want:.{k}g}" != f"{got:.{k}g}"), 17)
                lines.append(f"first wrong index {i}: expected {want:.{k}g}, got {got:.{k}g} "
                             f"(difference {abs(got - want):.3g}, allowed "
                             f"{atol + rtol * abs(want):.3g} in {dtype})")
        return "\n".join(lines + [m])

    torch.testing.assert_close(a, e, rtol=rtol, atol=atol, msg=report)
