"""Command line: ``python -m mambalearn {doctor,grade,bench}`` (also ``mambalearn ...``).

Each command parses its own options (``python -m mambalearn COMMAND --help``): ``grade`` with
``mambalearn.classroom.grade``'s parser, ``bench`` with ``mambalearn.bench.cli``'s. A bad
argument gets a one-line error after the usage and exit status 2.
"""

import argparse
import sys

COMMANDS = {
    "doctor": "check versions, device mode and a tiny Triton scan",
    "grade": "grade an exercise notebook or a class folder",
    "bench": "time every backend at the benchmark shapes",
}


def _doctor(argv):
    argparse.ArgumentParser(prog="python -m mambalearn doctor",
                            description=COMMANDS["doctor"] + ".").parse_args(argv)
    from mambalearn import doctor

    return 0 if doctor.main() else 1


def _grade(argv):
    from mambalearn.classroom import grade

    return grade.main(argv)


def _bench(argv):
    from mambalearn import bench

    return bench.cli(argv)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m mambalearn", description="mambalearn: the course's command line.",
        epilog="`python -m mambalearn COMMAND --help` lists a command's options.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, text in COMMANDS.items():  # each command's own parser reads the rest
        sub.add_parser(name, help=text, add_help=False, prefix_chars="\0")
    args, rest = p.parse_known_args(argv)
    return {"doctor": _doctor, "grade": _grade, "bench": _bench}[args.command](rest)


if __name__ == "__main__":
    sys.exit(main())
