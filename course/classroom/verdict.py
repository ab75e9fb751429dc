"""From the per-cell results of a graded notebook to one row per task: passed or not, and why.

A task (one check cell) passes when its check ran and raised nothing, and no solution cell it
depends on is a copy of the library's code. Otherwise its reason says what a student can act on:
the check's message, or that the solution cell itself failed, died, ran too long, or was never
written — naming the cell as the student sees it: JupyterLab numbers cells by execution (``[7]``),
which changes with every run, so a cell is named by what it is (``your `zoh` cell``, the check
``check.zoh(zoh)``, or its first line and the heading above it) and its position among the code
cells of the exercise as shipped, counted from the top from 1 (``code cell 3 from the top``). A
NameError for a helper the student defined in a cell of their own says that such cells are not
graded.

Rows: ``{task, points, passed, status ("pass" | "fail" | "not attempted"), reason, short, hint,
flags}``; ``short`` is the table's one line, ``hint`` the first hint the check gave.
"""

import ast
import re

from course.classroom import copies
from course.classroom import pristine as P


def _cut(text, width):
    if len(text) <= width:
        return text
    at = text.rfind(" ", 0, width - 2)
    return text[: at if at > width // 2 else width - 2] + " …"


def short(reason, width=100):
    """The table's form of a reason: its first line cut at a word near ``width``, and the hint
    (the line that names the likely mistake) when the check gave one."""
    lines = [line.strip() for line in (reason or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    hint = next((line for line in lines[1:] if line.startswith("hint:")), None)
    if hint is None:
        return _cut(lines[0], width)
    return _cut(lines[0], width // 2) + " — " + _cut(hint, width)


def first_hint(reason):
    """The first hint a reason carries ("hint: …" or "hint 1 of 3: …"), without its label."""
    for line in (reason or "").splitlines():
        m = re.match(r"\s*hint( \d+ of \d+)?: (.*)", line)
        if m:
            return m.group(2).strip()
    return ""


def _first(text):
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def first_line(source, width=40):
    """The first line of code of ``source`` (comments and blank lines skipped), cut to ``width``."""
    lines = [line.strip() for line in source.splitlines()]
    code = [x for x in lines if x and not x.startswith("#")]
    line = (code or [x for x in lines if x] or [""])[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def heading_above(nb, cell):
    """The text of the last markdown heading before ``cell`` in ``nb`` (or "")."""
    title = ""
    for c in nb.cells:
        if c is cell:
            return title
        if c.cell_type == "markdown":
            found = re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", c.source, re.M)
            title = found[-1] if found else title
    return title


def position(index):
    """``index`` (nbval's count of code cells from 0) as a student counts them: "code cell 3 from
    the top" (the 3rd code cell of the exercise as shipped; markdown cells not counted)."""
    return f"code cell {index + 1} from the top"


def label(nb, index):
    """How a report names code cell ``index`` of the restored notebook ``nb``, as a student finds
    it in JupyterLab (whose ``[n]`` are execution counts, not positions): "your `zoh` cell (code
    cell 3 from the top)", "the check `check.zoh(zoh)` (code cell 4 from the top)", "code cell 6
    from the top (`x = torch.randn(4)`, under “Zero-order hold”)"."""
    cell = P.code_cells(nb)[index]
    where = position(index)
    if P.meta(cell).get("solution"):
        return f"your `{P.meta(cell)['grade_id']}` cell ({where})"
    if P.meta(cell).get("grade"):
        return f"the check `{cell.source.strip()}` ({where})"
    heading = heading_above(nb, cell)
    return f"{where} (`{first_line(cell.source)}`" + (f", under “{heading}”)" if heading else ")")


def _cell_failure(r, where):
    """Why the student's cell ``where`` did not run through, or None if it did."""
    if r is None or r.get("status") == "ok":
        return None
    if r["status"] == "error":
        return f"{where} failed: {r['ename']}: {_first(r['evalue'])}"
    if r["status"] == "died":
        status = re.search(r"exit status -?\d+", r.get("evalue") or "")
        return f"the kernel died in {where}" + (f", {status.group(0)}" if status else "")
    if r["status"] in ("timeout", "stopped"):
        return f"{where} {r['evalue']}"
    return f"{where} was {r['status']}: {r.get('evalue')}"


def _explain(nb, idx, r, deps, results, unchanged, killed, wall):
    """(status, full reason) of check cell ``idx``, which did not pass."""
    if deps and all(unchanged.get(d) for d in deps):
        names = ", ".join(f"`{d}`" for d in deps)
        still = "are still the shipped stubs" if len(deps) > 1 else "is still the shipped stub"
        return "not attempted", f"not attempted: {names} {still}"
    sols = {P.meta(c).get("grade_id"): i for i, c in enumerate(P.code_cells(nb))
            if P.meta(c).get("solution")}
    for d in deps:
        why = _cell_failure(results.get(sols.get(d)), label(nb, sols[d]) if d in sols else d)
        if why:
            return "fail", why
    if r is None:
        if killed:
            last = max(results) if results else -1
            where = label(nb, last + 1) if last + 1 < len(P.code_cells(nb)) else "?"
            return "fail", (f"not run: grading was stopped at the {wall} s limit for the whole "
                            f"notebook (it was running {where})")
        return "fail", "not run"
    status = r.get("status")
    if status == "died":
        return "fail", (f"the kernel died in {label(nb, idx)} while the check ran your code "
                        f"({r['evalue']})")
    if status in ("timeout", "stopped"):
        return "fail", f"{label(nb, idx)}: the check ran your code, which {r['evalue']}"
    if status == "not run":
        return "fail", f"not run: {r['evalue']}"
    if r.get("ename") == "NotImplementedError":
        return "fail", f"not finished: {r['evalue']}"
    return "fail", r.get("evalue") or status


def own_definitions(submission, shipped):
    """{name: "code cell N from the top (`first line`)"} defined at the top of code cells the
    student added (not solution cells, not shipped cells; N counts the student's file): code there
    is not graded."""
    graded = {P.meta(c)["grade_id"] for c in shipped.cells if P.meta(c).get("solution")}
    solutions = {id(c) for g, c in P.solution_cells(submission).items() if g in graded}
    shipped_sources = {P.normal(c.source) for c in P.code_cells(shipped)}
    found = {}
    for i, c in enumerate(P.code_cells(submission)):
        if id(c) in solutions or P.normal(c.source) in shipped_sources:
            continue
        try:
            tree = ast.parse(re.sub(r"^\s*[%!].*$", "", c.source, flags=re.M))
        except SyntaxError:
            continue
        for node in tree.body:
            names = [node.name] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                     ast.ClassDef)) else \
                [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            for name in names:
                found.setdefault(name, f"{position(i)} of your notebook "
                                       f"(`{first_line(c.source)}`)")
    return found


def _own_cell_note(reason, own, deps):
    """The sentence a NameError needs when the name lives in a cell grading does not run."""
    for name in re.findall(r"name '(\w+)' is not defined", reason or ""):
        if name in own:
            into = f"the `{deps[0]}` cell" if deps else "a solution cell"
            return (f"\n`{name}` is defined in {own[name]}, a cell of your own: grading runs only "
                    f"the solution cells (the ones that said `raise NotImplementedError()`) and "
                    f"the shipped cells, so move `{name}` into {into}")
    return ""


def verdicts(nb, submission, shipped, results, killed=False, wall=None):
    """One row per task of restored notebook ``nb`` (see the module docstring)."""
    results = {r["index"]: r for r in results}
    stubs = {P.meta(c)["grade_id"]: c for c in shipped.cells if P.meta(c).get("solution")}
    mine = P.solution_cells(submission)
    unchanged = {g: g not in mine or P.unchanged(mine[g], stub) for g, stub in stubs.items()}
    own = own_definitions(submission, shipped)
    rows = []
    for idx, gid, points in P.tasks(nb):
        task, r = P.task_name(gid), results.get(idx)
        deps = P.solutions_of(nb, idx)
        copied = [f"`{theirs}` is {lib}" for d in deps if d in mine
                  for theirs, lib in copies.found(mine[d].source)]
        if copied:
            status, reason = "fail", (f"copied from the library: {'; '.join(copied)}, line for "
                                      f"line (comments, layout and docstring aside); write it "
                                      f"yourself")
        elif r is not None and r.get("status") == "ok":
            status, reason = "pass", ""
        else:
            status, reason = _explain(nb, idx, r, deps, results, unchanged, killed, wall)
            reason += _own_cell_note(reason, own, deps)
        rows.append(dict(task=task, points=points, passed=status == "pass", status=status,
                         reason=reason, short=short(reason), hint=first_hint(reason),
                         flags="; ".join(copied)))
    return rows


def failed_all(nb, reason):
    """Every task of ``nb`` failed with ``reason`` (an unreadable submission)."""
    return [dict(task=P.task_name(gid), points=p, passed=False, status="fail", reason=reason,
                 short=short(reason), hint="", flags="") for _, gid, p in P.tasks(nb)]
