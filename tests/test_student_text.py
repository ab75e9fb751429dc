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
    for py in sorted(p for d in ("mambalearn", "course") for p in (ROOT / d).rglob("*.py")):
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


# --- what students are sent to read --------------------------------------------------------------
JOURNAL = re.compile("|".join([
    r"\bthe lead\b", r"\blead's\b", r"\bhelpers?\s+(?!functions?\b)[\w\"“]", r"\bsessions?\b",
    r"\bsitting\b", r"\bcalls?\s+\d", r"'s\s+call\b", r"\bDESIGN(?:\.md|\s*§)",
    r"\bissues?\s+#?\d+(?![\d.]*\s*(?:%|M\b|×|ms\b))",  # not "issue 39 %": issue slots
]), re.I)
# A method page (docs/) speaks of a kernel's session or a helper function; a run log does not.
NAMED = re.compile("|".join([PROJECT_TALK.pattern.replace(r"|\bDESIGN(?:\.md|\s*§)", ""),
                             r"\b(?:first|second|third|fourth|fifth) sessions?\b"]), re.I)
LINK = re.compile(r"(?<![\w/.-])((?:docs|bench)/[\w./-]+\.md)\b")
COURSE = ("notebooks", "solutions", "exercises", "mambalearn/check")


def linked_pages():
    """{page: [where]}: every Markdown page of the repository that a chapter, exercise, solution,
    check or library module names (``docs/BENCHMARKS.md``, ``bench/NOTES_ssd.md``, …)."""
    pages = {}
    for where, line in student_text():
        for m in LINK.finditer(line):
            pages.setdefault(m[1], []).append(where)
    return pages


def test_students_are_sent_to_no_team_journal():
    """A chapter cites a run by device, date, command and results file; the pages it sends students
    to (the tables of docs/BENCHMARKS.md, a method page) read as a lab record, never as who ran
    what in which session or call. ``bench/NOTES_*.md`` are the maintainers' lab records by date
    and commit: no chapter, exercise or check links them, and where a library module cites one for
    the measurements behind a default, it too reads as a lab record."""
    pages = linked_pages()
    notes = {p: [w for w in where if w.startswith(COURSE)] for p, where in pages.items()
             if p.startswith("bench/NOTES_")}
    notes = {p: w for p, w in notes.items() if w}
    assert not notes, f"chapters link a run log; link docs/ instead: {notes}"
    talk = [f"{p}:{n}: {line.strip()[:120]}" for p in pages if (ROOT / p).exists()
            for n, line in enumerate((ROOT / p).read_text().splitlines(), 1)
            if (JOURNAL if p.startswith("bench/") else NAMED).search(line)]
    assert not talk, "a page students are sent to narrates the project:\n" + "\n".join(talk)
    missing = [p for p in pages if not (ROOT / p).exists()]
    assert not missing, f"links to pages that do not exist: {missing}"


@pytest.mark.parametrize("line", ["No device time in this session", "in the same sitting",
                                  "Helper mamba3b, 2026-12-02", "the lead's second call",
                                  "the re-layout (issue 13)", "calls 1–3"])
def test_the_journal_check_sees_a_journal(line):
    assert JOURNAL.search(line)


@pytest.mark.parametrize("line", ["a helper function", "`all.sh session4`",
                                  "one call of the kernel", "issue 39 %, long scoreboard first",
                                  "issue 38 M warp-instructions"])
def test_the_journal_check_leaves_a_lab_record_alone(line):
    assert not JOURNAL.search(line)


# --- no measured figure typed into a chapter's prose ---------------------------------------------
# A number with the unit of a measurement (a time, a rate, a ratio, a share) in a Markdown cell. A
# size (GB, MB, KB) is not listed: the course computes sizes from shapes or quotes a datasheet.
MEASURED = re.compile(
    r"(?<![\w.$^{])(?:[~≈]\s*|about\s+)?\d+(?:[.,]\d+)?(?:\s*[–-]\s*\d+(?:\.\d+)?)?\s*"
    r"(?:ms\b|µs\b|us\b|ns\b|GB/s|TB/s|TFLOP/s|GFLOP/s|tokens/s|×(?!\s*\d|\s*\$|\s*[a-z]\b)"
    r"|%|x\b(?=\s+(?:faster|slower|speed))|times\s+(?:faster|slower))")
# (notebook, text): why a measurement-like number there is not a measurement of this course.
NOT_MEASURED = {
    ("05_memory_hierarchy", "4.8 TB/s"): "NVIDIA's datasheet figure, set against the measured one",
    ("05_memory_hierarchy", "989\nTFLOP/s"): "NVIDIA's datasheet figure",
    ("05_memory_hierarchy", "~67 TFLOP/s"): "NVIDIA's datasheet fp32 figure (roofline.H200.flops)",
    ("10_ssd", "~67 TFLOP/s"): "NVIDIA's datasheet fp32 figure (roofline.H200.flops)",
    ("05_memory_hierarchy", "~50×"): "a ratio of counts computed in the cell above",
    ("05_memory_hierarchy", "about 20×"): "a ratio of byte floors, computed from shapes",
    ("05_memory_hierarchy", "50–57×"): "a ratio of byte floors, computed from shapes",
    ("08_triton_scan", "100 %"): "a definition: 100 % = the scheduler issued every cycle",
    ("10_ssd", "~6×"): "a ratio of FLOP counts, computed from shapes",
    ("15_mamba3", "≈ 3.6×"): "a ratio of FLOP counts, (1 + 24)/(1 + 6)",
}
# Chapter 16 audits the articles' claims: the figures it quotes are what the articles state, each
# next to the audit that measures it.
CLAIMS = ("16_claims",)


def measured_in_markdown():
    """(notebook stem, cell, match) for every measurement-like number in Markdown cells of the
    chapters and solutions (exercises are generated from the solutions)."""
    for d in ("notebooks", "solutions"):
        for nb in sorted((ROOT / d).glob("*.ipynb")):
            if nb.stem in CLAIMS:
                continue
            for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
                if cell["cell_type"] == "markdown":
                    for m in MEASURED.finditer("".join(cell["source"])):
                        yield nb.stem, f"{d}/{nb.name} cell {i}", m[0].strip()


def test_no_measured_number_is_typed_into_a_chapter():
    """A time, rate, ratio or share that a chapter reports is printed by a code cell from the
    results store (``mambalearn.results``: the value with its shape, device, date and file), or
    the sentence goes. Markdown says "printed below"; the few figures that are not measurements
    (a datasheet, a computed count) are listed in NOT_MEASURED with the reason."""
    found = list(measured_in_markdown())
    allowed = {(stem, text.replace("\n", " ")) for stem, text in NOT_MEASURED}
    bad = [f"{where}: {text!r}" for stem, where, text in found
           if (stem, text.replace("\n", " ")) not in allowed]
    assert not bad, "measured numbers typed into Markdown (print them from the store):\n" + \
        "\n".join(bad)
    seen = {(stem, text.replace("\n", " ")) for stem, _, text in found}
    assert allowed <= seen, f"NOT_MEASURED entries no longer in the text: {allowed - seen}"


@pytest.mark.parametrize("text", ["ours ran 0.47 ms", "about 0.13 ms", "4.25 TB/s", "1.25×",
                                  "busy 36 % of the time", "a 6× gap", "12 µs", "2.5 times faster"])
def test_the_measurement_check_sees_a_figure(text):
    assert MEASURED.search(text)


@pytest.mark.parametrize("text", ["random 2×2 matrices", "64 × 32 tile", "$O(\\log l)$",
                                  "b8 d2048 n16 l2048", "chunk 256", "a 3 × n tile", "fp32"])
def test_the_measurement_check_leaves_sizes_alone(text):
    assert not MEASURED.search(text)


# --- no chapter speaks of the project's own acceptance targets ------------------------------------
TARGET = re.compile(r"course's target|\bthe target(?:s)?\s+(?:holds?|on an|is met|met|of)\b|"
                    r"\(target\s*[≤<]|#\s*the target", re.I)


def test_no_chapter_speaks_of_acceptance_targets():
    """A chapter measures and compares; whether the project met a goal it set itself is not a
    lesson. (A training target or a compile target is another word.)"""
    bad = [f"{where}: {line.strip()[:120]}" for where, line in student_text()
           if where.startswith(("notebooks", "solutions", "exercises")) and TARGET.search(line)]
    assert not bad, "\n".join(bad)
