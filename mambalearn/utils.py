"""Small helpers shared by chapters: progress bars and argument checks.

The checks every public function shares live here, once: a tensor's kind and shape
(``check_tensor``), one device (``check_same_device``), a chunk length (``check_chunk_size``), and
the three rules at the boundary of a Triton kernel: tensors a kernel can read
(``check_kernel_device``), no autograd graph silently dropped (``refuse_grad``) and no state
updated in place through an expanded view (``check_writable``).
"""

import operator
import os

import torch

from mambalearn import device


def lazy_attributes(package, where):
    """A package's ``__getattr__`` that imports ``package.<where[name]>`` only when ``name`` is
    asked for (the kernels, and Triton with them, load on first use)."""
    import importlib

    def __getattr__(name):
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def progress(iterable=None, **kwargs):
    """A ``tqdm.auto`` progress bar (a widget in Jupyter, text in a terminal).

    Set ``MAMBALEARN_PROGRESS=0`` to switch bars off everywhere (tests and CI do): tqdm's own
    ``TQDM_DISABLE`` does not reach notebook widget bars created before it is set.
    """
    from tqdm.auto import tqdm

    kwargs.setdefault("disable", os.environ.get("MAMBALEARN_PROGRESS", "1") == "0")
    return tqdm(iterable, **kwargs)


def check_tensor(name, x, ndim=None, dtypes=None, shape=None):
    """Raise a clear error unless ``x`` is a floating tensor of the expected rank/shape.

    ``shape`` may contain ``None`` for "any size". Complex and integer tensors are rejected: every
    formula in this course is written for real floating point numbers.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.is_complex() or not x.is_floating_point():
        raise TypeError(f"{name} must be a real floating tensor, got dtype {x.dtype}")
    if dtypes is not None and x.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {list(dtypes)}, got {x.dtype}")
    if ndim is not None and x.ndim not in ((ndim,) if isinstance(ndim, int) else ndim):
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if shape is not None:
        wrong = x.ndim != len(shape) or any(
            s is not None and s != t for s, t in zip(shape, x.shape, strict=True))
        if wrong:
            want = tuple("*" if s is None else s for s in shape)
            raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")
    return x


def check_same_device(**tensors):
    """Raise if the given tensors (``None`` skipped) live on different devices."""
    devices = {k: v.device for k, v in tensors.items() if v is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


def check_chunk_size(chunk_size, *, power_of_two=False, minimum=1, maximum=None,
                     name="chunk_size"):
    """The one rule for a chunk length q: an int (not a bool) with minimum ≤ q ≤ maximum, and a
    power of two where the kernels tile by it. Returns q as an int.

    Every chunked function (PyTorch or Triton) checks its ``chunk_size`` here, with its own
    bounds: a PyTorch scan takes any q ≥ 1, a Triton kernel a power of two whose q×q tiles fit.
    """
    try:
        q = operator.index(chunk_size)  # ints, NumPy ints; not floats, strings or tensors
    except TypeError:
        q = None
    if q is None or isinstance(chunk_size, bool):
        raise TypeError(f"{name} must be an int, got {type(chunk_size).__name__} {chunk_size!r}")
    rule = ("a power of two" if power_of_two else "an int") + f" ≥ {minimum}" + (
        f" and ≤ {maximum}" if maximum is not None else "")
    if q < minimum or (maximum is not None and q > maximum) or (power_of_two and q & (q - 1)):
        raise ValueError(f"{name} must be {rule}, got {chunk_size!r}")
    return q


def check_kernel_device(**tensors):
    """Raise unless the given tensors (``None`` skipped) are on one device a Triton kernel can
    read: a CUDA GPU, or the CPU while Triton runs in its interpreter (``TRITON_INTERPRET=1``).
    Meta tensors (shapes without data) are refused by name."""
    check_same_device(**tensors)
    given = [(k, t) for k, t in tensors.items() if t is not None]
    if given:  # one device for all (checked above): the first tensor tells
        name, t = given[0]
        if t.is_meta:
            raise ValueError(f"{name} is a meta tensor (a shape without data); the kernels need "
                             f"real tensors on a GPU (or on the CPU in Triton's interpreter)")
        if t.device.type == "cpu" and not device.interpreted():
            raise ValueError(f"{name} is on the CPU but Triton compiles for the GPU here (not in "
                             f"interpreter mode, TRITON_INTERPRET=1); move the tensors to the GPU")
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} is on {t.device}; the kernels run on a CUDA GPU (or on the "
                             f"CPU in Triton's interpreter)")


def refuse_grad(function, hint, **tensors):
    """Raise if autograd is recording and one of ``tensors`` requires grad: ``function`` has no
    backward, and a silently detached result would train nothing. ``hint`` says what to do."""
    if not torch.is_grad_enabled():
        return
    needs = [k for k, t in tensors.items() if isinstance(t, torch.Tensor) and t.requires_grad]
    if needs:
        raise ValueError(f"{function} is not differentiable (no backward), but {', '.join(needs)} "
                         f"{'requires' if len(needs) == 1 else 'require'} grad; {hint}")


def check_writable(name, t):
    """Raise if ``t`` (updated in place) is an expanded view: several of its elements share one
    memory location (a stride of 0 over a dimension longer than 1), so the update would race."""
    if any(st == 0 and sz > 1 for st, sz in zip(t.stride(), t.shape, strict=True)):
        raise ValueError(f"{name} is updated in place but is an expanded view (stride 0, shape "
                         f"{tuple(t.shape)}, strides {t.stride()}): its elements share memory; "
                         f"pass a tensor of its own, e.g. {name}.clone()")
