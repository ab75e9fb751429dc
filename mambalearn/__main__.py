"""Command line: ``python -m mambalearn COMMAND`` (the ``mambalearn`` script is the same program).

Each command parses its own options (``python -m mambalearn COMMAND --help``) with a parser from
``mambalearn.classroom.cli``: one program name, "did you mean" on a typo, a one-line error after
the usage and exit status 2 for a bad argument.
"""

import importlib
import sys

# command: ("module:function" that takes the rest of the arguments, one line of help)
COMMANDS = {
    "doctor": ("mambalearn.__main__:_doctor", "check versions, device mode and a tiny Triton scan"),
    "grade": ("mambalearn.classroom.grade:main", "grade an exercise notebook or a class folder"),
    "bench": ("mambalearn.bench:cli", "time every backend at the benchmark shapes"),
    "slides": ("mambalearn.classroom.slides:main",
               "execute chapters into reveal.js decks (and PDFs, one for the course)"),
    "site": ("mambalearn.classroom.site:main", "execute every chapter into a static site"),
    "exercises": ("mambalearn.classroom.exercises:main",
                  "regenerate exercises/ from solutions/ (never over a student's work)"),
}


def _doctor(argv):
    from mambalearn import doctor
    from mambalearn.classroom import cli

    cli.parser("doctor", description=COMMANDS["doctor"][1] + ".").parse_args(argv)
    return 0 if doctor.main() else 1


def main(argv=None):
    from mambalearn.classroom import cli

    jobs = "\n".join(f"  {name:10s}  {text}" for name, (_, text) in COMMANDS.items())
    p = cli.parser(raw=True, description="mambalearn: the course's command line.",
                   epilog=f"commands:\n{jobs}\n\n`{cli.PROG} COMMAND --help` lists a command's "
                          "options.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True,
                           help="one of the commands below")
    for name in COMMANDS:  # each command's own parser reads the rest
        sub.add_parser(name, add_help=False, prefix_chars="\0")
    args, rest = p.parse_known_args(argv)
    module, function = COMMANDS[args.command][0].split(":")
    run = (globals()[function] if module == "mambalearn.__main__"
           else getattr(importlib.import_module(module), function))
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
