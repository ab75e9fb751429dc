"""Load mamba_ssm's Mamba-3 Triton kernels for the tests, on a GPU or in Triton's CPU interpreter.

On a GPU this is ``mambalearn.bench._reference.load``. On a CPU three things stand in the way of
the interpreter, and each gets a stand-in here (test code only; the library never imports this):
- its utils use PTX inline assembly (cos.approx, tanh.approx): a stub module with the same names,
  jitted from tl.cos / tl.sin / tl.sigmoid, replaces it;
- its autotuners benchmark configs, which needs a GPU driver: one config is kept;
- the interpreter's ``tl.dot`` multiplies bfloat16 *bit patterns* as integers (mamba_ssm casts
  every input to bf16): ``patch_bf16_dot`` widens bf16 operands to float32 first (as the
  interpreter already does for fp8), within a ``monkeypatch``.
einops, imported but unused by the kernels, is stubbed if missing. None if the source is absent.
"""

# ruff: noqa: I001  (mambalearn.device must set TRITON_INTERPRET before triton is imported)
import importlib
import sys
import types

import numpy as np
import torch

from mambalearn import device  # noqa: F401
from mambalearn.bench import _reference

import triton
import triton.language as tl

KERNELS = ("angle_dt", "mamba3_siso_fwd", "mamba3_siso_bwd", "mamba3_siso_step")
PKG = "mamba_ssm.ops.triton.mamba3"


@triton.jit
def cos_approx(x):
    return tl.cos(x)


@triton.jit
def sin_approx(x):
    return tl.sin(x)


@triton.jit
def tanh_approx(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def sech2_approx(x):
    t = 2.0 * tl.sigmoid(2.0 * x) - 1.0
    return 1.0 - t * t


@triton.jit
def sigmoid_approx(x):
    return tl.sigmoid(x)


@triton.jit
def silu(x):
    return x * tl.sigmoid(x)


def _cpu_utils():
    """A stand-in for mamba_ssm's utils module: the same names, no inline assembly."""
    mod = types.ModuleType(f"{PKG}.utils")
    for fn in (cos_approx, sin_approx, tanh_approx, sech2_approx, sigmoid_approx, silu):
        setattr(mod, fn.fn.__name__, fn)
    return mod


def patch_bf16_dot(monkeypatch):
    """Make the interpreter's tl.dot widen bfloat16 operands to float32 (triton 3.6–3.9 bug)."""
    from triton.runtime import interpreter as I

    original = I.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widen(x):
            if x.dtype.scalar == tl.bfloat16:
                f = I._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32)
                return I.TensorHandle(f.reshape(x.data.shape), tl.float32)
            return x
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(I.InterpreterBuilder, "create_dot", create_dot)


def load(name="mamba3_siso_combined", module="mamba3_siso_combined"):
    """mamba_ssm's ``name`` from ``ops/triton/mamba3/<module>``, or None if not importable."""
    if torch.cuda.is_available():
        return _reference.load(f"ops.triton.mamba3.{module}", name)
    if _reference.load("ops.triton.mamba3.utils", "silu") is None:  # absent: the reason printed
        return None
    sys.modules.setdefault("einops", types.SimpleNamespace(rearrange=None, repeat=None))
    sys.modules[f"{PKG}.utils"] = _cpu_utils()
    for kernel_module in KERNELS:
        mod = importlib.import_module(f"{PKG}.{kernel_module}")
        for obj in vars(mod).values():
            if isinstance(obj, triton.runtime.autotuner.Autotuner):
                obj.configs = obj.configs[:1]
    return getattr(importlib.import_module(f"{PKG}.{module}"), name)
