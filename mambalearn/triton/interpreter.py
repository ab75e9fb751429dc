"""Triton's CPU interpreter, made to multiply bfloat16 as the GPU does.

NumPy has no bfloat16, so the interpreter keeps bf16 tensors as their 16-bit patterns, and its
``tl.dot`` (Triton 3.6 to 3.9) multiplies those patterns as integers: a bf16 matmul comes out
wrong by ~10¹⁰. ``patch_bf16_dot`` widens bf16 operands to float32 before the product (exact: a
bf16 value is a float32 with the low 16 bits zero), which is what the tensor cores compute and
what the interpreter already does for fp8.

``mambalearn.triton`` applies it once on import whenever the kernels run interpreted, so every
kernel of the course (and any other Triton kernel in the same process, mamba_ssm's included)
gets the right bf16 products on a CPU. Where this Triton's interpreter lacks the method the patch
replaces, ``PATCHED`` stays False and `check_bf16` refuses bf16 inputs with a message instead.
"""

import numpy as np

from mambalearn import device

PATCHED = False  # True once tl.dot widens bf16 operands in this process


def patch_bf16_dot():
    """Make the interpreter's ``tl.dot`` widen bfloat16 operands to float32 (for good, once).
    Returns True if the patch is in place."""
    global PATCHED
    import triton.language as tl
    from triton.runtime import interpreter as I

    builder = getattr(I, "InterpreterBuilder", None)
    original = getattr(builder, "create_dot", None)
    if original is None or not hasattr(I, "_convert_float"):
        return False
    if getattr(original, "widens_bf16", False):
        PATCHED = True
        return True

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widen(x):
            if x.dtype.scalar == tl.bfloat16:
                f = I._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32)
                return I.TensorHandle(f.reshape(x.data.shape), tl.float32)
            return x
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot.widens_bf16 = True
    builder.create_dot = create_dot
    PATCHED = True
    return True


def setup():
    """On import of ``mambalearn.triton``: the patch, if the kernels run interpreted."""
    if device.interpreted():
        patch_bf16_dot()


def check_bf16(function, **tensors):
    """Raise where a bf16 input would meet the interpreter's unpatched ``tl.dot``."""
    import torch

    if not device.interpreted() or PATCHED:
        return
    for name, t in tensors.items():
        if t is not None and t.dtype == torch.bfloat16:
            raise TypeError(f"{function}: {name} is bfloat16, but this Triton's CPU interpreter "
                            f"multiplies bf16 wrongly in tl.dot and could not be patched; pass "
                            f"float32 (or float16) on the CPU, or run on a GPU")
