"""`python -m mambalearn bench`: time every backend at the shapes of DESIGN.md §6.

Each topic is a submodule with ``run(gpu: bool) -> list[dict]``; a row has at least
``topic, backend, shape, ms`` and may add ``ratio`` (to mamba_ssm, same run), ``floor_pct`` and
``peak_gb``. On a CPU the topics time tiny shapes through Triton's interpreter and say so.
With ``--json FILE`` the rows go to FILE and a bar chart of them to FILE with ``.png``.
Timers come from `mambalearn.timing` (a utility the chapters use too).
"""

import importlib
import json
import pkgutil

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


def table(rows):
    """A fixed-width text table of the rows (the last thing a bench run prints)."""
    cols = ["topic", "backend", "shape", "ms", "ratio", "floor_pct", "peak_gb"]
    fmt = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.ljust(w) for x, w in zip(xs, widths))
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
    for ax, (title, bars) in zip(axes[:, 0], groups.items()):
        names, ms = zip(*bars)
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
