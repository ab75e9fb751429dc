"""Command line: ``python -m mambalearn COMMAND`` (``mambalearn/__main__.py`` hands its arguments
here; the ``mambalearn`` script and ``python -m course`` are the same program).

Each command parses its own options (``python -m mambalearn COMMAND --help``) with a parser from
``course.classroom.cli``: one program name, "did you mean" on a typo, a one-line error after
the usage and exit status 2 for a bad argument.
"""

import importlib
import os
import shutil
import sys
from pathlib import Path

# command: ("module:function" that takes the rest of the arguments, one line of help)
COMMANDS = {
    "doctor": ("course.__main__:_doctor", "check versions, device mode and a tiny Triton scan"),
    "grade": ("course.classroom.grade:main", "grade an exercise notebook or a class folder"),
    "bench": ("course.bench:cli", "time every backend at the benchmark shapes"),
    "slides": ("course.classroom.slides:main",
               "execute chapters into reveal.js decks (and PDFs, one for the course)"),
    "site": ("course.classroom.site:main", "execute every chapter into a static site"),
    "exercises": ("course.classroom.exercises:main",
                  "regenerate exercises/ from solutions/ (never over a student's work)"),
    "submit": ("course.classroom.submit:main",
               "check an exercise notebook and write the copy to hand in (submission/)"),
    "lab": ("course.__main__:_lab", "open JupyterLab on notebooks/ (localhost, token auth)"),
}


def _doctor(argv):
    from course import doctor
    from course.classroom import cli

    cli.parser("doctor", description=COMMANDS["doctor"][1] + ".").parse_args(argv)
    return 0 if doctor.main() else 1


def _lab(argv):
    """JupyterLab as ``make lab`` opens it: the course's Jupyter config (nbgrader's menus off:
    grading is ``grade``), localhost only, a token; options after ``--`` go to JupyterLab."""
    from course.classroom import cli

    p = cli.parser("lab", description=COMMANDS["lab"][1] + ".",
                   epilog="Arguments after -- go to jupyter lab itself, e.g. -- --port 8899.")
    p.add_argument("--root", default=".", type=Path, help="the folder JupyterLab serves "
                   "(default: this one; notebooks/ opens first when it is there)")
    p.add_argument("--dry-run", action="store_true", help="print the command, start nothing")
    argv = list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    jupyter = shutil.which("jupyter", path=os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if jupyter is None:
        print("error: no jupyter here: install the course's packages (make lab, or pip install "
              "'mambalearn[lab]')", file=sys.stderr)
        return 2
    config = Path(__file__).resolve().parent / "classroom" / "jupyter"
    cmd = [jupyter, "lab", "--ip=127.0.0.1", "--no-browser", f"--ServerApp.root_dir={args.root}"]
    if (args.root / "notebooks").is_dir():
        cmd.append("--LabApp.default_url=/lab/tree/notebooks")
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")
    cmd += extra
    env = dict(os.environ, JUPYTER_CONFIG_PATH=os.pathsep.join(
        filter(None, [str(config), os.environ.get("JUPYTER_CONFIG_PATH")])))
    if args.dry_run:
        print(f"JUPYTER_CONFIG_PATH={env['JUPYTER_CONFIG_PATH']} " + " ".join(cmd))
        return 0
    os.execve(jupyter, cmd, env)  # JupyterLab takes this process over (Ctrl-C stops it)


def version():
    """The installed mambalearn's version (the package metadata), or the source tree's."""
    from importlib import metadata

    try:
        return metadata.version("mambalearn")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv=None):
    from course.classroom import cli

    jobs = "\n".join(f"  {name:10s}  {text}" for name, (_, text) in COMMANDS.items())
    p = cli.parser(raw=True, description="mambalearn: the course's command line.",
                   epilog=f"commands:\n{jobs}\n\n`{cli.PROG} COMMAND --help` lists a command's "
                          "options.")
    p.add_argument("--version", action="version", version=f"mambalearn {version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=False,
                           help="one of the commands below")
    for name in COMMANDS:  # each command's own parser reads the rest
        sub.add_parser(name, add_help=False, prefix_chars="\0")
    args, rest = p.parse_known_args(argv)
    if args.command is None:  # the program alone: what it does
        p.print_help()
        return 0
    module, function = COMMANDS[args.command][0].split(":")
    run = (globals()[function] if module == "course.__main__"
           else getattr(importlib.import_module(module), function))
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
