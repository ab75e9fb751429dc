"""The course's command-line parsers: one program name, and "did you mean" on a typo.

Every job (``python -m mambalearn COMMAND``) builds its options with ``parser(command, ...)``, an
``argparse.ArgumentParser`` named ``python -m mambalearn COMMAND`` that, before it parses,
refuses an option it does not know with the nearest one it does (``--jsn`` → ``--json``), and
answers a misspelt choice (a command, a topic) with the nearest valid one.
"""

import argparse
import difflib
import re
import shutil
import sys

PROG = "python -m mambalearn"
WIDTH = 100  # columns of help text and tables at most


def suggest(word, choices):
    """`` (did you mean 'x'?)`` for the choice nearest to ``word``, or ``""``."""
    near = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {near[0]!r}?)" if near else ""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that names the nearest option or choice when one is misspelt."""

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        self._refuse_unknown_options(args)
        return super().parse_known_args(args, namespace)

    def _options(self):
        return [s for a in self._actions for s in a.option_strings]

    def _refuse_unknown_options(self, args):
        """An unknown ``-x``/``--xyz`` is an error before any value is read: else argparse may
        first complain about the value that follows it (``bench --jsn x``: "unknown topic 'x'")."""
        if "-" not in self.prefix_chars:
            return  # a stand-in whose command parses its own options
        known = self._options()
        positionals = [a for a in self._actions if not a.option_strings]
        stop = any(isinstance(a, argparse._SubParsersAction) for a in positionals)
        for token in args:
            if token == "--" or (stop and not token.startswith("-")):
                return  # what follows belongs to a command's own parser
            if not token.startswith("-") or token == "-" or re.fullmatch(r"-\d[\d.e-]*", token):
                continue
            name = token.split("=", 1)[0]
            if name in known or (name.startswith("--") and any(k.startswith(name) for k in known)):
                continue  # argparse accepts an unambiguous prefix too
            self.error(f"unrecognized option {name}{suggest(name, known)}")

    def error(self, message):
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m and "did you mean" not in message:
            choices = [c.strip(" '\"") for c in m.group(2).split(",")]
            message += suggest(m.group(1), choices)
        super().error(message)


def formatter(raw=False):
    """argparse's help formatter at ``WIDTH`` columns (fewer on a narrower terminal); ``raw``
    keeps the line breaks of the description and epilog."""
    base = argparse.RawDescriptionHelpFormatter if raw else argparse.HelpFormatter
    width = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns) - 2
    return lambda prog: base(prog, width=width, max_help_position=26)


def parser(command=None, raw=False, **kwargs):
    """The parser of ``python -m mambalearn [COMMAND]`` (``Parser``, program name set)."""
    return Parser(prog=f"{PROG} {command}" if command else PROG, formatter_class=formatter(raw),
                  **kwargs)


def nearest_notebooks(path, n=1):
    """The existing notebooks whose path is nearest to ``path`` (a mistyped name): the same folder,
    ``exercises/`` and ``notebooks/`` are looked in."""
    from pathlib import Path

    path = Path(path)
    repo = Path(__file__).resolve().parents[2]
    folders = {path.parent, Path("exercises"), Path("notebooks"), repo / "exercises"}
    found = {}
    for folder in folders:
        if folder.is_dir():
            for nb in folder.glob("*.ipynb"):
                shown = nb.relative_to(repo) if nb.is_absolute() and nb.is_relative_to(repo) else nb
                found.setdefault(str(shown), nb)
    near = difflib.get_close_matches(str(path), list(found), n=n, cutoff=0.6)
    if not near:  # the file name alone, in any of the folders
        names = {Path(k).name: k for k in found}
        near = [names[m] for m in difflib.get_close_matches(path.name, list(names), n=n,
                                                            cutoff=0.6)]
    return near


def notebook_problem(path, command="grade"):
    """Why ``path`` cannot be the one exercise notebook ``make COMMAND NB=…`` wants, and what to
    do instead, or None when it can: a missing file ("did you mean …?"), a folder (a class is
    ``CLASS=``), a chapter notebook (its exercise is ``exercises/exNN_name.ipynb``)."""
    from pathlib import Path

    import nbformat

    from course.classroom import pristine

    path = Path(path)
    if path.is_dir():
        tip = (f" (a folder of students, one folder each, is graded with make grade "
               f"CLASS={path} EXERCISES=01,02|all)" if command == "grade" else "")
        return f"{path} is a folder: NB= takes one notebook, e.g. NB=exercises/exNN_name.ipynb{tip}"
    if not path.is_file():
        near = nearest_notebooks(path)
        return (f"no such notebook: {path}"
                + (f" (did you mean {near[0]}?)" if near else
                   " (the exercises are exercises/exNN_name.ipynb)"))
    chapter = pristine._CHAPTER.match(path.stem)
    if chapter and path.suffix == ".ipynb" and not path.stem.lower().startswith("ex"):
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001 - an unreadable file is the grader's to report
            return None
        if nb.metadata.get("mambalearn", {}).get("exercise"):
            return None  # an exercise under another name
        if any(pristine.meta(c).get("solution") for c in nb.cells):
            return None
        exercise = [p for p in pristine.shipped() if p.startswith(chapter.group(1) + "_")]
        if exercise:
            ex = f"exercises/{pristine.exercise_file(exercise[0])}"
            return (f"{path} is chapter {chapter.group(1)}'s notebook, not its exercise: the "
                    f"exercise is {ex} (open it, write your code in the cells that say `raise "
                    f"NotImplementedError()`, then make {command} NB={ex})")
    return None
