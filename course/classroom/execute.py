"""Executed copies of the chapters, made once and shared by the decks, the site and their tests.

    executed("notebooks/03_operator.ipynb")   # runs it, or returns the copy already made

A copy is kept under ``build/executed/`` (``MAMBALEARN_EXECUTED`` moves it), named by a hash of
the notebook, every source file of the ``mambalearn`` package and of ``course/bench/`` (the
benchmark topics chapters import; no chapter imports the rest of the tooling) and the
python/torch/triton versions: change any of them and the
chapter runs again. A lock per chapter lets parallel test
workers and ``make slides``/``make site`` wait for one run instead of starting their own.

Each run is a child process (``python -m course.classroom.execute``) whose kernel talks over
IPC sockets, not TCP (no "running over TCP without encryption" warning, nothing on a port), draws
with matplotlib's inline backend (``make`` and the tests export MPLBACKEND=Agg, under which
``plt.show()`` outputs nothing) and reports each finished cell, which drives a progress bar.
"""

import fcntl
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat

import mambalearn

PACKAGE = Path(mambalearn.__file__).resolve().parent  # the library the chapters run
BENCH = Path(__file__).resolve().parents[1] / "bench"  # the benchmark topics chapters import
CACHE = Path(os.environ.get("MAMBALEARN_EXECUTED", PACKAGE.parent / "build" / "executed"))
CELL_DONE = "mambalearn-cell-done"  # the line the child prints after each cell
CELL_ERROR = "mambalearn-cell-error"  # ... and before the error of a cell that raised
RAISED = 3  # the child's exit status then
# how the kernel runs (part of the fingerprint): IPC sockets; figures at twice their pixel size,
# shown at their size (sharp on a projector, and room for a deck to enlarge them)
KERNEL_ARGS = ["--InlineBackend.figure_formats=retina"]
KERNEL_CONFIG = {"KernelManager": {"transport": "ipc"}}


def fingerprint(notebook):
    """sha256 of the notebook, the course sources and the versions that change its outputs."""
    h = hashlib.sha256(Path(notebook).read_bytes())
    for root in (PACKAGE, BENCH):
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root.parent)).encode() + path.read_bytes())
    for dist in ("torch", "triton", "numpy", "matplotlib"):
        try:
            h.update(f"{dist}=={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            pass
    h.update(sys.version.encode() + repr((KERNEL_ARGS, KERNEL_CONFIG)).encode())
    return h.hexdigest()[:16]


def executed(notebook, cache=None, timeout=300, position=0, fresh=False):
    """The executed copy of ``notebook`` (a NotebookNode), from the cache or run now.

    ``position``: the line of this notebook's progress bar when several run at once.
    ``fresh``: run even when a copy exists.
    """
    notebook, cache = Path(notebook), Path(cache or CACHE)
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{notebook.stem}-{fingerprint(notebook)}.ipynb"
    with open(cache / f"{notebook.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if fresh or not path.exists():
            nb = execute(nbformat.read(notebook, as_version=4), notebook.parent, timeout,
                         desc=notebook.stem, position=position)
            for old in cache.glob(f"{notebook.stem}-*.ipynb"):
                old.unlink()
            tmp = path.with_suffix(".partial")
            nbformat.write(nb, tmp)
            tmp.replace(path)  # readers never see half a file
    return nbformat.read(path, as_version=4)


def execute(nb, cwd, timeout=300, attempts=2, desc=None, position=0):
    """Run every cell of ``nb`` in a fresh python3 kernel started in ``cwd``; the executed copy.

    A run that fails or exceeds ``timeout`` seconds in a cell is tried once more. ``desc``: the
    label of the progress bar
    (``mambalearn.utils.progress``, off under ``MAMBALEARN_PROGRESS=0``).
    """
    env = dict(os.environ, MPLBACKEND="module://matplotlib_inline.backend_inline")
    env["MAMBALEARN_PROGRESS"] = "0"  # no progress-bar widgets frozen into a page
    n_code = sum(c.cell_type == "code" and bool(c.source.strip()) for c in nb.cells)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in.ipynb", Path(tmp) / "out.ipynb"
        nbformat.write(nb, src)
        cmd = [sys.executable, "-m", __name__, str(src), str(cwd), str(out), str(timeout)]
        for attempt in range(1, attempts + 1):
            try:
                _run(cmd, env, timeout * 10, n_code, desc or Path(cwd).name, position)
                return nbformat.read(out, as_version=4)
            except NotebookError:
                raise  # a cell raised: running it again would only raise again
            except subprocess.SubprocessError as e:
                if attempt == attempts:
                    raise
                print(f"executing {desc} failed ({type(e).__name__}); trying again",
                      file=sys.stderr)


class NotebookError(RuntimeError):
    """A cell raised; the message is its exception, e.g. ``ZeroDivisionError: division by zero``."""


def _run(cmd, env, timeout, total, desc, position):
    """Run the child, advancing a progress bar on each cell it reports; raise if it fails or
    runs longer than ``timeout`` seconds (it is then killed)."""
    from mambalearn.utils import progress

    with progress(total=total, desc=desc, unit="cell", position=position, leave=True) as bar, \
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as child:
        fired = []
        watchdog = threading.Timer(timeout, lambda: fired.append(child.kill()))
        watchdog.start()
        error = None
        try:
            for line in child.stdout:
                if line.strip() == CELL_DONE:
                    bar.update(1)
                elif line.startswith(CELL_ERROR):
                    error = line[len(CELL_ERROR):].strip()
                else:
                    print(line, end="", file=sys.stderr)
            child.wait()
        finally:
            watchdog.cancel()
        if fired:
            raise subprocess.TimeoutExpired(cmd, timeout)
        if child.returncode == RAISED and error:
            raise NotebookError(f"{desc}: {error}")
        if child.returncode != 0:
            raise subprocess.CalledProcessError(child.returncode, cmd)


def _sliced(get_msg, slice_s=1.0):
    """``get_msg`` of a channel, waiting in slices of ``slice_s`` seconds.

    pyzmq's asyncio poll has let a reply that had arrived sit unseen until the poll's timeout
    ran out (a whole cell timeout; on this project's 2-core machines in about one run in three
    of chapter 02): each slice polls anew, so a missed wake-up costs at most a slice.
    """
    from queue import Empty

    async def get(timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = slice_s if deadline is None else min(slice_s, deadline - time.monotonic())
            try:
                return await get_msg(timeout=max(0.0, left))
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    return get


def _run_one(src, cwd, out, timeout):
    """The child process: nbclient runs the notebook over IPC, the result goes to ``out``."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from traitlets.config import Config

    class Client(NotebookClient):
        async def async_start_new_kernel_client(self):
            kc = await super().async_start_new_kernel_client()
            for channel in (kc.shell_channel, kc.iopub_channel):
                channel.get_msg = _sliced(channel.get_msg)
            return kc

    def done(**_):  # nbclient calls it for every code cell it ran (empty ones are not run)
        print(CELL_DONE, flush=True)

    nb = nbformat.read(src, as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(KERNEL_CONFIG)
        config.KernelManager.ip = str(Path(tmp) / "kernel")  # absolute: the kernel runs in cwd
        client = Client(nb, timeout=int(timeout), kernel_name="python3",
                                on_cell_executed=done, extra_arguments=KERNEL_ARGS, config=config,
                                resources={"metadata": {"path": cwd}})
        # The kernel writes to a file, never to a pipe it would inherit from us: with a pipe,
        # ipykernel's capture of fd-level output has held an execute reply back for a whole
        # cell timeout (reproduced with chapter 02's widget cell).
        log = Path(tmp) / "kernel.log"  # shown when the run fails (the kernel's own messages)
        try:
            with open(log, "w") as f:
                client.execute(stdout=f, stderr=subprocess.STDOUT)
        except CellExecutionError as e:  # the traceback for the terminal, one line for the caller
            print(e, file=sys.stderr)
            print(f"{CELL_ERROR} {e.ename}: {e.evalue}".replace("\n", " ")[:500], flush=True)
            sys.exit(RAISED)
        except BaseException:
            sys.stderr.write(log.read_text())
            raise
    nbformat.write(nb, out)


if __name__ == "__main__":
    _run_one(*sys.argv[1:5])
