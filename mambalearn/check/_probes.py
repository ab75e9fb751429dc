"""Code that runs *next to* the student's function, where a plain call does not say enough.

Each probe is ``probe(obj, *args)`` with ``obj`` the student's function or class. In a notebook it
is called directly; while grading it runs inside the student's kernel (this module is sent there as
source, so it imports nothing from ``mambalearn.check``) and only its *result* comes back, to be
compared by the check with the grader's own oracle. A probe computes no verdict itself.
"""

import torch


def tree_results(op, steps, orders, identity):
    """Evaluate ``op`` on ``steps`` in each bracketing of ``orders``; returns one result per order.

    An order is ("tree", nested tuple of step indices), ("hs",) for every Hillis–Steele prefix or
    ("blelloch",) for every Blelloch exclusive prefix. ``op`` takes pairs or 4 flat arguments.
    """
    fn = getattr(op, "fn", op)  # a @triton.jit combine: the Python function it wraps
    import inspect

    flat = len(inspect.signature(fn).parameters) == 4
    pair = (lambda l, r: tuple(fn(*l, *r))) if flat else (lambda l, r: tuple(fn(l, r)))

    def tree(t):
        return steps[t] if isinstance(t, int) else pair(tree(t[0]), tree(t[1]))

    out = []
    for order in orders:
        if order[0] == "tree":
            out.append(tree(order[1]))
        elif order[0] == "hs":
            x, k = list(steps), 1
            while k < len(x):
                x = [x[i] if i < k else pair(x[i - k], x[i]) for i in range(len(x))]
                k *= 2
            out.append(x)
        else:
            out.append(_blelloch(steps, pair, identity))
    return out


def _blelloch(steps, op, ident):
    """Exclusive prefixes by up-sweep and down-sweep over a power-of-two padded tree."""
    n = 1 << (len(steps) - 1).bit_length()
    x = list(steps) + [ident] * (n - len(steps))
    k = 1
    while k < n:  # up-sweep: x[i] holds the combine of the block ending at i
        for i in range(2 * k - 1, n, 2 * k):
            x[i] = op(x[i - k], x[i])
        k *= 2
    x[n - 1] = ident
    while k > 1:  # down-sweep: the left child gets the parent's prefix
        k //= 2
        for i in range(2 * k - 1, n, 2 * k):
            x[i - k], x[i] = x[i], op(x[i], x[i - k])
    return x[: len(steps)]


def fold_labels(fold, names):
    """``fold(names, op=label)`` with the non-associative ``label(l, r) = "(l⊗r)"``."""
    return fold(names, op=lambda l, r: f"({l}⊗{r})")


def fold_matrices(fold, steps):
    """``fold`` of (A, u) steps with a ⊗ of the probe's own (neither the library's nor yours)."""

    def op(left, right):
        (A_l, u_l), (A_r, u_r) = left, right
        if getattr(A_r, "ndim", 0) == getattr(u_r, "ndim", 0) + 1:
            return A_r @ A_l, (A_r @ u_l[..., None])[..., 0] + u_r
        return A_r * A_l, A_r * u_l + u_r

    return fold(steps, op=op)


def _launch_classes():
    from triton.runtime import interpreter, jit

    return [cls for cls in (jit.JITFunction, interpreter.InterpretedFunction)
            if "run" in cls.__dict__]


# What PyTorch may do while a Triton exercise runs: make, view, copy and test tensors. Anything
# else computes values, which must come from the student's kernel.
MOVES = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "new_zeros", "ones", "ones_like", "full", "full_like", "new_full", "fill_",
    "zero_", "arange", "clone", "copy_", "_to_copy", "contiguous", "detach", "alias", "lift_fresh",
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "t", "transpose",
    "permute", "expand", "squeeze", "unsqueeze", "slice", "select", "narrow", "unbind", "split",
    "split_with_sizes", "chunk", "flatten", "unflatten", "movedim", "cat", "stack", "set_",
    "resize_", "eq", "ne", "lt", "le", "gt", "ge", "all", "any", "isnan", "isinf", "isfinite",
    "equal", "is_nonzero", "_local_scalar_dense", "is_same_size", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset",
}


def call_watching_triton(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` watched: (result, seen) with ``seen`` =

    * ``launched``: the Triton kernels it launched;
    * ``computed``: the PyTorch ops outside a launch that computed values (not in ``MOVES``);
    * ``foreign``: tensors a launch received that are neither inputs nor made by PyTorch during
      the call, or that changed since PyTorch last touched them (written through numpy, say);
    * ``returned``: for each returned tensor, who wrote its values last: "triton" (a launch that
      got it, or a copy of such values), "input", "torch:<op>", or "not made by PyTorch".
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = dict(launched=[], computed=[], foreign=[], returned=[])
    inputs = {_ptr(t) for t in _tensors((args, kwargs))}
    made = {}  # storage pointer → [snapshot of its bytes, writer]
    state = {"launch": None, "quiet": 0}

    def snapshot(t):  # the bytes of t's storage (the copy made without being watched)
        state["quiet"] += 1
        try:
            s = t.untyped_storage()
            return torch.empty(0, dtype=torch.uint8, device=s.device).set_(s).clone()
        finally:
            state["quiet"] -= 1

    def unchanged(t):
        state["quiet"] += 1
        try:
            return torch.equal(made[_ptr(t)][0], snapshot(t))
        finally:
            state["quiet"] -= 1

    def writer_of(sources):
        return "triton" if sources and all(made.get(_ptr(t), (0, ""))[1] == "triton"
                                           for t in sources) else None

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), k=None):
            k = k or {}
            out = func(*a, **k)
            if state["quiet"]:
                return out
            name = func.overloadpacket.__name__
            if state["launch"] is None and name not in MOVES:
                seen["computed"].append(f"aten.{name}")
            written = [x for i, x in enumerate(a) if isinstance(x, torch.Tensor)
                       and i < len(func._schema.arguments)
                       and func._schema.arguments[i].alias_info is not None
                       and func._schema.arguments[i].alias_info.is_write]
            fresh = [x for x in _tensors(out) if _ptr(x) not in inputs
                     and all(_ptr(x) != _ptr(y) for y in _tensors((a, k)))]
            sources = [x for x in _tensors((a, k)) if all(x is not w for w in written)]
            who = ("triton" if state["launch"] else writer_of(sources) or f"torch:{name}")
            for x in written + fresh:
                if _ptr(x) not in inputs:
                    made[_ptr(x)] = [snapshot(x), who]
            return out

    def watching(original):
        def run(self, *a, **k):
            name = getattr(getattr(self, "fn", None), "__name__", "?")
            seen["launched"].append(name)
            given = [x for x in _tensors((a, k))]
            for x in given:
                if _ptr(x) in inputs:
                    continue
                if _ptr(x) not in made:
                    seen["foreign"].append(f"{name} got a tensor that is neither an input nor "
                                           f"made by PyTorch (numpy memory?)")
                elif not unchanged(x):
                    seen["foreign"].append(f"a tensor {name} got was changed outside PyTorch "
                                           f"and Triton (through numpy?)")
            state["launch"] = name
            try:
                return original(self, *a, **k)
            finally:
                state["launch"] = None
                for x in given:
                    if _ptr(x) not in inputs:
                        made[_ptr(x)] = [snapshot(x), "triton"]
        return run

    originals = {cls: cls.__dict__["run"] for cls in _launch_classes()}
    for cls, original in originals.items():
        cls.run = watching(original)
    try:
        with Watch():
            result = fn(*args, **kwargs)
        for x in _tensors(result):
            if _ptr(x) in inputs:
                seen["returned"].append("input")
            elif _ptr(x) not in made:
                seen["returned"].append("not made by PyTorch")
            elif not unchanged(x):
                seen["returned"].append("changed outside PyTorch and Triton")
            else:
                seen["returned"].append(made[_ptr(x)][1])
    finally:
        for cls, original in originals.items():
            cls.run = original
    seen["launched"] = sorted(set(seen["launched"]))
    seen["computed"] = sorted(set(seen["computed"]))
    return result, seen


def call_counting_work(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` and what it ran: (result, {"computed": how many PyTorch ops that
    compute values (not in ``MOVES``), "launched": how many Triton launches}). Lighter than
    :func:`call_watching_triton`: it counts, it does not follow where values go."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = {"computed": 0, "launched": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), k=None):
            if func.overloadpacket.__name__ not in MOVES:
                seen["computed"] += 1
            return func(*a, **(k or {}))

    def counting(original):
        def run(self, *a, **k):
            seen["launched"] += 1
            return original(self, *a, **k)
        return run

    originals = {cls: cls.__dict__["run"] for cls in _launch_classes()}
    for cls, original in originals.items():
        cls.run = counting(original)
    try:
        with Count():
            result = fn(*args, **kwargs)
    finally:
        for cls, original in originals.items():
            cls.run = original
    return result, seen


def _tensors(x):
    """Every tensor in ``x`` (tuples, lists and dict values followed)."""
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _ptr(t):
    return t.untyped_storage().data_ptr()


def call_counting_backward(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` and how often it ran autograd's backward (``torch.autograd.grad``,
    ``Tensor.backward``, ``torch.func.vjp`` all pass through the engine call counted here)."""
    import torch.autograd
    from torch.autograd import graph

    runs, original = [0], graph._engine_run_backward

    def counting(*a, **k):
        runs[0] += 1
        return original(*a, **k)

    torch.autograd._engine_run_backward = graph._engine_run_backward = counting
    try:
        return fn(*args, **kwargs), runs[0]
    finally:
        torch.autograd._engine_run_backward = graph._engine_run_backward = original


def chunked_fn_grads(cls, a, b, chunk_size, h0, grad_h):
    """h = cls.apply(a, b, q, h0) and the gradients of ⟨grad_h, h⟩ w.r.t. a, b (and h0)."""
    a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
    h0 = None if h0 is None else h0.detach().requires_grad_()
    h = cls.apply(a, b, chunk_size, h0)
    inputs = [a, b] + ([h0] if h0 is not None else [])
    grads = torch.autograd.grad(h, inputs, grad_h, allow_unused=True)
    return h.detach(), list(grads)


def chunked_fn_saved_bytes(cls, a, b, chunk_size, h0):
    """Bytes the Function keeps for its backward beyond its inputs (saved tensors and ctx attrs)."""
    a, b, h0 = (x.detach().requires_grad_() for x in (a, b, h0))
    inputs = {t.untyped_storage().data_ptr() for t in (a, b, h0)}
    seen, total = set(inputs), [0]

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        h = cls.apply(a, b, chunk_size, h0)
    for v in getattr(h.grad_fn, "__dict__", {}).values():  # tensors hung on ctx (ctx.h = h)
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total[0] += t.untyped_storage().nbytes()
    return total[0]


def block_grads(block, hidden, weights, grad_out):
    """``block(hidden, weights)`` and the gradients of ⟨grad_out, out⟩ w.r.t. hidden and weights."""
    hidden = hidden.detach().requires_grad_()
    weights = {k: v.detach().requires_grad_() for k, v in weights.items()}
    out = block(hidden, weights)
    names = list(weights)
    grads = torch.autograd.grad(out, [hidden] + [weights[k] for k in names], grad_out,
                                allow_unused=True)
    return out.detach(), grads[0], dict(zip(names, grads[1:], strict=True))


def output_and_grad(fn, x, grad_out):
    """``fn(x)`` and the gradient of ⟨grad_out, fn(x)⟩ w.r.t. x (None when x is not used)."""
    x = x.detach().requires_grad_()
    out = fn(x)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        return out, None
    (grad,) = torch.autograd.grad(out, x, grad_out.to(out.dtype), allow_unused=True)
    return out.detach(), grad


def table(fn, *shape_args, n=None):
    """``[fn(i, *shape_args) for i in range(n)]``: a pure function's whole table in one request."""
    return [fn(i, *shape_args) for i in range(n)]
