"""What every exercise check shares: fresh random inputs, calling the student's code, comparing.

A check draws *new* random inputs every run, from a seed the OS picks, so an answer pasted in from
a previous run fails. A failing check raises ``AssertionError`` whose message names the case, the
input shapes, the first wrong index and the expected and actual values, then the line that replays
the case (``check.zoh(zoh, seed=…)``: the same inputs again) and the first of the task's hints —
one more each time the check fails *the same way* again (a crash, a wrong shape, a wrong value
of one named output …: :func:`failure_kind`), so trying things out does not run through the
hints; a passing check prints one line that is the same on every run.

The student's code never sees the check's own tensors: :func:`call` hands it private copies and
compares them with the originals afterwards, so the expected answer is computed from inputs the
student's code cannot have changed, and an input changed in place fails with a message saying so.

While grading, the student's function is a ``Remote`` (``course.classroom.remote``): calls go
to the student's kernel and come back. ``call`` and ``compare`` work the same for both; ``probe``
runs a function of ``check._probes`` next to the student's object, here or in that kernel.
"""

import collections
import contextvars
import functools
import inspect
import os
import re
import traceback

import torch

from mambalearn import testing

_CHECKS = os.path.dirname(os.path.abspath(__file__))
_SEED = contextvars.ContextVar("mambalearn_check_seed", default=None)  # the running check's seed
FAILURES = collections.Counter()  # {(check, kind of failure): failed runs}: the hints shown


def fresh_seed():
    return int.from_bytes(os.urandom(6), "little")


def generator(seed=None):
    """A ``torch.Generator`` seeded with ``seed``, else the running check's seed, else the OS's;
    ``g.initial_seed()`` replays it."""
    if seed is None:
        seed = _SEED.get()
    g = torch.Generator()
    g.manual_seed(fresh_seed() if seed is None else seed)
    return g


def describe(**inputs):
    """'A: (4, 4) float64, delta: 0.3' — how a failure message names its inputs."""
    parts = []
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor):
            if v.ndim == 0:
                parts.append(f"{k}: {v.item():.4g} ({v.dtype})")
            elif v.numel() == 1:  # a one-element tensor keeps its shape: (1,) is not a scalar
                parts.append(f"{k}: {tuple(v.shape)} {v.dtype} = [{v.reshape(()).item():.4g}]")
            else:
                parts.append(f"{k}: {tuple(v.shape)} {v.dtype}")
        else:
            parts.append(f"{k}: {v!r}")
    return ", ".join(parts)


def call(fn, *args, case, mutable=(), **kwargs):
    """``fn(*args, **kwargs)`` on private copies of the tensors; returns what it returns.

    The copies are compared with ``args`` afterwards: an argument changed in place fails with an
    AssertionError, unless its position or keyword is in ``mutable`` (a decode step's state: those
    are passed as they are). A crash becomes an AssertionError that names the case;
    ``NotImplementedError`` passes through unchanged: it means "not written yet", not "wrong".
    """
    theirs = [a if i in mutable else _copy(a) for i, a in enumerate(args)]
    kw = {k: v if k in mutable else _copy(v) for k, v in kwargs.items()}
    try:
        result = fn(*theirs, **kw)
    except (NotImplementedError, AssertionError):
        raise
    except Exception as e:  # noqa: BLE001 - any crash of student code is reported the same way
        raise AssertionError(f"{_name(fn)} raised {type(e).__name__} on {case}: {e}") from e
    for i, (mine, after) in enumerate(zip(args, theirs, strict=True)):
        if i not in mutable and _changed(mine, after):
            _mutated(fn, i, case)
    for k, v in kwargs.items():
        if k not in mutable and _changed(v, kw[k]):
            _mutated(fn, k, case)
    return result


def refuses(fn, error, *args, case, rule, **kwargs):
    """Assert that ``fn(*args, **kwargs)`` raises ``error`` (bad input must be refused); ``rule``
    says which rule the input breaks."""
    try:
        fn(*_copy(list(args)), **_copy(kwargs))
    except NotImplementedError:
        raise
    except error:
        return
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{_name(fn)} on {case} must raise {error.__name__} ({rule}), not "
                             f"{type(e).__name__}: {e}") from e
    raise AssertionError(f"{_name(fn)} on {case} must raise {error.__name__}: {rule}")


def _copy(x):
    """A deep copy of the tensors in ``x`` (tuples, lists, dicts followed); the rest as is.

    A tensor's copy has its strides and storage offset too (a strided slice stays one): the
    check's layouts reach the student's code as the check made them.
    """
    if isinstance(x, torch.Tensor):
        twin = torch.empty(0, dtype=x.dtype, device=x.device)
        twin.set_(x.untyped_storage().clone(), x.storage_offset(), x.size(), x.stride())
        return twin.requires_grad_(x.requires_grad)
    if type(x) in (tuple, list):
        return type(x)(_copy(v) for v in x)
    if type(x) is dict:
        return {k: _copy(v) for k, v in x.items()}
    return x


def _changed(before, after):
    """Did the copy ``after`` stop being equal, bit for bit, to ``before``?"""
    if isinstance(before, torch.Tensor):
        if not isinstance(after, torch.Tensor) or after.shape != before.shape \
                or after.dtype != before.dtype:
            return True
        a, b = before.detach(), after.detach().to(before.device)
        return not (torch.equal(a, b) or bool(((a == b) | ((a != a) & (b != b))).all()))
    if type(before) in (tuple, list):
        return len(before) != len(after) or any(_changed(x, y) for x, y in zip(before, after,
                                                                                 strict=True))
    if type(before) is dict:
        return any(_changed(v, after.get(k)) for k, v in before.items())
    return False


def _mutated(fn, where, case):
    name = where if isinstance(where, str) else _argument(fn, where)
    raise AssertionError(
        f"{_name(fn)} changed its argument `{name}` in place on {case}: the check's inputs are "
        f"read-only (the expected answer is computed from them). Compute the result in new "
        f"tensors: `x = x * a`, not `x *= a`, `x.copy_(…)`, `x[…] = …` or `x.data.zero_()`")


def _argument(fn, i):
    """The name of ``fn``'s positional parameter ``i`` (``argument 2`` if it cannot be told)."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return params[i].name
    except Exception:  # noqa: BLE001 - a lambda's *args, a Remote that cannot answer
        return f"argument {i + 1}"


def raw_probe(fn, target, *args, **kwargs):
    """``fn(target, *args, **kwargs)`` for a probe ``fn`` of ``check._probes``: in the student's
    kernel while grading (``target`` is a Remote there), else right here. Exceptions pass as is."""
    remote = getattr(target, "__mambalearn_remote__", None)
    if remote is None:
        return fn(target, *args, **kwargs)
    return remote.probe(fn, *args, **kwargs)


def probe(fn, target, *args, case, **kwargs):
    """:func:`raw_probe` through :func:`call`: private copies, a crash reported as a failure."""
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


_KINDS = (("a crash", r" raised \w+ on "), ("an input changed in place", r"changed its argument"),
          ("a refused input accepted", r"must raise"), ("a wrong shape", r"expected shape"),
          ("a wrong type",
           r"expected a torch\.Tensor|got (?:a |an )?(?:numpy|list|tuple|float|int)"),
          ("not Triton", r"launched no Triton kernel|outside its Triton kernel"))


def failure_kind(message):
    """What kind of failure a check's message reports, for the hints: one of ``_KINDS``, else the
    wrong part the message names ("the state h is wrong on …" → "wrong: the state h"); digits are
    left out, so the same mistake on other random sizes is the same kind."""
    first = (message.splitlines() or [""])[0]
    for name, pattern in _KINDS:
        if re.search(pattern, first):
            return name
    m = re.match(r"(.+?) (?:is|are) wrong\b", first)
    return "wrong: " + re.sub(r"\d+", "#", m[1] if m else first.split(":")[0])[:80]


def student_facing(check, hints=()):
    """Wrap a public check: ``check.zoh(zoh, seed=None)``; one short message on failure.

    ``seed`` replays the inputs of an earlier run (its failure message gives it). A failure adds
    the replay line and ``hints[:k]`` after the k-th failure *of the same kind* (``failure_kind``)
    of this check; passing forgets the count.
    """

    @functools.wraps(check)
    def run(*args, seed=None, **kwargs):
        seed = fresh_seed() if seed is None else int(seed)
        token = _SEED.set(seed)
        try:
            result = check(*args, **kwargs)
            for key in [k for k in FAILURES if k[0] == check.__name__]:
                del FAILURES[key]
            return result
        except NotImplementedError as e:
            what = _name(args[0]) if args else check.__name__
            raise NotWrittenYet(f"{what} is not written yet: replace `raise NotImplementedError()` "
                                f"in its cell with your code, run that cell, then this one"
                                + (f" ({e})" if str(e) else "")) from None
        except AssertionError as e:
            key = (check.__name__, failure_kind(str(e)))
            FAILURES[key] += 1
            call_text = ", ".join([_name(a) for a in args] + [f"seed={seed}"])
            lines = [str(e).rstrip(), f"replay this case: check.{check.__name__}({call_text})"]
            shown = hints[: FAILURES[key]]
            lines += [f"hint {i} of {len(hints)}: {h}" for i, h in enumerate(shown, 1)]
            raise CheckFailed("\n".join(lines)).with_traceback(None) from e.__cause__
        finally:
            _SEED.reset(token)

    run.hints = tuple(hints)
    return run


def kind(x):
    """What ``x`` is, for a message: ``numpy.ndarray``, ``list``, ``Tensor``…"""
    told = getattr(x, "__mambalearn_kind__", None)  # a value the grading kernel described
    if isinstance(told, str):
        return told
    module = type(x).__module__
    return type(x).__qualname__ if module == "builtins" else f"{module}.{type(x).__qualname__}"


def compare(got, want, *, what, case, g=None, dtype=None, grad=False):
    """Assert that tensor ``got`` equals oracle ``want`` within the tolerance of ``dtype``.

    (``g``, the case's generator, is accepted for old call sites; the replay seed is added to the
    message by :func:`student_facing`.)
    """
    if not isinstance(got, torch.Tensor):
        advice = (": return a torch tensor (torch.from_numpy(x) turns an array into one)"
                  if kind(got).startswith("numpy") else "")
        raise AssertionError(f"{what} on {case}: expected a torch.Tensor, got {kind(got)}{advice}")
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(
            f"{what} on {case}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}")
    dtype = dtype or got.dtype
    try:
        testing.assert_close(got, want, dtype=dtype, grad=grad, msg=f"{what} is wrong on {case}")
    except AssertionError as e:
        if dtype == torch.float64 and matches(got, want, dtype=torch.float32):
            raise AssertionError(
                f"{e}\nprecision: your {what} agrees with the answer only to float32 precision "
                f"(about 7 digits), and these inputs are float64: some step ran in float32 (a "
                f".float(), a float32 tensor made with torch.tensor(...) or torch.zeros(...) "
                f"without dtype=…); keep every step in the inputs' dtype") from None
        raise


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
