"""The bridge between a check (run by the grader) and the student's code (run in the box).

While grading, ``check.zoh(zoh)`` is not executed in the student's kernel. The grader calls
``mambalearn.check.zoh(Remote("zoh"))`` in its own process, with the untouched library as oracle;
each call of the ``Remote`` sends its arguments to the kernel, which runs the student's ``zoh`` on
them and sends the result back. So nothing the student's code does in its kernel (patching torch,
the checks, IPython, printing "✓ passed") reaches the comparison: to pass, the kernel must return
the right numbers for inputs it has never seen.

Requests are ``torch.save``\\ d and base64-encoded into a call of ``__mambalearn_rpc__`` (defined
in the kernel before any notebook cell runs); replies come back as display data and are read with
``torch.load(weights_only=True)``, which builds nothing but tensors and plain containers.
Arguments the student's code changes in place (a decode state, a ``ScanCounter``) are copied back.
A *probe* (a function of ``mambalearn.check._probes``, sent as source) runs in the kernel around
the student's object when a check needs more than a call: gradients, saved memory, launches.
"""

import base64
import builtins
import inspect
import io
from fractions import Fraction

import torch

KERNEL_START = r'''
import mambalearn._grading as __mambalearn_grading__
__mambalearn_grading__.switch_off_torch()
del __mambalearn_grading__
'''

KERNEL_SHIM = r'''
def __mambalearn_rpc__(payload, _cache={}):
    import base64, io, sys, traceback
    from fractions import Fraction
    import torch
    from IPython import get_ipython
    from IPython.display import publish_display_data

    def plain(x, depth=0):
        if depth > 20:
            return {"__opaque__": "a structure nested too deep", "repr": ""}
        if isinstance(x, torch.Tensor):
            x = x.detach()
            return x if type(x) is torch.Tensor else x.as_subclass(torch.Tensor)
        if x is None or type(x) in (bool, int, float, complex, str, bytes, Fraction, torch.dtype):
            return x
        if type(x).__module__ == "numpy" and getattr(x, "shape", None) == ():
            return x.item()  # a numpy scalar: the Python number
        for kind in (bool, int, float, complex):  # other subclasses of the numbers
            if isinstance(x, kind):
                return kind(x)
        if isinstance(x, (tuple, list)):
            return type(x)(plain(v, depth + 1) for v in x) if type(x) in (tuple, list) \
                else tuple(plain(v, depth + 1) for v in x)
        if isinstance(x, dict):
            return {str(k): plain(v, depth + 1) for k, v in x.items()}
        kind = type(x).__module__ + "." + type(x).__qualname__
        return {"__opaque__": kind.removeprefix("builtins."), "repr": repr(x)[:300]}

    def snaps(x, path=()):
        # (path, tensor, its copy) for every tensor in args/kwargs, nested ones too
        if isinstance(x, torch.Tensor):
            return [(path, x, x.detach().clone())]
        if isinstance(x, (tuple, list)):
            return [s for i, v in enumerate(x) for s in snaps(v, path + (i,))]
        if isinstance(x, dict):
            return [s for k, v in x.items() for s in snaps(v, path + (k,))]
        return []

    def changed(before, after):
        if before.shape != after.shape or before.dtype != after.dtype:
            return True
        a, b = before.cpu(), after.detach().cpu()
        return not (torch.equal(a, b) or bool(((a == b) | ((a != a) & (b != b))).all()))

    def send(reply):
        buf = io.BytesIO()
        try:
            torch.save(reply, buf)
        except Exception as e:
            buf = io.BytesIO()
            torch.save({"ok": False, "ename": "TypeError", "tb": "",
                        "evalue": f"the result cannot be sent to the grader ({e})"}, buf)
        data = base64.b64encode(buf.getvalue()).decode()
        publish_display_data({"application/x-mambalearn-rpc": data})

    req = torch.load(io.BytesIO(base64.b64decode(payload)), weights_only=False)
    args, kwargs = list(req.get("args", ())), dict(req.get("kwargs", {}))
    grading = sys.modules.get("mambalearn._grading")
    try:
        ns = get_ipython().user_ns
        if req["path"][0] not in ns:
            raise NameError(f"name {req['path'][0]!r} is not defined: did its cell run "
                            f"without errors?")
        obj = ns[req["path"][0]]
        for attr in req["path"][1:]:
            obj = getattr(obj, attr)
        if req["kind"] == "hasattr":
            send({"ok": True, "result": hasattr(obj, req["attr"]), "mutated": []})
            return
        if req["kind"] == "signature":
            import inspect
            params = inspect.signature(obj).parameters.values()
            result = [(p.name, int(p.kind), p.default is not p.empty) for p in params]
            send({"ok": True, "mutated": [], "result": result})
            return
        before = snaps((args, kwargs))
        if grading is not None:
            grading.DURING.update(req.get("off", ()))
        try:
            if req["kind"] == "probe":
                src, name = req["probe"]
                if src not in _cache:
                    scope = {"__name__": "mambalearn_probes"}
                    exec(compile(src, "<mambalearn probes>", "exec"), scope)
                    _cache[src] = scope
                result = _cache[src][name](obj, *args, **kwargs)
            else:
                result = obj(*args, **kwargs)
        finally:
            if grading is not None:
                grading.DURING.clear()
        mutated = [(path, t.detach().clone()) for path, t, copy in before if changed(copy, t)]
        for i, a in enumerate(args):  # mambalearn objects the code may update (a ScanCounter)
            if not isinstance(a, torch.Tensor) and type(a).__module__.startswith("mambalearn"):
                mutated.append(((0, i, "__dict__"), plain(vars(a))))
        for k, v in kwargs.items():
            if not isinstance(v, torch.Tensor) and type(v).__module__.startswith("mambalearn"):
                mutated.append(((1, k, "__dict__"), plain(vars(v))))
        send({"ok": True, "result": plain(result), "mutated": mutated})
    except BaseException as e:
        tb = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith("<mambalearn")]
        send({"ok": False, "ename": type(e).__name__, "evalue": str(e)[:20000],
              "tb": "".join(traceback.format_list(tb[-6:]))[-4000:]})
'''


class RemoteError(Exception):
    """The student's code raised ``ename`` in the kernel (the class is renamed to ``ename``)."""

    ename = "Exception"


class Opaque:
    """A value the kernel returned that is neither a tensor nor a plain container."""

    def __init__(self, kind, text):
        self.kind, self.text = kind, text

    @property
    def __mambalearn_kind__(self):  # what the checks call it (``check._core.kind``)
        return self.kind

    def __repr__(self):
        return f"<{self.kind}: {self.text}>"


_BUILTIN_ERRORS = ("ValueError", "TypeError", "IndexError", "KeyError", "RuntimeError",
                   "NotImplementedError", "AssertionError", "ZeroDivisionError", "AttributeError",
                   "NameError", "ImportError", "OverflowError", "ArithmeticError", "LookupError")


def _exception(ename, evalue, tb):
    """The exception to raise in the grader for the kernel's ``ename: evalue``."""
    text = f"{evalue}\n(in your code:\n{tb.rstrip()})" if tb and ename not in (
        "NotImplementedError", "AssertionError") else evalue
    if ename in _BUILTIN_ERRORS:
        return getattr(builtins, ename)(text)
    cls = type(ename, (RemoteError,), {"ename": ename})
    return cls(text)


def _rebuild(x):
    if isinstance(x, dict) and "__opaque__" in x:
        return Opaque(str(x["__opaque__"]), str(x.get("repr", "")))
    if isinstance(x, (tuple, list)):
        return type(x)(_rebuild(v) for v in x)
    if isinstance(x, dict):
        return {k: _rebuild(v) for k, v in x.items()}
    return x


class Bridge:
    """Sends requests for the kernel's objects; ``deadline`` is the current cell's (monotonic s)."""

    def __init__(self, kernel, deadline, off=()):
        self.kernel, self.deadline, self.off = kernel, deadline, list(off)

    def request(self, kind, path, args=(), kwargs=None, **extra):
        buf = io.BytesIO()
        torch.save(dict(kind=kind, path=list(path), args=list(args), kwargs=dict(kwargs or {}),
                        off=self.off, **extra), buf)
        code = f'__mambalearn_rpc__("{base64.b64encode(buf.getvalue()).decode()}")'
        res = self.kernel.execute(code, self.deadline, silent=True)
        if not res["data"]:
            why = f"{res['ename']}: {res['evalue']}" if res["status"] == "error" else "no reply"
            raise RemoteError(f"the grader could not reach {'.'.join(path)} in your kernel ({why})")
        reply = _load(res["data"][-1])
        if not reply.get("ok"):
            raise _exception(str(reply.get("ename")), str(reply.get("evalue")),
                             str(reply.get("tb")))
        _copy_back(args, kwargs or {}, reply.get("mutated") or [])
        return _rebuild(reply.get("result"))


UNREADABLE = ("your code returned something the grader cannot read back: return tensors, "
              "numbers, strings, None, or tuples, lists and dicts of them")


def _load(data):
    try:
        raw = base64.b64decode(data, validate=True)
        with torch.serialization.safe_globals([Fraction]):
            reply = torch.load(io.BytesIO(raw), weights_only=True)
    except Exception:  # noqa: BLE001 - whatever the kernel sent, it is the student's failure
        raise RemoteError(UNREADABLE) from None
    if not isinstance(reply, dict):
        raise RemoteError(UNREADABLE)
    return reply


def _copy_back(args, kwargs, mutated):
    """In-place changes the student's code made to tensors (``(path, tensor)``, path into
    (args, kwargs)) and to mambalearn objects such as a ScanCounter (path ending "__dict__")."""
    for path, new in mutated if isinstance(mutated, (list, tuple)) else ():
        try:
            target = (list(args), kwargs)
            for key in path[:-1]:
                target = target[key]
            last = path[-1]
            if last == "__dict__":
                if isinstance(new, dict) and hasattr(target, "__dict__"):
                    target.__dict__.update(_rebuild(new))
                continue
            target = target[last]
        except (IndexError, KeyError, TypeError):
            continue
        if isinstance(target, torch.Tensor) and isinstance(new, torch.Tensor) \
                and target.shape == new.shape:
            with torch.no_grad():
                target.copy_(new.to(device=target.device, dtype=target.dtype))


class Remote:
    """Stands in a check for the kernel's object at ``path`` (``("zoh",)``, ``("f", "fn")``)."""

    def __init__(self, bridge, path):
        self._bridge, self._path = bridge, tuple(path)

    @property
    def __mambalearn_remote__(self):
        return self

    @property
    def __name__(self):  # noqa: A003 - a function's name, as checks print it
        return self._path[-1]

    def __call__(self, *args, **kwargs):
        return self._bridge.request("call", self._path, args, kwargs)

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if not self._bridge.request("hasattr", self._path, attr=attr):
            raise AttributeError(f"{'.'.join(self._path)} has no attribute {attr!r}")
        return Remote(self._bridge, self._path + (attr,))

    @property
    def __signature__(self):
        params = [inspect.Parameter(name, inspect._ParameterKind(kind),
                                    default=None if has_default else inspect.Parameter.empty)
                  for name, kind, has_default in self._bridge.request("signature", self._path)]
        return inspect.Signature(params)

    def probe(self, fn, *args, **kwargs):
        """``fn(obj, *args, **kwargs)`` run in the kernel; ``fn`` lives in ``check._probes``."""
        src = inspect.getsource(inspect.getmodule(fn))
        return self._bridge.request("probe", self._path, args, kwargs, probe=(src, fn.__name__))

    def __repr__(self):
        return f"<your {'.'.join(self._path)}, in the grading kernel>"
