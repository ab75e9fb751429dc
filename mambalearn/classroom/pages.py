"""What every rendered copy of a chapter (a deck, a site page) is made from: one file, nothing
linked, and the recorded GPU output where this machine had no GPU.

``prepare(nb, notebook)`` returns a copy of an executed chapter in which

1. **markdown images are attachments**: ``![alt](../docs/figures/x.png)`` becomes
   ``![alt](attachment:x.png)`` with the file's bytes in the cell, so the page or deck carries the
   picture wherever it is copied (nbconvert itself embeds only files below the notebook's folder).
   An image that is not there is an error, never a broken picture;
2. **a GPU cell shows its recorded output**: a cell that printed ``skipped: no GPU`` here shows
   what it printed on the GPU, from ``docs/results/<device>_outputs-<chapter>_<date>.json``
   (written on the GPU by ``python3 -m bench.gpu.notebook_outputs``), with a line saying where
   and when that output was recorded. Only a recording of the same cell source counts (its sha256
   is stored), so an edited cell never shows an old answer. Cells with no recording are listed in
   ``unrecorded(nb)`` (a deck leaves them out; a page shows them as they are).
"""

import base64
import copy
import hashlib
import json
import mimetypes
import re
from pathlib import Path

import nbformat
from nbformat.v4 import new_output

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
SKIPPED = "skipped: no GPU"
IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<src>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")


def prepare(nb, notebook, results=RESULTS):
    """A copy of ``nb``, the executed copy of the chapter file ``notebook``, with its images
    embedded and the recorded GPU outputs in place (see the module's docstring)."""
    nb, notebook = copy.deepcopy(nb), Path(notebook)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            embed_images(cell, notebook.parent)
    recorded = recordings(notebook.stem, results)
    for cell in nb.cells:
        if is_skipped(cell):
            show_recorded(cell, recorded)
    return nb


def embed_images(cell, folder):
    """Turn the cell's local markdown images into attachments (in place)."""
    def attach(m):
        src = m.group("src")
        if re.match(r"^(?:[a-z]+:|//)", src):  # http:, data:, attachment: stay as they are
            return m.group(0)
        path = (folder / src).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"markdown image {src!r} not found (looked for {path})")
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        attachments = cell.setdefault("attachments", {})
        attachments[path.name] = {mime: base64.b64encode(path.read_bytes()).decode("ascii")}
        return f"![{m.group('alt')}](attachment:{path.name}{m.group('title') or ''})"

    cell.source = IMAGE.sub(attach, cell.source)


def is_skipped(cell):
    """True for a code cell whose only output is the line ``skipped: no GPU``."""
    outs = cell.get("outputs", [])
    return (cell.cell_type == "code" and len(outs) == 1 and outs[0].get("output_type") == "stream"
            and "".join(outs[0].get("text", "")).strip() == SKIPPED)


def source_sha(cell):
    """sha256 of a cell's source: a recording is shown only for the source it was made from."""
    return hashlib.sha256(cell.source.encode()).hexdigest()


def recordings(stem, results=RESULTS):
    """``{source sha256: (outputs, meta)}`` of the newest recording of chapter ``stem``."""
    files = sorted(Path(results).glob(f"*_outputs-{stem}_*.json"), key=lambda p: p.stem[-10:])
    if not files:
        return {}
    data = json.loads(files[-1].read_text())
    meta = dict(data["meta"], file=str(files[-1].relative_to(REPO)
                                      if files[-1].is_relative_to(REPO) else files[-1]))
    return {row["source_sha256"]: (row["outputs"], meta) for row in data["rows"]}


def show_recorded(cell, recorded):
    """Replace a skipped cell's output by its recording, if there is one for its source."""
    found = recorded.get(source_sha(cell))
    if found is None:
        return False
    outputs, meta = found
    where = (f"recorded on {meta['device']}, {meta['date']} (commit {meta['commit']}; "
             f"{meta['file']})")
    cell.outputs = [new_output("stream", name="stdout", text=f"[{where}]\n")]
    cell.outputs += [nbformat.from_dict(o) for o in outputs]
    cell.metadata["mambalearn_recorded"] = where
    return True


def unrecorded(nb):
    """The code cells of ``nb`` still showing ``skipped: no GPU``."""
    return [c for c in nb.cells if is_skipped(c)]
