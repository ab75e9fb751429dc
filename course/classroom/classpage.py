"""What a class's grading leaves besides the CSV: a feedback file per student and the class page.

``write_feedback`` writes ``feedback/<student>.md``: per exercise, each task's result, the whole
reason of a failure and its first hint. ``write_page`` writes one self-contained HTML page: the
summary table (pass, FAIL, "stub" for not attempted, "—" for not submitted), the pass rate of every
task, who has not submitted which exercise, and a link to each student's feedback.
"""

import html
import os
from pathlib import Path

MARK = {"pass": "pass", "fail": "FAIL", "not attempted": "stub", "not submitted": "—"}
LEGEND = "pass · FAIL · stub = not attempted (the shipped stubs) · — = not submitted"


def _exercises(row):
    """{exercise: [task dicts]} of one student's row, in the assignment's order."""
    out = {}
    for t in row["tasks"]:
        out.setdefault(t["exercise"], []).append(t)
    return out


def feedback(row):
    """One student's feedback, as Markdown."""
    lines = [f"# Feedback for {row['student']}: {row['total']} of {row['max']} points", ""]
    for exercise, tasks in _exercises(row).items():
        got = sum(t["points"] for t in tasks if t["passed"])
        lines += [f"## {exercise}: {got} of {sum(t['points'] for t in tasks)}", ""]
        for t in tasks:
            if t["passed"]:
                lines.append(f"- **{t['task']}**: pass")
                continue
            lines.append(f"- **{t['task']}**: {t['status'] if t['status'] != 'fail' else 'FAIL'}")
            if t["reason"] and t["reason"] not in ("not submitted",):
                lines += ["", "  ```", *[f"  {x}" for x in t["reason"].splitlines()], "  ```"]
            if t.get("hint") and "hint" not in t["reason"]:
                lines.append(f"  Hint: {t['hint']}")
            lines.append("")
        lines.append("")
    if row["notes"]:
        lines += ["## Notes", "", *[f"- {n}" for n in row["notes"]], ""]
    lines += ["Grade your own copy again with `make grade NB=…` (docs/GRADING.md); a failure's "
              "`replay this case` line reruns its inputs in your notebook.", ""]
    return "\n".join(lines)


def _file_name(student):
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in student) + ".md"


def write_feedback(rows, folder):
    """``folder/<student>.md`` for every row; returns {student: path}."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for row in rows:
        paths[row["student"]] = folder / _file_name(row["student"])
        paths[row["student"]].write_text(feedback(row))
    return paths


STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 70em; padding: 0 1em; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #bbb; padding: .25em .6em; text-align: center; }
th:first-child, td:first-child { text-align: left; }
.pass { background: #d9f2d9; } .fail { background: #f7d4d4; font-weight: 600; }
.stub { background: #eee; color: #555; } .none { color: #888; }
@media (prefers-color-scheme: dark) {
  body { background: #181a1b; color: #ddd; } th, td { border-color: #555; }
  .pass { background: #1f3d1f; } .fail { background: #4a1f1f; } .stub { background: #2a2a2a; }
}
"""
_CLASS = {"pass": "pass", "fail": "fail", "not attempted": "stub", "not submitted": "none"}


def page(rows, columns, chosen, feedback_dir, here):
    """The class page's HTML; links to the feedback files are relative to folder ``here``."""
    e = html.escape
    out = ["<!doctype html>", "<html lang=en><head><meta charset=utf-8>",
           '<meta name=viewport content="width=device-width, initial-scale=1">',
           "<title>Class results</title>", f"<style>{STYLE}</style></head><body>",
           "<h1>Class results</h1>",
           f"<p>{len(rows)} students · assignment: {e(', '.join(chosen))} · {e(LEGEND)}</p>",
           "<table><tr><th>student</th>" + "".join(f"<th>{e(c)}</th>" for c in columns)
           + "<th>score</th><th>feedback</th></tr>"]
    for r in rows:
        link = os.path.relpath(Path(feedback_dir) / _file_name(r["student"]), here)
        cells = "".join(f'<td class={_CLASS[t["status"]]} title="{e(t["reason"][:300])}">'
                        f'{e(MARK[t["status"]])}</td>' for t in r["tasks"])
        out.append(f"<tr><td>{e(r['student'])}</td>{cells}<td>{r['total']} / {r['max']}</td>"
                   f"<td><a href=\"{e(link)}\">{e(r['student'])}.md</a></td></tr>")
    rates = []
    for i in range(len(columns)):
        passed = sum(r["tasks"][i]["passed"] for r in rows)
        rates.append(f"<td>{passed} of {len(rows)}"
                     f"{f' ({100 * passed / len(rows):.0f} %)' if rows else ''}</td>")
    out.append("<tr><th>passed</th>" + "".join(rates) + "<td></td><td></td></tr></table>")
    out.append("<h2>Not submitted</h2><ul>")
    for exercise in chosen:
        missing = [r["student"] for r in rows
                   if all(t["status"] == "not submitted" for t in r["tasks"]
                          if t["exercise"] == exercise)]
        out.append(f"<li>{e(exercise)}: "
                   f"{e(', '.join(missing)) if missing else 'everyone handed it in'}</li>")
    out.append("</ul></body></html>")
    return "\n".join(out) + "\n"


def write_page(rows, columns, chosen, path, feedback_dir):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(rows, columns, chosen, feedback_dir, path.parent))
    return path
