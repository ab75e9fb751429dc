"""Small helpers shared by chapters: progress bars and argument checks."""

import operator
import os

import torch


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


def check_chunk_size(chunk_size, name="chunk_size", minimum=1):
    """``chunk_size`` as an int, or a ValueError naming the rule: a power of two ≥ ``minimum``.
    (Every chunked kernel checks its chunk here, and honours it: a chunk is never silently
    changed.)"""
    try:
        if isinstance(chunk_size, bool):
            raise TypeError
        q = operator.index(chunk_size)
    except TypeError:
        raise ValueError(f"{name} must be an int (a power of two ≥ {minimum}), "
                         f"got {chunk_size!r}") from None
    if q < minimum or q & (q - 1):
        raise ValueError(f"{name} must be a power of two ≥ {minimum}, got {q}")
    return q
