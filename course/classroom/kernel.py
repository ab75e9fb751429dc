"""One submission's Jupyter kernel, inside its box, driven cell by cell from the grader's side.

The grader starts the kernel itself (``sandbox.command`` around ``ipykernel_launcher``) and talks to
it over Unix sockets in the submission's scratch folder (the box has no network). Every request
has a deadline; while waiting the grader watches the kernel's process, so a kernel that dies
(``os._exit``, a segfault) is reported within a fraction of a second, and one that outlives its
deadline is interrupted and, if it ignores the interrupt, killed.

Everything the kernel sends is untrusted: messages are size-capped, output is kept as a short tail.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import zmq
from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

from course.classroom import sandbox

MAX_MESSAGE = 256 * 2**20  # bytes; a kernel sending more is disconnected
TAIL = 4000  # characters of a cell's output kept for the report
GRACE = 5.0  # seconds an interrupted kernel has to stop before it is killed (at most)


class Died(BaseException):
    """The kernel process ended (BaseException: a check's ``except Exception`` must not eat it)."""


class Stopped(BaseException):
    """The kernel outlived a deadline and ignored the interrupt; it was killed."""


class Interrupted(BaseException):
    """The kernel outlived a deadline; the interrupt stopped the running code."""


class Kernel:
    """A kernel in its box: ``execute`` cells, ``request`` remote calls, ``close`` it."""

    def __init__(self, scratch, library, limits=None, uid=None, log=None, grace=GRACE):
        self.scratch, self.grace = Path(scratch), grace
        conn, _ = write_connection_file(str(self.scratch / "kernel.json"), transport="ipc",
                                        ip=str(self.scratch / "k"))
        os.chmod(conn, 0o644)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", conn,
                "--HistoryManager.enabled=False"]
        cmd = sandbox.command(argv, self.scratch, library, limits or sandbox.Limits(), uid)
        out = open(log or os.devnull, "ab")
        env, plain = sandbox.environment(self.scratch, library), sandbox.mode() == "plain"
        self.proc = subprocess.Popen(cmd, cwd=self.scratch, env=env,
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                     start_new_session=plain,
                                     preexec_fn=die_with_parent if plain else None)
        out.close()
        self.ctx = zmq.Context()
        self.ctx.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        self.ctx.setsockopt(zmq.LINGER, 0)  # never wait at exit for a kernel that is gone
        self.client = BlockingKernelClient(connection_file=conn, context=self.ctx)
        self.client.load_connection_file()
        self.client.start_channels()
        self.dead = None  # why the kernel is gone, once it is

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                self.client.wait_for_ready(timeout=1)
                return
            except RuntimeError:
                continue
        raise Stopped(f"the kernel did not start within {timeout} s")

    def _check_alive(self):
        if self.dead:
            raise Died(self.dead)
        if self.proc.poll() is not None:
            self.dead = f"the kernel died (exit status {self.proc.returncode})"
            raise Died(self.dead)

    def execute(self, code, deadline, silent=False):
        """Run ``code``; returns {status, ename, evalue, traceback, output, data}.

        ``data`` collects the ``application/x-mambalearn-rpc`` payloads the cell published.
        Raises Died, Stopped or Interrupted.
        """
        self._check_alive()
        msg_id = self.client.execute(code, silent=silent, store_history=False, allow_stdin=False)
        res = {"status": "ok", "ename": None, "evalue": None, "traceback": [], "output": "",
               "data": []}
        interrupted = None
        while True:
            now = time.monotonic()
            if interrupted is None and now > deadline:
                self.interrupt()
                interrupted = now
            if interrupted is not None and now > interrupted + self.grace:
                self.kill("it ignored the interrupt")
                raise Stopped("the code ran past its time limit and ignored the interrupt")
            self._check_alive()
            try:
                msg = self.client.get_iopub_msg(timeout=0.2)
            except Exception:  # noqa: BLE001 - queue.Empty: nothing yet
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if self._handle(msg, res):
                break
        while self.client.shell_channel.msg_ready():  # drop the execute replies: iopub said it all
            self.client.shell_channel.get_msg(timeout=0)
        if interrupted is not None:
            raise Interrupted("the code ran past its time limit and was interrupted")
        return res

    def _handle(self, msg, res):
        """Fold one iopub message into ``res``; True once the kernel is idle again."""
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            res["output"] = (res["output"] + content.get("text", ""))[-TAIL:]
        elif kind == "error":
            res.update(status="error", ename=str(content.get("ename"))[:200],
                       evalue=str(content.get("evalue"))[:20000],
                       traceback=[str(t)[:2000] for t in content.get("traceback", [])[-20:]])
        elif kind in ("display_data", "execute_result"):
            data = content.get("data", {})
            if "application/x-mambalearn-rpc" in data:
                res["data"].append(str(data["application/x-mambalearn-rpc"]))
            elif "text/plain" in data:
                res["output"] = (res["output"] + str(data["text/plain"]) + "\n")[-TAIL:]
        elif kind == "status" and content.get("execution_state") == "idle":
            return True
        return False

    def interrupt(self):
        msg = self.client.session.msg("interrupt_request", {})
        self.client.control_channel.send(msg)

    def kill(self, why):
        self.dead = f"the kernel was stopped: {why}"
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        try:
            self.client.stop_channels()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.ctx.destroy(linger=0)


def die_with_parent():
    """(Linux, in a child before exec) SIGKILL for this process when its parent goes away."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except OSError:
        pass
