"""Where code runs: a CUDA GPU when there is one, else the CPU with Triton's interpreter.

Triton reads ``TRITON_INTERPRET`` when a kernel is *decorated* with ``@triton.jit``, so the switch
must happen before any kernel module is imported. Every ``mambalearn.triton`` module imports this
one first; notebooks call ``mambalearn.device.setup()`` in their first code cell.

Demo sizes come from one helper, :func:`size`, so the same notebook cell runs a real shape on a GPU
and a tiny one on a CPU (the interpreter costs about 0.1 ms per scanned element).
"""

import os
import sys

import torch

HAS_GPU = torch.cuda.is_available()

if not HAS_GPU:
    # Must precede the first `@triton.jit` (Triton's own helpers such as tl.cdiv are decorated
    # when `triton` is imported); `setdefault` lets a user force "0" for debugging.
    if "triton" in sys.modules and "TRITON_INTERPRET" not in os.environ:
        import warnings

        warnings.warn("triton was imported before mambalearn on a machine without a GPU, so its "
                      "kernels will not run in the interpreter; import mambalearn first "
                      "(or set TRITON_INTERPRET=1 before starting Python)", stacklevel=2)
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("MAMBALEARN_RECORD_LAUNCHES") and os.environ.get("TRITON_INTERPRET") == "1":
    from mambalearn import launches  # every interpreted launch written down (the sm_90 check)

    launches.record_from_env()


def setup(seed=None):
    """Pick the device, print one line saying which, optionally seed torch. Returns the device."""
    if seed is not None:
        torch.manual_seed(seed)
    return get()


def get():
    """The ``torch.device`` that demos and benchmarks should use."""
    return torch.device("cuda" if HAS_GPU else "cpu")


def interpreted():
    """True when Triton kernels run through the CPU interpreter (no GPU, or forced)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def sm_count(device):
    """Streaming multiprocessors of a CUDA device (0 elsewhere: nothing to fill)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).multi_processor_count


def size(gpu, cpu):
    """A demo size: ``gpu`` on a GPU, ``cpu`` otherwise. Works for ints, tuples and dicts.

    >>> size(gpu=dict(b=8, d=2048, l=2048), cpu=dict(b=1, d=4, l=33))  # doctest: +SKIP
    """
    return gpu if HAS_GPU else cpu


def describe():
    """One line naming the device and the Triton mode, for notebooks and `doctor`."""
    if HAS_GPU:
        return f"GPU: {torch.cuda.get_device_name()} (Triton compiles for it)"
    where = "Linux" if sys.platform.startswith("linux") else sys.platform
    return (f"CPU on {where}: Triton kernels run in the interpreter (TRITON_INTERPRET=1), "
            "small sizes")
