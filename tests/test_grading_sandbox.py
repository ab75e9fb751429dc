"""Issue 19 §3: every submission runs in its own box. One class of chapter-01 submissions, each
with a right answer and one attack at the top of its ``zoh`` cell, graded once (two at a time)
from a copy of the package — so an attack that got out could only damage the copy. Each test
below asserts on the host what the attack tried to change, and that it failed alone: its other
tasks still pass.

The runaway cases are bounded (400 processes against a limit of 128, 200 MB against 32 MB): they
show the limit, they cannot hurt the machine if it is missing.
"""

import os
import re
import socket
import subprocess
import textwrap
import threading
from pathlib import Path

import pytest
from _grading_cases import edited, grade_class_in, repo_copy

from course.classroom import sandbox

if not sandbox.bwrap_works():
    if os.environ.get("CI"):
        raise RuntimeError("bubblewrap is missing or cannot build a box here: "
                           "run tools/browser-deps.sh")
    pytest.skip("bubblewrap (bwrap) is not available: the box is what these tests test",
                allow_module_level=True)

MARK = "mambalearn-sandbox-test"  # a file name no one else uses
SLEEP = "61.2345678"  # a sleep no other process on the machine runs (ps shows "sleep 61.2345678")


def attacks(root, repo, port, secret):
    """{student: code run before a right zoh}: each tries one way out of the box."""
    bob = root / "class" / "bob" / "01_discretization.ipynb"
    return {
        "alice_writes_bob": f"""
            import os
            for f in os.listdir({str(bob.parent)!r}):
                open(os.path.join({str(bob.parent)!r}, f), "a").write("alice was here")
            """,
        "carol_reads_bob": f"print(open({str(bob)!r}).read()[:100])",
        "dave_writes_checks": f"""
            import mambalearn, os
            for path in ({str(repo / "mambalearn/check/ch01_discretization.py")!r},
                         {str(repo / "course/classroom/pristine/01_discretization.ipynb")!r},
                         {str(repo / "exercises/ex01_discretization.ipynb")!r},
                         os.path.join(os.path.dirname(mambalearn.__file__), "discretize.py")):
                try:
                    open(path, "a").write("# tampered")
                except OSError as e:
                    print("blocked:", e)
            open(os.path.join(os.path.dirname(mambalearn.__file__), "ops.py"), "a")
            """,
        "erin_writes_gradebook": f"open({str(root / 'grades.csv')!r}, 'w').write('erin,3,3,3')",
        "frank_opens_sockets": f"""
            import socket
            try:
                socket.create_connection(("1.1.1.1", 53), timeout=3)
            except OSError as e:
                print("no network:", e)
            socket.create_connection(("127.0.0.1", {port}), timeout=3)
            """,
        "grace_forks_a_lot": """
            import subprocess
            children = []
            try:
                for _ in range(400):
                    children.append(subprocess.Popen(["sleep", "30"]))
            finally:  # give the slots back, so the rest of the notebook can run
                for child in children:
                    child.kill()
                    child.wait()
            """,
        "heidi_writes_a_huge_file": """
            with open("big.bin", "wb") as f:
                for _ in range(200):
                    f.write(b"x" * 2**20)
            """,
        "ivan_reads_the_host": f"print(open({str(secret)!r}).read())",
        "judy_uses_tmp_and_home": f"""
            import os, subprocess, time
            child = subprocess.Popen(["sleep", "{SLEEP}"], start_new_session=True)  # outlives it
            time.sleep(0.5)
            assert child.poll() is None, "the sleep did not start"
            open("/tmp/{MARK}", "w").write("mine")
            open(os.path.expanduser("~/{MARK}"), "w").write("mine")
            assert open("/tmp/{MARK}").read() == "mine"
            """,
        "mallory_kills_the_box": "import os, signal\nos.killpg(0, signal.SIGKILL)",
    }


@pytest.fixture(scope="module")
def boxed(tmp_path_factory):
    root = tmp_path_factory.mktemp("sandbox")
    repo = repo_copy(root / "repo")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    connected = []

    def serve():
        while server.fileno() != -1:
            try:
                connected.append(server.accept())
            except OSError:
                continue

    threading.Thread(target=serve, daemon=True).start()
    secret = root / "instructor-only.txt"
    secret.write_text("the exam answers")
    right_zoh = next(c.source for c in __import__("nbformat").read(
        repo / "solutions" / "01_discretization.ipynb", as_version=4).cells
        if c.metadata.get("nbgrader", {}).get("grade_id") == "zoh")
    edited(repo / "solutions" / "01_discretization.ipynb",
           root / "class" / "bob" / "01_discretization.ipynb")
    for student, attack in attacks(root, repo, server.getsockname()[1], secret).items():
        edited(repo / "solutions" / "01_discretization.ipynb",
               root / "class" / student / "01_discretization.ipynb",
               replace={"zoh": textwrap.dedent(attack) + "\n" + right_zoh})  # attack first: if it
    # is stopped, the cell stops before zoh is defined and the zoh task fails with its error
    watched = [root / "class" / "bob" / "01_discretization.ipynb",
               repo / "mambalearn/check/ch01_discretization.py",
               repo / "course/classroom/pristine/01_discretization.ipynb",
               repo / "exercises/ex01_discretization.ipynb", repo / "mambalearn/discretize.py"]
    before = {p: p.read_bytes() for p in watched}
    rows, spans, log = grade_class_in(repo, root / "class", ["01_discretization"], jobs=2,
                                      timeout=60, nproc=128,
                                      fsize=32 * 2**20)
    server.close()
    return dict(rows=rows, spans=spans, before=before, connected=connected, root=root, log=log)


def _row(boxed, student):
    return {task: (ok, why) for task, (ok, why) in boxed["rows"][student].items()}


@pytest.mark.slow
def test_no_submission_changed_another_or_the_checks(boxed):
    for path, content in boxed["before"].items():
        assert path.read_bytes() == content, f"{path} was changed by a submission"
    assert _row(boxed, "bob")["zoh"] == (True, "")  # bob still graded on his own work


@pytest.mark.slow
@pytest.mark.parametrize("student, error", [
    ("alice_writes_bob", "FileNotFoundError"), ("carol_reads_bob", "FileNotFoundError"),
    ("dave_writes_checks", "Read-only file system|Permission denied"),
    ("erin_writes_gradebook", "FileNotFoundError"),
    ("frank_opens_sockets", "Connection refused"), ("grace_forks_a_lot", "Resource temporarily"),
    ("heidi_writes_a_huge_file", "File too large"), ("ivan_reads_the_host", "FileNotFoundError"),
])
def test_each_attack_fails_alone(boxed, student, error):
    row = _row(boxed, student)
    ok, why = row["zoh"]
    assert not ok and re.search(error, why), why
    assert row["bilinear"][0] and row["ssm_kernel"][0], row  # the rest of the notebook ran on


@pytest.mark.slow
def test_no_connection_reached_the_host(boxed):
    assert boxed["connected"] == []


@pytest.mark.slow
def test_private_tmp_and_home(boxed):
    assert all(ok for ok, _ in _row(boxed, "judy_uses_tmp_and_home").values())
    assert not Path(f"/tmp/{MARK}").exists(), "the box's /tmp is the host's"


@pytest.mark.slow
def test_runaway_processes_died_with_the_box(boxed):
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"sleep {SLEEP}" not in ps


@pytest.mark.slow
def test_killing_the_box_fails_only_itself(boxed):
    row = _row(boxed, "mallory_kills_the_box")
    assert "kernel died" in row["zoh"][1] and not any(ok for ok, _ in row.values())
    assert all(ok for ok, _ in _row(boxed, "bob").values())


@pytest.mark.slow
def test_the_class_was_graded_two_at_a_time(boxed):
    spans = sorted(boxed["spans"])
    overlaps = sum(1 for (s1, e1), (s2, e2) in zip(spans, spans[1:], strict=False) if s2 < e1)
    assert overlaps >= len(spans) // 3, spans


@pytest.mark.slow
def test_killing_the_grader_takes_the_box_with_it(tmp_path):
    """The grader dies (SIGKILL, a closed terminal): its runner, the kernel and everything the
    submission started go with it — nothing keeps running as an orphan."""
    import shutil
    import signal
    import sys
    import tempfile
    import time

    mark = "sleep 120.7654321"
    cell = f"import subprocess\nsubprocess.run({mark.split()!r})\n"
    nb = edited("solutions/01_discretization.ipynb", tmp_path / "01_discretization.ipynb",
                replace={"bilinear": cell})
    work = Path(tempfile.mkdtemp(prefix="mlg-", dir="/tmp"))  # a SIGKILLed grader cannot clean up
    grader = subprocess.Popen([sys.executable, "-m", "mambalearn", "grade", str(nb)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=dict(os.environ, TMPDIR=str(work)))
    running = lambda: mark in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                             text=True).stdout
    deadline = time.monotonic() + 120
    while not running() and time.monotonic() < deadline and grader.poll() is None:
        time.sleep(0.5)
    assert running(), "the submission never got to its sleep"
    grader.send_signal(signal.SIGKILL)
    grader.wait()
    deadline = time.monotonic() + 15
    while running() and time.monotonic() < deadline:
        time.sleep(0.5)
    gone = not running()
    shutil.rmtree(work, ignore_errors=True)
    assert gone, "the box outlived the grader"
