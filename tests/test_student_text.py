"""What students read tells the course, not how it was made.

Notebooks, exercises, solutions and the library cite a measurement by its device, date, command
and results file (``mambalearn.results``); they never narrate who ran it in which numbered call
or session, which issue asked for it, or a planning document that is not in the repository.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

HELPERS = r"ssd2?|m1|mamba3|ssdm3|ch1415|grader|tools|text|[AB]\d"
PROJECT_TALK = re.compile("|".join([
    r"\bthe lead\b", r"\blead's\b",
    rf"\bhelpers?\s+(?:[\"“][\w-]+[\"”]|(?:{HELPERS})\b)",
    r"\b(?:first|second|third|fourth|fifth|\d+(?:st|nd|rd|th))\s+session\b",
    r"\bcalls?\s+\d", r"'s\s+call\b",
    r"\bissues?\s+#?\d+", r"#\d{1,3}\b(?![\w;-])",  # (a CSS colour "#555;" is not an issue)
    r"\bDESIGN(?:\.md|\s*§)",
]), re.I)


def student_text():
    """(where, line) of every line a student reads: notebook, exercise and solution cells and
    the library's modules."""
    for d in ("notebooks", "solutions", "exercises"):
        for nb in sorted((ROOT / d).glob("*.ipynb")):
            for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
                for n, line in enumerate("".join(cell["source"]).splitlines(), 1):
                    yield f"{d}/{nb.name} cell {i} line {n}", line
    for py in sorted((ROOT / "mambalearn").rglob("*.py")):
        for n, line in enumerate(py.read_text().splitlines(), 1):
            yield f"{py.relative_to(ROOT)}:{n}", line


def test_no_project_talk_in_what_students_read():
    talk = [f"{where}: {line.strip()[:120]}" for where, line in student_text()
            if PROJECT_TALK.search(line)]
    assert not talk, "cite a device, date, command and results file instead:\n" + "\n".join(talk)


@pytest.mark.parametrize("line", [
    "docs/BENCHMARKS.md, 2026-11-30, call 3: `python -m mambalearn bench memory`",
    "(the lead's H200 runs of 2026-11-30)", "helper ssd2's call", 'helper "ssd" measured it',
    "second session, call 4", "To be fitted to measurements (issue 17).", "see #25",
    "Shapes (DESIGN.md §6)", "the calls 1–3 of that day"])
def test_the_check_sees_project_talk(line):
    assert PROJECT_TALK.search(line)


@pytest.mark.parametrize("line", [
    "Demo sizes come from one helper, :func:`size`", "self.client.session.msg('interrupt')",
    "`--new-session`", "the kernel's issue slots", "color #1f77b4", "cell 3 of exercise 05",
    "vllm-project/vllm#22928", "a call of selective_scan_fn"])
def test_the_check_leaves_course_text_alone(line):
    assert not PROJECT_TALK.search(line)
