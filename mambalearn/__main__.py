"""Command line: ``python -m mambalearn COMMAND`` (the ``mambalearn`` script is the same program).

The commands (grading, slides, the site, benchmarks, doctor, lab) are the course's tooling, which
lives beside this package in ``course`` (``course/__main__.py``): this face only hands the
arguments on, importing it when the command line runs.
"""

import sys


def main(argv=None):
    from course.__main__ import main as run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
