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
   ``unrecorded(nb)`` (a deck leaves them out; a page shows them as they are);
3. **the title is the chapter's**: the first Markdown heading becomes ``metadata.title`` (the
   page's and the deck's ``<title>``, and so the PDF's), not the file name.

``static_widgets(nb)`` (the site's pages) replaces each saved widget by what it last showed: the
figures and text of its output areas, a progress bar as its line of text, and for controls one
line naming them and saying they move in JupyterLab; every other output of the cell stays.
"""

import base64
import copy
import hashlib
import html
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
    if "title" not in nb.metadata:
        nb.metadata["title"] = title(nb, notebook.stem)
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
    where = (f"recorded on {meta['device']}, {meta['date']} (commit {meta['commit']};\n"
             f" {meta['file']})")  # the file on a line of its own: a deck never breaks its name
    cell.outputs = [new_output("stream", name="stdout", text=f"[{where}]\n")]
    cell.outputs += [nbformat.from_dict(o) for o in outputs]
    cell.metadata["mambalearn_recorded"] = where
    return True


def unrecorded(nb):
    """The code cells of ``nb`` still showing ``skipped: no GPU``."""
    return [c for c in nb.cells if is_skipped(c)]


def title(nb, default):
    """The first Markdown heading of the notebook (without #), else ``default``."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return re.sub(r"[*`]", "", line.lstrip("#")).strip()
    return default


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PROGRESS = ("FloatProgressModel", "IntProgressModel")


def _widget_outputs(model_id, state, seen=None):
    """(outputs, control names, progress text) of the saved widget ``model_id`` and its children."""
    seen = set() if seen is None else seen
    outputs, controls, text = [], [], []
    model = state.get(model_id)
    if model is None or model_id in seen:
        return outputs, controls, text
    seen.add(model_id)
    kind, st = model.get("model_name", ""), model.get("state", {})
    if kind == "OutputModel":
        outputs += [nbformat.from_dict(o) for o in st.get("outputs", [])]
    elif kind in PROGRESS:
        text.append(("bar", f"{st.get('description') or ''} {st.get('value', 0):g}/"
                             f"{st.get('max', 0):g}".strip()))
    elif kind in ("HTMLModel", "LabelModel"):
        words = re.sub(r"<[^>]+>", "", str(st.get("value", ""))).strip()
        if words:
            text.append(("text", html.unescape(words)))
    elif "description" in st and kind not in ("ButtonModel",) and not kind.startswith("Box"):
        if st.get("description"):
            controls.append(st["description"])
    for child in st.get("children", []):
        o, c, t = _widget_outputs(str(child).removeprefix("IPY_MODEL_"), state, seen)
        outputs, controls, text = outputs + o, controls + c, text + t
    return outputs, controls, text


def static_widgets(nb):
    """``nb`` with each widget output replaced by a static render of its saved state (in place;
    returns ``nb``): what its output areas showed, a progress bar's text, and for controls the line
    "Interactive in JupyterLab: …"."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        outs = []
        for o in cell.get("outputs", []):
            view = o.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                outs.append(o)
                continue
            shown, controls, text = _widget_outputs(view.get("model_id", ""), state)
            words = [t for kind, t in text if kind == "text"] or [t for _, t in text]
            if words and not shown:  # a progress bar: its labels (else its count) as a line
                outs.append(new_output("stream", name="stdout", text=" ".join(words) + "\n"))
            outs += shown
            if controls:
                names = ", ".join(dict.fromkeys(controls))
                outs.append(new_output("display_data", data={"text/html": (
                    '<p class="ml-widget">Interactive in JupyterLab: open this chapter with '
                    f"<code>make lab</code> and change {html.escape(names)}; shown here as it "
                    "was last drawn.</p>")}))
        cell.outputs = outs
    nb.metadata.pop("widgets", None)
    return nb
