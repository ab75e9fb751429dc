"""What every exercise check shares: fresh random inputs, calling the student's code, comparing.

A check draws *new* random inputs every run (a seed from the OS, reported on failure so the case
can be replayed), so an answer pasted in from a previous run fails. A failing check raises
``AssertionError`` whose message names the case, the input shapes, the first wrong index and the
expected and actual values; a passing check prints one line that is the same on every run.
"""

import os

import torch

from mambalearn import testing


def generator(seed=None):
    """A ``torch.Generator`` seeded from the OS (or ``seed``); ``g.initial_seed()`` replays it."""
    g = torch.Generator()
    g.manual_seed(int.from_bytes(os.urandom(6), "little") if seed is None else seed)
    return g


def describe(**inputs):
    """'A: (4, 4) float64, delta: 0.3' — how a failure message names its inputs."""
    parts = []
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor):
            if v.numel() == 1:
                parts.append(f"{k}: {v.item():.4g} ({v.dtype})")
            else:
                parts.append(f"{k}: {tuple(v.shape)} {v.dtype}")
        else:
            parts.append(f"{k}: {v!r}")
    return ", ".join(parts)


def call(fn, *args, case, **kwargs):
    """Call the student's ``fn``; turn a crash into an AssertionError that names the case.

    ``NotImplementedError`` passes through unchanged: it means "not written yet", not "wrong".
    """
    try:
        return fn(*args, **kwargs)
    except (NotImplementedError, AssertionError):
        raise
    except Exception as e:  # noqa: BLE001 - any crash of student code is reported the same way
        raise AssertionError(f"{_name(fn)} raised {type(e).__name__} on {case}: {e}") from e


def compare(got, want, *, what, case, g=None, dtype=None, grad=False):
    """Assert that tensor ``got`` equals oracle ``want`` within the tolerance of ``dtype``."""
    seed = f" [seed {g.initial_seed()}]" if g is not None else ""
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what} on {case}: expected a tensor, got {type(got).__name__}{seed}")
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(
            f"{what} on {case}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}{seed}"
        )
    testing.assert_close(got, want, dtype=dtype or got.dtype, grad=grad,
                         msg=f"{what} is wrong on {case}{seed}")


def passed(name, n_checks):
    """The one deterministic line a passing check prints."""
    print(f"✓ {name}: all {n_checks} checks passed (fresh random inputs and edge cases)")


def _name(fn):
    fn = getattr(fn, "fn", fn)  # unwrap a @triton.jit function
    return getattr(fn, "__name__", repr(fn))
