"""Start several processes, one per rank, each in a real ``torch.distributed`` process group.

``spawn(fn, world_size)`` runs ``fn(rank, *args)`` on ``world_size`` processes joined in a group
(gloo for CPU tensors, NCCL for one GPU per rank) and returns the ``world_size`` results in rank
order. A notebook cell or a test can thus use real collectives without ``torchrun``:

    >>> spawn(lambda rank: rank * 10, 3)  # doctest: +SKIP
    [0, 10, 20]

On a machine without a GPU the processes are *forked* (fast: nothing is imported again). Where
CUDA is available they are started fresh (``spawn``): CUDA cannot be forked, and once the parent
has run one backward, PyTorch's autograd engine has started a thread per GPU, after which a forked
child's backward fails ("Unable to handle autograd's threading in combination with fork-based
multiprocessing") — even with CPU tensors under gloo. A fresh process needs ``fn`` and ``args``
pickled: ``cloudpickle`` sends them by value, so functions defined in a notebook work either way.
Gloo talks over the loopback interface (every rank is on this machine). Every collective runs
under the group's timeout; ``spawn`` itself gives up ``grace`` seconds after
it, so a broken program ends with an error, never a hang. An exception on any rank is raised in
the caller as :class:`RankError`, which holds every rank's exception.
"""

import collections
import datetime
import io
import multiprocessing
import os
import pickle
import queue
import shutil
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist

# NVLink multicast (NVLS) stays off in every process this module starts (the lent machines ask
# for it: see the device notes); the other two switches are the same feature in symmetric memory
# and NVSHMEM.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


class _Pickled:
    """Bytes from cloudpickle, loaded again in the rank's process (plain ``pickle``).

    ``torch.ops`` is sent by name: cloudpickle takes it for a submodule of ``torch`` whenever a
    function uses ``torch`` and some name ``ops`` (chapter 03's ``mambalearn.ops``), and the
    object itself cannot be pickled.
    """

    def __init__(self, data):
        self.data = data

    @classmethod
    def dump(cls, obj):
        import cloudpickle

        class Pickler(cloudpickle.Pickler):
            dispatch_table = collections.ChainMap(
                {type(torch.ops): lambda _: (getattr, (torch, "ops"))},
                cloudpickle.Pickler.dispatch_table)

        buf = io.BytesIO()
        Pickler(buf).dump(obj)
        return cls(buf.getvalue())

    @staticmethod
    def load(obj):
        return pickle.loads(obj.data) if isinstance(obj, _Pickled) else obj


class RankError(RuntimeError):
    """One or more ranks raised. ``errors`` maps each failed rank to its exception."""

    def __init__(self, errors, tracebacks):
        self.errors, self.tracebacks = errors, tracebacks
        lines = [f"rank {r}: {type(e).__name__}: {e}" for r, e in sorted(errors.items())]
        first = min(errors)
        super().__init__(f"{len(errors)} rank(s) failed\n" + "\n".join(lines) +
                         f"\n--- traceback of rank {first} ---\n{tracebacks[first]}")


def default_backend(world_size):
    """"nccl" when there is one CUDA GPU per rank, else "gloo" (CPU tensors)."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        if torch.cuda.device_count() >= world_size:
            return "nccl"
    return "gloo"


def _worker(rank, world_size, backend, init_file, timeout, threads, fn, args, results):
    os.environ.update(NCCL_ENV)
    # every rank is on this machine: talk over loopback (no hostname lookup, which fails in
    # sandboxes and containers without a resolvable hostname)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo0" if sys.platform == "darwin" else "lo")
    torch.set_num_threads(threads)  # several processes share the cores: one thread each
    status = None
    try:
        fn, args = _Pickled.load(fn), _Pickled.load(args)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        # every rank connected before any runs fn: a rank that fails at once and exits while
        # another still connects to it would leave that one waiting for the whole timeout
        dist.barrier()
        status = ("ok", fn(rank, *args), None)
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the caller
        status = ("error", e, traceback.format_exc())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    try:  # plain pickle, by value: the process ends before the caller reads the tensors
        results.put((rank, pickle.dumps(status)))
    except Exception as e:  # noqa: BLE001 - an unpicklable result or exception
        results.put((rank, pickle.dumps(("error", RuntimeError(f"{type(e).__name__}: {e} "
                                        f"(the result of rank {rank} could not be pickled)"),
                                         status[2] or ""))))


def default_start_method(backend):
    """"fork" on a CPU-only machine under gloo, else "spawn" (module doc: CUDA and autograd)."""
    return "fork" if backend == "gloo" and not torch.cuda.is_available() else "spawn"


def spawn(fn, world_size, backend=None, args=(), timeout=60.0, grace=30.0, threads=1,
          start_method=None):
    """Run ``fn(rank, *args)`` on ``world_size`` processes in one group; results in rank order.

    Args:
        fn:           called as ``fn(rank, *args)`` after ``init_process_group``; its return value
                      must pickle (tensors are copied back by value)
        world_size:   number of processes, ≥ 1
        backend:      "gloo" or "nccl"; None = NCCL if there is a GPU per rank, else gloo
        timeout:      seconds any collective may wait (the process group's timeout)
        grace:        extra seconds before the caller stops waiting and kills the processes
        threads:      torch threads per process
        start_method: "fork" or "spawn"; None = ``default_start_method(backend)`` ("spawn"
                      wherever CUDA is available, required for NCCL)

    Raises :class:`RankError` if any rank raised (every rank's exception is in ``errors``) and
    ``TimeoutError`` if the processes did not finish in ``timeout + grace`` seconds.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    backend = backend or default_backend(world_size)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f'backend must be "gloo" or "nccl", got {backend!r}')
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend 'nccl' needs one GPU per rank: world_size = {world_size}, "
                         f"GPUs = {torch.cuda.device_count()}")
    start_method = start_method or default_start_method(backend)
    if start_method not in ("fork", "spawn"):
        raise ValueError(f'start_method must be "fork" or "spawn", got {start_method!r}')
    if backend == "nccl" and start_method == "fork":
        raise ValueError("backend 'nccl' needs start_method='spawn' (CUDA cannot be forked)")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if start_method == "spawn":  # by value: notebook functions, lambdas and closures travel too
        fn, args = _Pickled.dump(fn), _Pickled.dump(args)
    os.environ.update(NCCL_ENV)  # inherited by the children, whichever start method
    ctx = multiprocessing.get_context(start_method)
    results = ctx.Queue()
    tmp = tempfile.mkdtemp(prefix="mambalearn-spawn-")
    init_file = os.path.join(tmp, "rendezvous")
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(r, world_size, backend, init_file, timeout, threads, fn, args,
                               results)) for r in range(world_size)]
    try:
        for p in procs:
            p.start()
        return _collect(procs, results, timeout + grace)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
        shutil.rmtree(tmp, ignore_errors=True)


def _collect(procs, results, limit):
    """Wait for one message per rank (or a dead rank); return results or raise RankError."""
    deadline, got, dead_since = time.monotonic() + limit, {}, {}
    while len(got) < len(procs):
        try:
            rank, blob = results.get(timeout=0.05)
            got[rank] = pickle.loads(blob)
            continue
        except queue.Empty:
            pass
        now = time.monotonic()
        for r, p in enumerate(procs):
            if r in got or p.is_alive():
                continue
            # a finished rank's message may still be in the pipe: wait a moment before giving up
            if now - dead_since.setdefault(r, now) > 2.0:
                got[r] = ("error", RuntimeError(f"rank {r} died with exit code {p.exitcode} "
                                                f"and no result"), "")
        if now > deadline:
            raise TimeoutError(f"ranks {sorted(set(range(len(procs))) - set(got))} did not "
                               f"finish within {limit:.0f} s; they were killed")
    errors = {r: s[1] for r, s in got.items() if s[0] == "error"}
    if errors:
        raise RankError(errors, {r: got[r][2] for r in errors})
    return [got[r][1] for r in range(len(procs))]
