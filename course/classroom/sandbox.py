"""The box a submission's kernel runs in: bubblewrap, its own user, no network, resource limits.

A graded notebook is untrusted code running with the instructor's rights. Each submission's
Jupyter kernel is started as

    bwrap (read-only: /usr, /etc, Python, the venv, the graded copy of the library;
           writable: the submission's own scratch folder; a private /tmp; no network)
      setpriv (a user id of its own, when the grader runs as root)
        prlimit (processes, file size, core dumps)
          python -m ipykernel_launcher -f <connection file in the scratch folder>

Nothing else of the host is mounted: not the repository (so not ``solutions/``), not the other
submissions, not the gradebook, not the checks (they run outside, in the grader; see
``course.classroom.runner``). ``--unshare-net`` leaves the kernel only a loopback of its own;
it talks to the grader through Unix sockets in the scratch folder. ``--die-with-parent`` and a
pid namespace of its own make the whole box vanish when the grader lets go of it.

Where ``bwrap`` is missing (macOS, a container without user namespaces) :func:`command` prints a
warning once and falls back to a plain subprocess with the same limits, environment and library
copy: the student's code can then read and write what the grader can.
"""

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_PROBED = {}


@dataclass(frozen=True)
class Limits:
    """Resource limits of one submission: processes (threads count), bytes per file, /tmp size."""

    nproc: int = 512
    fsize: int = 256 * 2**20
    tmp_bytes: int = 512 * 2**20


def bwrap_works():
    """True if ``bwrap`` exists and can build a box here (root, or user namespaces allowed)."""
    if "bwrap" not in _PROBED:
        exe = shutil.which("bwrap")
        ok = False
        if exe:
            probe = [exe, "--ro-bind", "/", "/", "--unshare-net", "--die-with-parent", "true"]
            ok = subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
        _PROBED["bwrap"] = ok
    return _PROBED["bwrap"]


def mode():
    """``"bwrap"`` or ``"plain"``; ``MAMBALEARN_SANDBOX=plain`` forces the fallback (for tests)."""
    if os.environ.get("MAMBALEARN_SANDBOX") == "plain":
        return "plain"
    return "bwrap" if bwrap_works() else "plain"


def warn_if_unboxed():
    """Print (once) what the fallback means, so an instructor never grades unboxed by accident."""
    if mode() == "plain" and not _PROBED.get("warned"):
        _PROBED["warned"] = True
        print("warning: bubblewrap (bwrap) is not available, so submissions run WITHOUT a sandbox: "
              "their code can read and write whatever you can. Install it (Debian/Ubuntu: "
              "apt-get install bubblewrap) before grading untrusted notebooks.",
              file=sys.stderr, flush=True)


def _parents(paths):
    """bwrap arguments making every ancestor of ``paths`` world-readable (bwrap's are 0700)."""
    out, seen = [], set()
    for p in paths:
        parts = Path(p).parts[1:-1]
        for i in range(1, len(parts) + 1):
            d = "/" + "/".join(parts[:i])
            if d not in seen and d not in ("/usr", "/etc", "/tmp"):
                seen.add(d)
                out += ["--perms", "0755", "--dir", d]
    return out


def _system_binds():
    """/usr and /etc read-only; the merged-/usr links (/bin, /lib…) as links or binds."""
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def _gpu_binds():
    """NVIDIA device nodes and the driver's /proc and /sys entries, where they exist."""
    nodes = sorted(str(p) for p in Path("/dev").glob("nvidia*"))
    if not nodes:
        return []
    args = [a for n in nodes for a in ("--dev-bind", n, n)]
    for extra in ("/sys", "/proc/driver/nvidia"):
        if os.path.exists(extra):
            args += ["--ro-bind", extra, extra]
    return args


def _user_tasks(uid):
    """Tasks (threads) the user already runs: RLIMIT_NPROC counts them all, not just ours."""
    n = 0
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if p.stat().st_uid == uid:
                    n += len(os.listdir(p / "task"))
            except OSError:
                pass
    return n


def _others_can_run_python():
    """Can a user other than us run this Python? (Outside a box, /root is often mode 0700.)"""
    for path in {os.path.realpath(sys.executable), sys.prefix, sys.base_prefix}:
        p = Path(path)
        for d in [p, *p.parents]:
            if d.is_dir() and not os.stat(d).st_mode & 0o001:
                return False
    return True


def limits_prefix(limits, uid=None):
    """``setpriv``/``prlimit`` words: a user of its own (root only), then the limits."""
    words = []
    own_user = mode() == "bwrap" or _others_can_run_python()
    if os.geteuid() == 0 and uid is not None and own_user and shutil.which("setpriv"):
        words += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                  "--no-new-privs"]
        nproc = limits.nproc
    else:  # the limit counts every task of this user: leave room for what already runs
        nproc = limits.nproc + _user_tasks(os.getuid())
    if shutil.which("prlimit"):
        words += ["prlimit", f"--nproc={nproc}", f"--fsize={limits.fsize}", "--core=0", "--"]
    return words


RECORD = "MAMBALEARN_RECORD_LAUNCHES"  # set by `make test` only: mambalearn.launches


def environment(scratch, library):
    """The kernel's whole environment: nothing of the grader's (tokens, paths) leaks in."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(scratch), "TMPDIR": "/tmp" if mode() == "bwrap" else str(scratch),
        "PYTHONPATH": str(library), "PYTHONHASHSEED": "0", "PYTHONNOUSERSITE": "1",
        "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "MAMBALEARN_PROGRESS": "0",
        "MPLCONFIGDIR": f"{scratch}/.config/matplotlib", "TRITON_CACHE_DIR": f"{scratch}/.triton",
        "JUPYTER_PLATFORM_DIRS": "1", "IPYTHONDIR": f"{scratch}/.ipython",
    }
    for key in ("CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET", RECORD):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def command(argv, scratch, library, limits=Limits(), uid=None):
    """The full command line that runs ``argv`` (the kernel) inside the box.

    ``scratch`` is the submission's own folder (writable, bound at the same path so the Unix
    sockets of the connection file resolve on both sides); ``library`` the folder holding the
    graded copy of ``mambalearn`` (read-only).
    """
    inner = limits_prefix(limits, uid) + list(argv)
    if mode() == "plain":
        return inner
    exe = Path(sys.executable)
    ro = sorted({sys.base_prefix, sys.prefix, str(library)} - {"/usr"})
    args = ["bwrap", "--die-with-parent", "--new-session", "--unshare-net", "--unshare-pid",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "grading",
            "--tmpfs", "/", "--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
            "--proc", "/proc", "--dev", "/dev",
            # a private, size-capped /dev/shm: multiprocessing's locks live there (chapter 14
            # spawns its ranks); it is the box's own tmpfs, not the host's
            "--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/dev/shm",
            *_system_binds()]
    args += _parents([*ro, str(scratch), str(exe)])
    for path in ro:
        args += ["--ro-bind", path, path]
    args += ["--bind", str(scratch), str(scratch), "--chdir", str(scratch), *_gpu_binds()]
    if os.environ.get(RECORD):  # the test suite's record of kernel launches (sm_90 build check)
        os.makedirs(os.environ[RECORD], exist_ok=True)
        os.chmod(os.environ[RECORD], 0o1777)  # the box's user writes its own file there
        args += _parents([os.environ[RECORD]]) + ["--bind", os.environ[RECORD],
                                                  os.environ[RECORD]]
    return args + ["--", *inner]
