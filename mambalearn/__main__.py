"""Command line: ``python -m mambalearn {doctor,grade,bench}`` (also ``mambalearn ...``)."""

import sys

USAGE = """usage: python -m mambalearn COMMAND [args]

commands:
  doctor                     check versions, device mode and a tiny Triton scan
  grade NOTEBOOK [options]   grade an exercise notebook (--help for options)
  bench [TOPIC ...] [--json FILE]
                             time every backend at the benchmark shapes
"""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "doctor":
        from mambalearn import doctor

        return 0 if doctor.main() else 1
    if cmd == "grade":
        from mambalearn.classroom import grade

        return grade.main(rest)
    if cmd == "bench":
        from mambalearn import bench

        out = None
        if "--json" in rest:
            i = rest.index("--json")
            out, rest = rest[i + 1], rest[:i] + rest[i + 2:]
        bench.main(rest or None, out)
        return 0
    print(f"unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
