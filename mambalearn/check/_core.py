"""What every exercise check shares: fresh random inputs, calling the student's code, comparing.

A check draws *new* random inputs every run (a seed from the OS, reported on failure so the case
can be replayed), so an answer pasted in from a previous run fails. A failing check raises
``AssertionError`` whose message names the case, the input shapes, the first wrong index and the
expected and actual values; a passing check prints one line that is the same on every run.

While grading, the student's function is a ``Remote`` (``mambalearn.classroom.remote``): calls go
to the student's kernel and come back. ``call`` and ``compare`` work the same for both; ``probe``
runs a function of ``check._probes`` next to the student's object, here or in that kernel.
"""

import functools
import os
import traceback

import torch

from mambalearn import testing

_CHECKS = os.path.dirname(os.path.abspath(__file__))


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


def raw_probe(fn, target, *args, **kwargs):
    """``fn(target, *args, **kwargs)`` for a probe ``fn`` of ``check._probes``: in the student's
    kernel while grading (``target`` is a Remote there), else right here. Exceptions pass as is."""
    remote = getattr(target, "__mambalearn_remote__", None)
    if remote is None:
        return fn(target, *args, **kwargs)
    return remote.probe(fn, *args, **kwargs)


def probe(fn, target, *args, case, **kwargs):
    """:func:`raw_probe`, with a crash of the student's code reported as in :func:`call`."""
    run = lambda *a, **k: raw_probe(fn, target, *a, **k)
    run.__name__ = _name(target)
    return call(run, *args, case=case, **kwargs)


class CheckFailed(AssertionError):
    """A failed check: a notebook shows its message (and the student's own frames), not ours."""

    def _render_traceback_(self):
        lines = []
        cause = self.__cause__
        if cause is not None and cause.__traceback__ is not None:
            frames = [f for f in traceback.extract_tb(cause.__traceback__)
                      if not f.filename.startswith(_CHECKS)]
            if frames:
                lines += ["Traceback (your code):", *traceback.format_list(frames)]
                lines.append(f"{type(cause).__name__}: {cause}")
                lines.append("")
        return lines + [f"AssertionError: {self}"]


class NotWrittenYet(NotImplementedError):
    """The student's function still raises ``NotImplementedError``: one line, no frames."""

    def _render_traceback_(self):
        return [f"NotImplementedError: {self}"]


def student_facing(check):
    """Wrap a public check so a notebook shows one short message, not the checker's frames."""

    @functools.wraps(check)
    def run(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except NotImplementedError as e:
            what = _name(args[0]) if args else check.__name__
            raise NotWrittenYet(f"{what} is not written yet: replace `raise NotImplementedError()` "
                                f"in its cell with your code, run that cell, then this one"
                                + (f" ({e})" if str(e) else "")) from None
        except CheckFailed:
            raise
        except AssertionError as e:
            raise CheckFailed(str(e)).with_traceback(None) from e.__cause__

    return run


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


def matches(got, want, dtype=None):
    """True if tensor ``got`` equals ``want`` within the tolerance of ``dtype`` (for hints)."""
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        return False
    try:
        testing.assert_close(got, want.to(got.device), dtype=dtype or got.dtype)
    except AssertionError:
        return False
    return True


def passed(name, n_checks):
    """The one deterministic line a passing check prints."""
    print(f"✓ {name}: all {n_checks} checks passed (fresh random inputs and edge cases)")


def _name(fn):
    if getattr(fn, "__mambalearn_remote__", None) is not None:
        return fn.__name__
    fn = getattr(fn, "fn", fn)  # unwrap a @triton.jit function
    return getattr(fn, "__name__", repr(fn))
