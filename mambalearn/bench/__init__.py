"""`python -m mambalearn bench [TOPIC ...] [--json FILE]`: time every backend at the course shapes.

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
from pathlib import Path

import torch

from mambalearn.timing import peak_gb, time_ms  # noqa: F401  (the topics' timers)

TOPICS = [m.name for m in pkgutil.iter_modules(__path__) if not (m.ispkg or m.name.startswith("_"))]


class Rows(list):
    """A list of result rows that prints each row as it arrives, so a run cut short by a time
    limit still shows what it measured."""

    def append(self, row):
        super().append(row)
        print(" | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in row.items() if v is not None), flush=True)


COLUMNS = ["topic", "backend", "shape", "ms", "ratio", "floor_pct", "peak_gb"]


def table(rows):
    """A fixed-width text table of the rows (the last thing a bench run prints).

    The usual columns (``COLUMNS``) first, then every other key a row has and whose values are
    short (a number or a word: e.g. ``passes`` of ``bench scans``), in the order first seen.
    """
    extra = {k: None for r in rows for k, v in r.items() if k not in COLUMNS
             and v is not None and (not isinstance(v, str) or len(v) <= 12)}
    cols = COLUMNS + list(extra)
    fmt = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.ljust(w) for x, w in zip(xs, widths, strict=True))
    return "\n".join([line(cols)] + [line(x) for x in cells])


def plot(rows, path):
    """One horizontal bar chart per topic and shape: ms per backend, saved to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {}
    for r in rows:
        if isinstance(r.get("ms"), float):
            groups.setdefault(f"{r['topic']} · {r['shape']}", []).append((r["backend"], r["ms"]))
    if not groups:
        return None
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 0.35 * len(rows) + 1.2 * len(groups)),
                             squeeze=False)
    for ax, (title, bars) in zip(axes[:, 0], groups.items(), strict=True):
        names, ms = zip(*bars, strict=True)
        ax.barh(names, ms, color="tab:blue")
        for y, v in enumerate(ms):
            ax.text(v, y, f" {v:.3g}", va="center", fontsize=7)
        ax.set_xlim(0, max(ms) * 1.2), ax.set_title(title, fontsize=9), ax.invert_yaxis()
        ax.tick_params(labelsize=8)
    axes[-1, 0].set_xlabel("ms (shorter is faster)")
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
    return re.sub(rf"^Bench topic [`\"]*{topic}[`\"]*:?\s*", "", doc).replace("``", "").strip()


def _topic(name):
    if name not in TOPICS:
        raise argparse.ArgumentTypeError(f"unknown topic {name!r} (topics: {', '.join(TOPICS)})")
    return name


def parser():
    """The argument parser of ``python -m mambalearn bench``; its help lists the topics."""
    topics = "\n".join(f"  {t:15s} {describe(t)}" for t in TOPICS)
    p = argparse.ArgumentParser(
        prog="python -m mambalearn bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time every backend at the benchmark shapes; on a CPU, tiny "
                    "shapes through Triton's interpreter.", epilog=f"topics:\n{topics}")
    p.add_argument("topics", nargs="*", metavar="TOPIC", type=_topic,
                   help=f"what to time (default: all of {', '.join(TOPICS)})")
    p.add_argument("--json", metavar="FILE", help="also write the rows to FILE and a bar chart "
                   "of them to FILE with .png")
    return p


def cli(argv=None):
    """``python -m mambalearn bench``: parse the arguments, run the topics; the exit status."""
    args = parser().parse_args(argv)
    main(args.topics or None, args.json)
    return 0
