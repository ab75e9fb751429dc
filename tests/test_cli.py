"""`python -m mambalearn`: help for every command, one-line errors with "did you mean" and exit
status 2 for bad arguments, one program name, and bench's rows and tables."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from course import bench
from course.__main__ import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent
TOPICS = sorted(p.stem for p in (ROOT / "course" / "bench").glob("*.py")
                if not p.stem.startswith("_"))


def _run(args, capsys):
    """(exit status, stdout, stderr) of ``python -m mambalearn ARGS``, in this process."""
    try:
        code = main(args)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_bench_help_from_the_command_line():
    done = subprocess.run([sys.executable, "-m", "mambalearn", "bench", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    topics = done.stdout.split("topics:")[1].split()
    assert "--json FILE" in done.stdout and set(TOPICS) <= set(topics)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_bench_help_lists_every_topic_and_option(flag, capsys):
    code, out, _ = _run(["bench", flag], capsys)
    assert code == 0
    assert "--json FILE" in out
    topics = out.split("topics:")[1].split()
    assert sorted(set(topics) & set(TOPICS)) == TOPICS == sorted(bench.TOPICS)


@pytest.mark.parametrize("args, message", [
    (["bench", "memroy"], "unknown topic 'memroy' (did you mean 'memory'?) (topics: mamba3,"),
    (["bench", "scans", "--json"], "argument --json: expected one argument"),
    (["bench", "--jsn", "x"], "unrecognized option --jsn (did you mean '--json'?)"),
    (["bench", "--json=x", "--replot", "a", "b"], "give no TOPIC and no --json"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["bnech"], "(did you mean 'bench'?)"),
    (["doctor", "--verbose"], "unrecognized option --verbose"),
    (["slides", "--pfd"], "unrecognized option --pfd (did you mean '--pdf'?)"),
    (["site", "--oflline"], "unrecognized option --oflline (did you mean '--online'?)"),
    (["exercises", "--froce"], "unrecognized option --froce (did you mean '--force'?)"),
])
def test_bad_arguments_get_one_line_and_exit_2(args, message, capsys):
    code, out, err = _run(args, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[0].startswith("usage: python -m mambalearn") and message in lines[-1]
    assert not out


def test_bench_defaults_to_every_topic():
    args = bench.parser().parse_args([])
    assert args.topics == [] and args.json is None  # main() then runs every topic
    args = bench.parser().parse_args(["scans", "ssd", "--json", "r.json"])
    assert args.topics == ["scans", "ssd"] and args.json == "r.json"


def test_top_level_help_lists_every_job_under_one_program_name(capsys):
    code, out, _ = _run(["--help"], capsys)
    assert code == 0
    assert {"doctor", "grade", "bench", "slides", "site", "exercises"} <= set(COMMANDS)
    for command in COMMANDS:
        assert f"\n  {command} " in out
        code, text, _ = _run([command, "--help"], capsys)
        assert code == 0 and text.startswith(f"usage: python -m mambalearn {command} "), text[:80]
        assert max(map(len, text.splitlines())) <= 100, command
        assert "DESIGN" not in text and "http" not in text, command  # nothing outside the repo


def test_grade_options_come_from_the_grader(capsys):
    code, out, _ = _run(["grade", "--help"], capsys)
    assert code == 0
    assert "--class DIR" in out and "--exercises LIST" in out
    assert "generate" not in out.split("positional")[0].lower(), "grade's help is about grading"


def test_the_program_alone_shows_the_help_and_its_version(capsys):
    from course.__main__ import version

    code, out, err = _run([], capsys)
    assert code == 0 and not err
    assert out.startswith("usage: python -m mambalearn")
    assert "\n  submit " in out and "\n  lab " in out
    code, out, _ = _run(["--version"], capsys)
    assert code == 0 and out.strip() == f"mambalearn {version()}" and version()[0].isdigit()


def test_lab_and_submit_are_commands(capsys, tmp_path):
    code, out, _ = _run(["lab", "--dry-run", "--root", str(tmp_path), "--", "--port", "8899"],
                        capsys)
    assert code == 0
    assert "JUPYTER_CONFIG_PATH=" in out and "course/classroom/jupyter" in out
    assert " lab --ip=127.0.0.1 " in out and f"--ServerApp.root_dir={tmp_path}" in out
    assert out.rstrip().endswith("--port 8899")
    code, _, err = _run(["submit", str(tmp_path / "ex01_discretization.ipynbx")], capsys)
    assert code == 2 and "no such notebook" in err


def test_table_keeps_the_columns_rows_carry_within_100_columns():
    rows = [dict(topic="selective", backend="blelloch", shape="b1_l64", ms=0.5, passes=19.9,
                 peak_gb=None, command="bash a very long command line, not a column"),
            dict(topic="selective", backend="loop", shape="b1_l64", ms=1.25, rel_err=3e-7),
            dict(topic="scans", backend="loop", shape="l16", ms=1.25)]
    blocks = [b.splitlines() for b in bench.table(rows).split("\n\n")]
    assert [b[0] for b in blocks] == ["selective · b1_l64", "scans · l16"]
    header = blocks[0][1].split()
    assert header == ["backend", "ms", "passes", "rel_err"]  # columns with a value, in order
    assert blocks[0][2].split() == ["blelloch", "0.500", "19.900", "-"]
    assert blocks[0][3].split() == ["loop", "1.250", "-", "3e-07"]  # small is not 0.000
    wide = [dict(topic="t", backend="b" * 40, shape="s", ms=1.0, **{f"extra{i}": 1.5 for i in
                                                                  range(20)})]
    lines = bench.table(wide).splitlines()
    assert max(map(len, lines)) <= 100 and lines[1].split()[:3] == ["backend", "ms", "extra0"]


def test_numbers_are_never_rounded_to_nothing(capsys):
    assert [bench.number(v) for v in (0.5, 0.0004, 0.0, 123.456, 5e4, None, "w")] == [
        "0.500", "0.0004", "0.000", "123.456", "50000", "-", "w"]
    bench.show(dict(topic="ssd", backend="ours", ms=0.00123, ratio=None, error="x"))
    assert capsys.readouterr().out == "topic=ssd | backend=ours | ms=0.00123 | error=x\n"


def test_the_chart_is_a_grid_of_readable_panels(tmp_path):
    from PIL import Image

    rows = [dict(topic="ssd", backend=f"backend {k}", shape=f"shape {s}", ms=0.1 + k + s)
            for s in range(5) for k in range(9)]
    path = bench.plot(rows, tmp_path / "chart.png")
    w, h = Image.open(path).size
    assert w > h and h < 1200, (w, h)  # 5 panels: 3 columns, 2 rows, not a strip
    data = tmp_path / "rows.json"
    data.write_text(__import__("json").dumps({"rows": rows}))
    assert bench.cli(["--replot", str(data), str(tmp_path / "again.png")]) == 0
    assert Image.open(tmp_path / "again.png").size == (w, h)


def test_make_help_lists_every_documented_target():
    done = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    documented = re.findall(r"^([a-z][a-z-]*):.*## ", (ROOT / "Makefile").read_text(), re.M)
    listed = [line.split()[0] for line in done.stdout.splitlines()[1:]]
    assert listed == documented
    assert {"lab", "test", "slides", "site", "grade", "help"} <= set(listed)


def _exercise_folders(tmp_path, solutions):
    """exercises/ and the grader's copies, as built, for ``solutions``, under ``tmp_path``."""
    import shutil

    from course.classroom import pristine

    out, last = tmp_path / "exercises", tmp_path / "pristine"
    out.mkdir(), last.mkdir()
    for s in solutions:
        shutil.copy(ROOT / "exercises" / pristine.exercise_file(s.stem),
                    out / pristine.exercise_file(s.stem))
        shutil.copy(pristine.shipped()[s.stem], last / s.name)
    return out, last


def _write_in_stub(path, source):
    """``path`` with its first stub cell replaced by ``source``; returns that cell's number."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    k = next(i for i, c in enumerate(nb.cells) if "NotImplementedError" in c.source
             and c.cell_type == "code")
    nb.cells[k].source = source
    nbformat.write(nb, path)
    return k + 1


def test_exercises_never_replace_a_students_work(tmp_path, capsys):
    """`make exercises`: an exercise as generated (or only run) is replaced, an edited one is kept
    and named, unless --force; --dry-run writes nothing."""
    import nbformat

    from course.classroom import exercises

    solutions = [ROOT / "solutions" / n for n in ("01_discretization.ipynb", "03_operator.ipynb")]
    out, last = _exercise_folders(tmp_path, solutions)
    mine, other = out / "ex01_discretization.ipynb", out / "ex03_operator.ipynb"
    k = _write_in_stub(mine, "def zoh(A, B, delta):\n    return 'my work'\n")
    ran = nbformat.read(other, as_version=4)
    ran.cells[0].metadata["collapsed"] = True  # opened and run, nothing written
    nbformat.write(ran, other)

    dry = exercises.regenerate(solutions, out, last, dry_run=True)
    assert [(t.name, a) for t, a, _ in dry] == [(mine.name, "kept"), (other.name, "written")]
    assert f"cell {k} differs" in dry[0][2]
    assert nbformat.read(other, as_version=4) == ran, "--dry-run wrote"
    done = exercises.regenerate(solutions, out, last)
    assert [a for _, a, _ in done] == ["kept", "written"]
    assert "my work" in mine.read_text()
    assert nbformat.read(other, as_version=4) == nbformat.read(
        ROOT / "exercises" / other.name, as_version=4)
    again = exercises.regenerate(solutions, out, last)
    assert [a for _, a, _ in again] == ["kept", "unchanged"]
    forced = exercises.regenerate(solutions, out, last, force=True)
    assert [a for _, a, _ in forced] == ["replaced", "unchanged"]
    assert "my work" not in mine.read_text()


def test_exercises_leave_a_notebook_under_its_old_name(tmp_path, monkeypatch, capsys):
    """An exercise still named like its chapter (exercises/01_discretization.ipynb, the name before
    exNN_) is never replaced nor deleted, --force or not: the new file is written beside it, and
    what to do is said (copy the work across, or delete a copy with none); exit status 1."""
    import shutil

    from course.classroom import exercises

    solutions = [ROOT / "solutions" / n for n in ("01_discretization.ipynb", "03_operator.ipynb")]
    out, last = _exercise_folders(tmp_path, solutions)
    worked, unused = out / "01_discretization.ipynb", out / "03_operator.ipynb"
    (out / "ex01_discretization.ipynb").rename(worked)  # an old copy, with work in it
    k = _write_in_stub(worked, "def zoh(A, B, delta):\n    return 'my work'\n")
    shutil.copy(out / "ex03_operator.ipynb", unused)  # an old copy as it was generated
    before = {p: p.read_bytes() for p in (worked, unused)}

    done = exercises.regenerate(solutions, out, last, force=True)
    assert [(t.name, a) for t, a, _ in done] == [
        ("ex01_discretization.ipynb", "written"), ("01_discretization.ipynb", "left"),
        ("ex03_operator.ipynb", "unchanged"), ("03_operator.ipynb", "left")]
    assert f"cell {k} differs" in done[1][2]
    assert "copy your work into ex01_discretization.ipynb" in done[1][2]
    assert "nothing written in it: delete it" in done[3][2]
    assert {p: p.read_bytes() for p in (worked, unused)} == before, "an old-name file changed"
    assert "my work" not in (out / "ex01_discretization.ipynb").read_text()

    monkeypatch.setattr(exercises, "REPO", tmp_path)  # the command, on these folders
    monkeypatch.setattr(exercises.pristine, "PRISTINE", last)
    # keeping a student's work is not a failure: `make slides site exercises` goes on
    assert exercises.main(["--out", str(out), *map(str, solutions)]) == 0
    said = capsys.readouterr()
    assert "exercises/01_discretization.ipynb: left (the old name of ex01_discretization" \
        in said.out
    assert "nothing was replaced or deleted" in said.err
    assert {p: p.read_bytes() for p in (worked, unused)} == before


def test_grading_says_why_it_installs_bubblewrap_and_doctor_checks_the_tools(tmp_path, capsys,
                                                                            monkeypatch):
    """`make grade` runs tools/browser-deps.sh bwrap: where bwrap is missing it first says what
    the box is for; `doctor` lists bwrap, Chromium and npm (warnings, never failures)."""
    import os
    import shutil

    from course import doctor

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("id", "bash"):  # no bwrap, no apt-get: nothing is installed here
        os.symlink(shutil.which(tool), bin_ / tool)
    done = subprocess.run(["bash", str(ROOT / "tools" / "browser-deps.sh"), "bwrap"],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_), "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "bubblewrap box" in done.stdout and "no network" in done.stdout
    assert "missing: bubblewrap" in done.stderr
    monkeypatch.setenv("PATH", str(bin_))
    monkeypatch.setenv("MAMBALEARN_CHROMIUM", str(tmp_path / "no-chromium"))
    found = doctor.tools()
    out = capsys.readouterr().out
    assert found == {"bubblewrap (bwrap)": None, "Chromium": None, "npm": None}
    for name in ("bubblewrap (bwrap) not found", "Chromium not found", "npm not found"):
        assert f"[warn] {name}" in out, out
