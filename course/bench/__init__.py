"""`python -m mambalearn bench [TOPIC ...] [--json FILE]`: every backend timed at the bench shapes.

Each topic is a submodule with ``run(gpu: bool) -> list[dict]``; a row has at least
``topic, backend, shape, ms`` and may add ``ratio`` (to mamba_ssm, same run), ``floor_pct`` and
``peak_gb``. On a CPU the topics time tiny shapes through Triton's interpreter and say so.
With ``--json FILE`` the rows go to FILE and a bar chart of them to FILE with ``.png``.
Timers come from `mambalearn.timing` (a utility the chapters use too).
"""

import argparse
import ast
import importlib
import json
import pkgutil
import re
import textwrap
from pathlib import Path

import torch

from mambalearn.timing import peak_gb, time_ms  # noqa: F401  (the topics' timers)

TOPICS = [m.name for m in pkgutil.iter_modules(__path__) if not (m.ispkg or m.name.startswith("_"))]


def number(v):
    """A measured value as printed: 3 decimals from 0.01 up, 3 significant digits below (never
    ``0.000`` for a small nonzero value), no decimals from 10 000 up."""
    if not isinstance(v, float):
        return "-" if v is None else str(v)
    if v == 0 or 0.01 <= abs(v) < 1e4:
        return f"{v:.3f}"
    return f"{v:.0f}" if abs(v) >= 1e4 else f"{v:.3g}"


def show(row):
    """Print one row as it is measured: ``key=value | key=value`` (``None`` left out)."""
    print(" | ".join(f"{k}={number(v)}" for k, v in row.items() if v is not None), flush=True)


class Rows(list):
    """A list of result rows that prints each row as it arrives (``show``), so a run cut short
    by a time limit still shows what it measured."""

    def append(self, row):
        super().append(row)
        show(row)


COLUMNS = ["topic", "backend", "shape", "ms", "ratio", "floor_pct", "peak_gb"]


def table(rows, width=100):
    """The rows as fixed-width text, at most ``width`` columns (the last thing a bench run prints).

    One block per topic and shape, headed ``topic · shape``, then a line per backend: the
    usual columns (``COLUMNS``) a block has values for, then every other key whose values are
    short (a number or a word, e.g. ``passes`` of ``bench scans``), in the order first seen, as
    many as fit; the JSON file (``--json``) keeps every key.
    """
    groups = {}
    for r in rows:
        groups.setdefault((r.get("topic", "-"), r.get("shape", "-")), []).append(r)
    blocks = []
    for (topic, shape), group in groups.items():
        keys = [k for k in COLUMNS[3:] if any(r.get(k) is not None for r in group)]
        keys += list({k: None for r in group for k, v in r.items() if k not in COLUMNS + keys
                      and v is not None and (not isinstance(v, str) or len(v) <= 12)})
        cells = [[str(r.get("backend", "-"))] + [number(r.get(k)) for k in keys] for r in group]
        cols = ["backend"] + keys
        widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
        while len(cols) > 2 and sum(widths) + 2 * (len(cols) - 1) > width:
            cols, widths = cols[:-1], widths[:-1]  # the rightmost extra column goes first
        blocks.append("\n".join([f"{topic} · {shape}"[:width], _line(cols, widths)]
                                 + [_line(x[: len(cols)], widths) for x in cells]))
    return "\n\n".join(blocks)


def _line(cells, widths):
    """One line of a table: the name to the left, the numbers to the right of their columns."""
    return "  ".join(x.rjust(w) if i else x.ljust(w)
                     for i, (x, w) in enumerate(zip(cells, widths, strict=True)))


def plot(rows, path):
    """ms per backend as horizontal bars, one panel per topic and shape in a grid of up to three
    columns, saved to ``path``; returns ``path`` (None when no row has a time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {}
    for r in rows:
        if isinstance(r.get("ms"), float):
            groups.setdefault(f"{r['topic']} · {r['shape']}", []).append((r["backend"], r["ms"]))
    if not groups:
        return None
    ncols = min(3, len(groups))
    nrows = -(-len(groups) // ncols)
    tall = max(len(bars) for bars in groups.values())  # every panel as tall as the fullest one
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 0.8 + 0.28 * tall * nrows + 0.6),
                             squeeze=False)
    for ax, (title, bars) in zip(axes.flat, groups.items(), strict=False):  # spare panels stay
        names, ms = zip(*bars, strict=True)
        ax.barh(range(len(ms)), ms, color="tab:blue")
        ax.set_yticks(range(len(ms)), [textwrap.shorten(n, 34) for n in names], fontsize=8)
        for y, v in enumerate(ms):
            ax.text(v, y, f" {v:.3g}", va="center", fontsize=8)
        ax.set_ylim(tall - 0.5, -0.5)  # first backend on top; the same bar height in every panel
        if max(ms) > 30 * min(ms):  # a log axis, else the short bars vanish beside the long
            ax.set_xscale("log"), ax.set_xlim(min(ms) / 1.5, max(ms) * 3)
        else:
            ax.set_xlim(0, max(ms) * 1.25)
        ax.set_title(textwrap.fill(title, 48), fontsize=9)
        ax.set_xlabel("ms (shorter is faster)", fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(topics=None, out=None):
    gpu = torch.cuda.is_available()
    if not gpu:
        print("No GPU: timing Triton's CPU interpreter at tiny shapes (not kernel speed).")
    rows = []
    for name in topics or TOPICS:
        rows += importlib.import_module(f"{__name__}.{name}").run(gpu)
    if out:
        json.dump(rows, open(out, "w"), indent=1)
        print("plot:", plot(rows, out.rsplit(".", 1)[0] + ".png"))
    print(table(rows))
    return rows


def describe(topic):
    """The first line of a topic module's docstring, read without importing it."""
    path = Path(__file__).with_name(f"{topic}.py")
    doc = (ast.get_docstring(ast.parse(path.read_text())) or "").split("\n")[0]
    doc = re.sub(rf"^Bench topic [`\"]*{topic}[`\"]*:?\s*", "", doc).replace("``", "").strip()
    return re.sub(r"^\((chapters? [^)]*)\):\s*(.*?)\.?$", r"\2 (\1).", doc)


def _topic(name):
    from course.classroom.cli import suggest

    if name not in TOPICS:
        raise argparse.ArgumentTypeError(f"unknown topic {name!r}{suggest(name, TOPICS)} "
                                         f"(topics: {', '.join(TOPICS)})")
    return name


def parser():
    """The argument parser of ``python -m mambalearn bench``; its help lists the topics."""
    from course.classroom import cli

    topics = "\n".join(textwrap.fill(describe(t), cli.WIDTH - 2, initial_indent=f"  {t:15s} ",
                                      subsequent_indent=" " * 18) for t in TOPICS)
    about = ("Time every backend at the benchmark shapes (docs/BENCHMARKS.md has the results on "
             "an H200); on a CPU, tiny shapes through Triton's interpreter.")
    p = cli.parser("bench", raw=True, description=textwrap.fill(about, cli.WIDTH - 2),
                   epilog=f"topics:\n{topics}")
    p.add_argument("topics", nargs="*", metavar="TOPIC", type=_topic,
                   help=f"what to time (default: all of {', '.join(TOPICS)})")
    p.add_argument("--json", metavar="FILE", help="also write the rows to FILE and a chart "
                   "of them to FILE with .png")
    p.add_argument("--replot", nargs=2, metavar=("ROWS", "PNG"), help="time nothing: draw the "
                   "chart of a rows file (a --json file, or a results file's rows) to PNG")
    return p


def cli(argv=None):
    """``python -m mambalearn bench``: parse the arguments, run the topics; the exit status."""
    p = parser()
    args = p.parse_args(argv)
    if args.replot:
        if args.topics or args.json:
            p.error("--replot draws a stored run: give no TOPIC and no --json with it")
        data = json.loads(Path(args.replot[0]).read_text())
        rows = data["rows"] if isinstance(data, dict) else data
        # (a results file names a row's kind `op`; a bench rows file, `topic`)
        rows = [r if "topic" in r else dict(r, topic=r.get("op", "")) for r in rows if "ms" in r]
        print(plot(rows, args.replot[1]))
        return 0
    main(args.topics or None, args.json)
    return 0
