"""`python -m mambalearn`: help for every command, one-line errors and exit status 2 for bad
arguments, and the bench table that keeps every column the rows carry."""

import subprocess
import sys
from pathlib import Path

import pytest

from mambalearn import bench
from mambalearn.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
TOPICS = sorted(p.stem for p in (ROOT / "mambalearn" / "bench").glob("*.py")
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
    (["bench", "memroy"], "unknown topic 'memroy' (topics: mamba3, memory, model,"),
    (["bench", "scans", "--json"], "argument --json: expected one argument"),
    (["bench", "--jsn"], "unrecognized arguments: --jsn"),
    ([], "the following arguments are required: COMMAND"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["doctor", "--verbose"], "unrecognized arguments: --verbose"),
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


def test_top_level_help_lists_the_commands(capsys):
    code, out, _ = _run(["--help"], capsys)
    assert code == 0
    for command in ("doctor", "grade", "bench"):
        assert f"\n    {command} " in out


def test_grade_options_come_from_the_grader(capsys):
    code, out, _ = _run(["grade", "--help"], capsys)
    assert code == 0
    assert "--class DIR" in out and "--exercises LIST" in out


def test_table_keeps_the_columns_rows_carry():
    rows = [dict(topic="selective", backend="blelloch", shape="b1_l64", ms=0.5, passes=19.9,
                 peak_gb=None, command="bash a very long command line, not a column"),
            dict(topic="scans", backend="loop", shape="l16", ms=1.25)]
    lines = bench.table(rows).splitlines()
    header = lines[0].split()
    assert header == bench.COLUMNS + ["passes"]
    cells = lines[1].split()
    assert cells[header.index("passes")] == "19.900" and cells[header.index("ms")] == "0.500"
    assert lines[2].split()[header.index("passes")] == "-"
